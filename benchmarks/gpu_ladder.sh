#!/usr/bin/env bash
# The single-GPU ladder on the device machine (no network): installs the carried wheels, draws the 224-px
# photos, runs the named ladder steps (default: all) in bench mode, and prints the table.
#   bash benchmarks/gpu_ladder.sh [NAME ...]        (carry .whl; results and logs under $OUT)
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
free -g | head -2
[ -f data/synthetic_food-224/dataset_dict.json ] || python3 -m data.synthetic --out data/synthetic_food-224 --size 224 --num-train 512 --num-test 64
python3 benchmarks/ladder.py --bench --results-file "$OUT/ladder.jsonl" --log-dir /tmp/ladder-logs "$@" > "$OUT/ladder.log" 2>&1 || true
tail -n 25 "$OUT/ladder.log"
