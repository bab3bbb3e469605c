#!/usr/bin/env bash
# The single-GPU ladder on the device machine (no network): installs the carried wheels, draws the 224-px
# photos, runs the named ladder steps (default: all) in bench mode, and prints the table.
#   bash benchmarks/gpu_ladder.sh [NAME ...]        (carry .whl; results and logs under $OUT)
set -euo pipefail
OUT=${OUT:-runs/bench}
mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import datasets" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
free -g | head -2
[ -f data/synthetic_food-224/dataset_dict.json ] || python3 -m data.synthetic --out data/synthetic_food-224 --size 224 --num-train 512 --num-test 64
python3 benchmarks/ladder.py --bench --results-file "$OUT/ladder.jsonl" --log-dir /tmp/ladder-logs "$@" > "$OUT/ladder.log" 2>&1 || true
tail -n 25 "$OUT/ladder.log"
