#!/usr/bin/env bash
# The single-GPU ladder on the device machine (no network): installs the carried wheels, draws the 224-px
# photos, runs the named ladder steps (default: all) in bench mode, and prints the table.
#   bash benchmarks/gpu_ladder.sh [NAME ...]        (carry .whl; results and logs under $OUT)
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
free -g | head -2
data_224
python3 benchmarks/ladder.py --bench --results-file "$OUT/ladder.jsonl" --log-dir /tmp/ladder-logs "$@" > "$OUT/ladder.log" 2>&1 || true
tail -n 25 "$OUT/ladder.log"
