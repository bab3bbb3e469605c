#!/usr/bin/env bash
# The compatibility matrix's GPU cells (docs/compatibility.md), on the device machine (carry .whl):
#   bash benchmarks/gpu_compatibility.sh single [PREVIOUS.jsonl]   1 GPU, ~4 min: single, ZeRO-2/3 offload x1 process
#   bash benchmarks/gpu_compatibility.sh multi  [PREVIOUS.jsonl]   2 GPUs, ~3 min: DDP, FSDP, ZeRO-2/3 offload x2
# A part's launches run side by side (the tiny model leaves the GPU idle most of the time), each one process or one
# accelerate launch looping over its cells, the ZeRO ones split in two shards because a DeepSpeed cell takes
# longest. Lines go to $OUT/<date>-<gpu>-compatibility-<part>.jsonl as each cell ends: copy it to
# benchmarks/results/ and run `python benchmarks/compatibility_doc.py`. Cells a time limit cut off read "not run
# yet"; give the file back as PREVIOUS.jsonl and a second run does only those.
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
part=${1:?say single (1 GPU) or multi (2 GPUs)}
previous=${2:-}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')  # NVIDIA H100 ... -> h100
out="$OUT/$(date +%F)-$gpu-compatibility-$part.jsonl"
[ -z "$previous" ] || cp "$previous" "$out"
work=/tmp/compatibility
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
export OMP_NUM_THREADS=2  # a dozen processes share 16-32 cores; DeepSpeed's CPU Adam would take every core each
start=$SECONDS

launch() {  # name limit_s command...: its output in $OUT/<name>.log; a launch that dies (a collective hung past
  # the runner's timeout kills it) restarts with --resume, which records the cell it died in as failed
  local name=$1 limit=$2; shift 2
  timeout --kill-after=10 "$limit" bash -c 'for attempt in 1 2 3; do "$@" && exit 0; done; exit 1' _ \
    "$@" --out "$out" --work-dir "$work" --resume > "$OUT/$name.log" 2>&1 &
}
runner=benchmarks/compatibility.py
build_cpu_adam() {  # DeepSpeed compiles its CPU Adam on first use: once here, not in every launch at the same time
  python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$OUT/cpu_adam_build.log" 2>&1
  echo "DeepSpeed CPU Adam built at $((SECONDS - start)) s"
}
launch_with() { echo accelerate launch --num_processes "$1" --main_process_port "$2" --config_file "$3"; }
zero2=accelerate_configs/zero2_offload4.yaml
zero3=accelerate_configs/zero3_offload4.yaml

if [ "$part" = single ]; then
  launch single 280 python3 "$runner" --launch single  # plain python, as a user runs one process
  build_cpu_adam
  # ZeRO with 1 process under the DeepSpeed accelerate configs, as with 2: each launch gets a port of its own.
  launch zero2-a 240 $(launch_with 1 29611 $zero2) "$runner" --launch zero2-offload --shard 1/2
  launch zero2-b 240 $(launch_with 1 29612 $zero2) "$runner" --launch zero2-offload --shard 2/2
  launch zero3-a 240 $(launch_with 1 29613 $zero3) "$runner" --launch zero3-offload --shard 1/2
  launch zero3-b 240 $(launch_with 1 29614 $zero3) "$runner" --launch zero3-offload --shard 2/2
elif [ "$part" = multi ]; then
  build_cpu_adam
  launch ddp 200 $(launch_with 2 29621 accelerate_configs/ddp4.yaml) "$runner" --launch ddp
  launch fsdp 200 $(launch_with 2 29622 accelerate_configs/fsdp4.yaml) "$runner" --launch fsdp
  launch zero2-a 200 $(launch_with 2 29623 $zero2) "$runner" --launch zero2-offload --shard 1/2
  launch zero2-b 200 $(launch_with 2 29624 $zero2) "$runner" --launch zero2-offload --shard 2/2
  launch zero3-a 200 $(launch_with 2 29625 $zero3) "$runner" --launch zero3-offload --shard 1/2
  launch zero3-b 200 $(launch_with 2 29626 $zero3) "$runner" --launch zero3-offload --shard 2/2
else
  echo "say single (1 GPU) or multi (2 GPUs), not '$part'" >&2
  exit 2
fi
wait || true
echo "done at $((SECONDS - start)) s"
for log in "$OUT"/*.log; do echo "== $log"; grep -E '^\[[0-9]+/' "$log" | tail -n 2 || tail -n 5 "$log"; done
python3 - "$out" <<'PY'
import collections, json, sys
sys.path.insert(0, ".")
from benchmarks.compatibility import status_of
lines = [json.loads(line) for line in open(sys.argv[1])]
print(sys.argv[1], dict(collections.Counter(f"x{l['processes']} {l['cell']['launch']}: {status_of(l)}" for l in lines)))
PY
