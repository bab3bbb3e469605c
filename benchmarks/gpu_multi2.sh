#!/usr/bin/env bash
# Issue 8 on a machine with 2 GPUs (nvidia-h200-x2), when no 4-GPU machine is lent, in one command (< 10 minutes):
#   opt27-bf16-1gpu (single.yaml), opt27-bf16-ddp4 and opt27-bf16-fsdp4 with --num_processes 2, one FSDP run per
#   entry of FSDP_VARIANTS, optionally a profiled FSDP run and blip2-flan-t5-xxl under FSDP and ZeRO-3 offload,
#   then the scaling table.
#   bash benchmarks/gpu_multi2.sh        (on the device machine; carry .whl; output under $OUT)
# Settings (environment):
#   FSDP_VARIANTS  NAME:LAYERS_PER_UNIT:FORWARD_PREFETCH[:accelerate launch flags, commas for spaces] ...
#                  (default "units1:1:true"); e.g. "old:1:false units4:4:true grad-op:4:true:--fsdp_reshard_after_forward,false"
#   PROFILE        LAYERS_PER_UNIT of an extra FSDP run with profile_steps 2 (its table goes to the logs); unset: none
#   XXL            "fsdp zero3": the flan-t5-xxl runs to make (3 steps each: memory, and a rate past step 1)
#   DDP            0: no DDP run (default 1)
#   NCCL           1: first measure NCCL's bandwidth (benchmarks/nccl_bandwidth.py)
#   OPTIM          1: first time an optimizer step over DTensors (benchmarks/dtensor_optimizer.py)
#   WARMUP         1: first a 2-step one-GPU run, not recorded: a fresh machine's first run loads CUDA's kernels
#                  from disk and would make the one-GPU baseline slow
# Output: $OUT/results.jsonl (every rank's record), $OUT/table.txt, $OUT/logs.tgz (each run's log, profiles).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
DEADLINE=${DEADLINE:-575}  # seconds after this script starts; the device machine stops a command at 600
keep_logs
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nvidia-smi topo -m; free -g | head -2
  python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
  echo "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-unset}"; } > "$LOGS/machine.txt" 2>&1
data_224 > "$LOGS/data.log" 2>&1
if [[ " ${XXL:-} " == *" zero3 "* ]]; then  # DeepSpeed compiles its CPU Adam on first use: now, beside the GPU runs
  python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$LOGS/cpu_adam.log" 2>&1 &
fi
if [ "${NCCL:-0}" = 1 ]; then
  timeout 60 torchrun --nproc_per_node 2 benchmarks/nccl_bandwidth.py --out "$LOGS/nccl.jsonl" > "$LOGS/nccl.log" 2>&1
fi
if [ "${OPTIM:-0}" = 1 ]; then
  timeout 90 torchrun --nproc_per_node 2 benchmarks/dtensor_optimizer.py --out "$LOGS/optim.jsonl" > "$LOGS/optim.log" 2>&1
  tail -25 "$LOGS/optim.log"
fi

run() { run_recipe "$@" --save_model false; }  # run_recipe (device_env.sh); these runs measure, none saves

[ "${WARMUP:-0}" = 1 ] && run warmup single.yaml opt27-bf16-1gpu 60 -- --max_steps 2 --results_file /tmp/warmup.jsonl
run 1gpu single.yaml opt27-bf16-1gpu 100 --
[ "${DDP:-1}" = 1 ] && run ddp2 ddp4.yaml opt27-bf16-ddp4 80 --num_processes 2 --
for variant in ${FSDP_VARIANTS:-units1:1:true}; do
  IFS=: read -r name layers prefetch flags <<< "$variant"
  run "fsdp2-$name" fsdp4.yaml opt27-bf16-fsdp4 90 --num_processes 2 ${flags//,/ } -- \
    --fsdp_layers_per_unit "$layers" --fsdp_forward_prefetch "$prefetch"
done
if [ -n "${PROFILE:-}" ]; then
  run fsdp2-profile fsdp4.yaml opt27-bf16-fsdp4 90 --num_processes 2 -- --fsdp_layers_per_unit "$PROFILE" \
    --profile_steps 2 --results_file /tmp/profile.jsonl
  cp /tmp/fsdp2-profile/profile/profile.txt "$LOGS/fsdp2-profile.txt" 2>/dev/null
fi
[[ " ${XXL:-} " == *" fsdp "* ]] && run xxl-fsdp2 fsdp4.yaml xxl-bf16-fsdp4 120 --num_processes 2 -- --max_steps 3
if [[ " ${XXL:-} " == *" zero3 "* ]]; then
  wait; echo "cpu_adam build done at ${SECONDS}s"
  (while sleep 10; do echo "$SECONDS s: $(free -g | sed -n 2p)"; done) > "$LOGS/host_memory.log" &  # pinned host memory
  # DeepSpeedCPUAdam steps with OpenMP threads: 16 a rank of the machine's 32 cores.
  OMP_NUM_THREADS=16 run xxl-zero3 zero3_offload4.yaml xxl-bf16-zero3-offload4 400 --num_processes 2 -- --max_steps 3
  kill %% 2>/dev/null
fi
python3 benchmarks/results_table.py "$OUT/results.jsonl" --scaling | tee "$OUT/table.txt"
