#!/usr/bin/env bash
# Issue 5's GPU measurement, the way a user gets there: a blip2-opt-2.7b base folder (random init, saved once),
# a LoRA adapter trained on it for 2 steps, then batched bf16 generation of alt text for 64 photos (images/s).
# Also checks ZeRO-3 offload on opt-2.7b for 3 steps. On the device machine: bash benchmarks/gpu_generate.sh
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
data_224
python3 - <<'PY'
import torch
from models.build import build_model
model, processor, _ = build_model("blip2-opt-2.7b", dtype=torch.bfloat16)
model.save_pretrained("/tmp/opt27-base"); processor.save_pretrained("/tmp/opt27-base")
PY
python3 recipes/train.py recipes/blip2/opt27-bf16.yaml --model_name_or_path /tmp/opt27-base --use_peft true \
  --max_steps 2 --output_dir /tmp/opt27-lora --results_file "$OUT/lora.jsonl" 2>&1 | grep -E "trainable_params|train [0-9]" || true
# Random weights end a caption at once; 12 new tokens is the length of a typical alt text here.
for bs in 16 64; do
  python3 benchmarks/generate_speed.py --model_name_or_path /tmp/opt27-base --adapter /tmp/opt27-lora \
    --dataset_path data/synthetic_food-224 --batch_size $bs --min_new_tokens 12 --max_new_tokens 12 | tee -a "$OUT/generate.jsonl"
done
[ -n "${SKIP_ZERO3:-}" ] || timeout 300 python3 recipes/train.py recipes/blip2/opt27-bf16.yaml --deepspeed ds_configs/zero3_offload.json \
  --max_steps 3 --save_model false --output_dir /tmp/z3 --results_file "$OUT/zero3.jsonl" --memory_log_steps 1 2>&1 \
  | grep -E "step     1 \| after|optimizer_class|strategy|master_weights|train [0-9]|rror" | cut -c1-220 || true
