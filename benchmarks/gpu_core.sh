#!/usr/bin/env bash
# The core acceptance run on one GPU: blip2-opt-2.7b (random init, published architecture), bf16-true,
# per-device batch 16 x accumulation 4, 512 synthetic 224-px photos x 2 epochs, with the memory breakdown.
# On the device machine (no network):  bash benchmarks/gpu_core.sh   (carry .whl; see ../shared/device)
# Writes logs and the results file under $OUT (default runs/bench).
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)" | tee -a "$OUT/gpu.txt"
data_224
accelerate launch --config_file accelerate_configs/single.yaml recipes/train.py recipes/blip2/opt27-bf16.yaml \
  --output_dir /tmp/opt27-bf16 --results_file "$OUT/results.jsonl" "$@" 2>&1 | tee "$OUT/opt27-bf16.log"
python3 benchmarks/results_table.py "$OUT/results.jsonl"
