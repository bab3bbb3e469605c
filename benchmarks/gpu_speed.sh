#!/usr/bin/env bash
# Issue 7's speed runs on one GPU (device machine, no network; carry .whl):
#   bash benchmarks/gpu_speed.sh PART ...
# PARTs, run in the order given, each appending to $OUT/speed.jsonl (recipe runs) or $OUT/bare.jsonl:
#   bare-bf16 | bare-mixed | bare-fp32      benchmarks/bare_loop.py, the ceiling without Trainer or data loading
#   bf16 | mixed | fp32 | fp32-tf32          the recipe: opt27-bf16 (16x4), opt27-bf16-mixed (16x4),
#                                            opt27-fp32-b16 (16x1), the last with TF32 matmuls allowed
#   bf16-before                              opt27-bf16 with the Trainer's old per-micro-batch syncs back on
#   bf16-launch                              opt27-bf16 through `accelerate launch --config_file accelerate_configs/single.yaml`
#   bare-bf16-flash                          the bare loop with SDPA kept off cuDNN attention (flash instead)
#   bf16-profile                             opt27-bf16 with torch.profiler over steps 3-5 ($OUT/profile.txt)
#   bf16-workers8                            opt27-bf16 with 8 DataLoader workers prefetching 4 batches each
#   bf16-compile                             opt27-bf16 with torch_compile and accelerate's regional compilation
#   bf16-graphs | mixed-graphs | fp32-tf32-graphs   bf16 | mixed | fp32-tf32 with cuda_graphs: true
#   tiny-graphs                              the tiny demo recipe with cuda_graphs (seconds: does the capture work here?)
#   bf16-graphs-profile                      bf16-graphs with torch.profiler over steps 3-5 ($OUT/profile-graphs.txt)
#   imports | collate                        import time of recipes/train.py ($OUT/imports.txt); batch preprocessing time
# Every recipe run trains 512 photos x 2 epochs, logs every 4 optimizer steps and saves nothing. One GPU needs no
# launcher: plain python3 runs the same script as `accelerate launch --config_file accelerate_configs/single.yaml`
# without the launcher's own start-up.
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/gpu.txt"
data_224

recipe() {  # NAME RECIPE [overrides...]; LAUNCH="accelerate launch ..." to go through a launcher
  local name=$1 recipe=$2; shift 2
  echo "=== $name: $(date +%s.%N) launch" | tee -a "$OUT/speed.log"
  ${LAUNCH:-python3} recipes/train.py "recipes/blip2/$recipe.yaml" \
    --output_dir "/tmp/speed-$name" --overwrite_output_dir true --save_model false --logging_steps 4 \
    --results_file "$OUT/speed.jsonl" "$@" >> "$OUT/speed.log" 2>&1 || echo "$name failed" | tee -a "$OUT/speed.log"
  echo "=== $name: $(date +%s.%N) exit" | tee -a "$OUT/speed.log"
  tail -n 2 "$OUT/speed.log" | head -n 1
}

for part in "$@"; do
  case $part in
    bare-bf16)  python3 benchmarks/bare_loop.py --precision bf16-true --out "$OUT/bare.jsonl" ;;
    bare-mixed) python3 benchmarks/bare_loop.py --precision bf16-mixed --out "$OUT/bare.jsonl" ;;
    bare-fp32)  python3 benchmarks/bare_loop.py --precision 32-true --accumulation 1 --tf32 --out "$OUT/bare.jsonl" ;;
    bare-bf16-flash) python3 benchmarks/bare_loop.py --precision bf16-true --no_cudnn_attention --out "$OUT/bare.jsonl" ;;
    bf16)       recipe bf16 opt27-bf16 ;;
    bf16-before) recipe bf16-before opt27-bf16 --logging_nan_inf_filter true --accelerator_config '{"non_blocking": false}' ;;
    mixed)      recipe mixed opt27-bf16-mixed ;;
    fp32)       recipe fp32 opt27-fp32-b16 ;;
    fp32-tf32)  recipe fp32-tf32 opt27-fp32-b16 --tf32 true ;;
    bf16-launch) LAUNCH="accelerate launch --config_file accelerate_configs/single.yaml" recipe bf16-launch opt27-bf16 ;;
    bf16-profile) recipe bf16-profile opt27-bf16 --profile_steps 3; cp /tmp/speed-bf16-profile/profile/profile.txt "$OUT/" ;;
    bf16-workers8) recipe bf16-workers8 opt27-bf16 --dataloader_num_workers 8 --dataloader_prefetch_factor 4 ;;
    tiny-graphs) recipe tiny-graphs tiny-opt-demo --cuda_graphs true --num_sample_captions 0 --max_steps 40 --eval_strategy no --dataset_path data/synthetic_food-224 ;;
    bf16-graphs) recipe bf16-graphs opt27-bf16 --cuda_graphs true ;;
    mixed-graphs) recipe mixed-graphs opt27-bf16-mixed --cuda_graphs true ;;
    fp32-tf32-graphs) recipe fp32-tf32-graphs opt27-fp32-b16 --tf32 true --cuda_graphs true ;;
    bf16-graphs-profile) recipe bf16-graphs-profile opt27-bf16 --cuda_graphs true --profile_steps 3
                cp /tmp/speed-bf16-graphs-profile/profile/profile.txt "$OUT/profile-graphs.txt" ;;
    bf16-compile) ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=1 recipe bf16-compile opt27-bf16 --torch_compile true ;;
    imports)    python3 -X importtime recipes/train.py --help > /dev/null 2> "$OUT/imports.txt"
                (sort -t'|' -k2 -n -r "$OUT/imports.txt" | head -n 25) || true ;;
    collate)    python3 benchmarks/collate_speed.py | tee -a "$OUT/speed.log" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
python3 benchmarks/results_table.py "$OUT/speed.jsonl" || true
