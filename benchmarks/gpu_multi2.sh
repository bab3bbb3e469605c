#!/usr/bin/env bash
# Issue 8 on a machine with 2 GPUs (nvidia-h200-x2), when no 4-GPU machine is lent, in one command (~3 minutes):
#   nccl_bandwidth.py on both GPUs (all_reduce / all_gather / reduce_scatter bandwidth, P2P, topology), then
#   opt27-bf16-1gpu (single.yaml), opt27-bf16-ddp4 and opt27-bf16-fsdp4 with --num_processes 2, and the scaling table.
#   bash benchmarks/gpu_multi2.sh        (on the device machine; carry .whl; output under $OUT)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
data_224 > /dev/null 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
timeout 60 torchrun --nproc_per_node 2 benchmarks/nccl_bandwidth.py --out "$OUT/nccl.jsonl" > "$OUT/nccl.log" 2>&1
tail -14 "$OUT/nccl.log"
run() {  # NAME CONFIG RECIPE [launcher flags...]; LIMIT seconds (default 80)
  local name=$1 config=$2 recipe=$3; shift 3
  timeout -k 10 "${LIMIT:-80}" accelerate launch --config_file "accelerate_configs/$config" "$@" recipes/train.py \
    "recipes/blip2/$recipe.yaml" --results_file "$OUT/results.jsonl" --output_dir "/tmp/$name" \
    --overwrite_output_dir true --save_model false > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
  grep -h "^train " "$OUT/$name.log"
}
run 1gpu single.yaml opt27-bf16-1gpu
run ddp2 ddp4.yaml opt27-bf16-ddp4 --num_processes 2
LIMIT=90 run fsdp2 fsdp4.yaml opt27-bf16-fsdp4 --num_processes 2
python3 benchmarks/results_table.py "$OUT/results.jsonl" --scaling
