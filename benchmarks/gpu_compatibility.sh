#!/usr/bin/env bash
# The compatibility matrix's GPU cells (docs/compatibility.md), on the device machine (carry .whl):
#   bash benchmarks/gpu_compatibility.sh single [PREVIOUS.jsonl]   1 GPU, at most 285 s: single, ZeRO-2/3 offload x1
#   bash benchmarks/gpu_compatibility.sh multi  [PREVIOUS.jsonl]   2 GPUs, at most 225 s: DDP, FSDP, ZeRO-2/3 offload x2
# A part's launches run side by side (the tiny model leaves the GPU idle most of the time), each one process or one
# accelerate launch looping over its cells, the ZeRO ones in two shards because a DeepSpeed cell takes longest.
# Lines go to $OUT/<date>-<gpu>-compatibility-<part>.jsonl as each cell ends: copy it to benchmarks/results/ and
# run `python benchmarks/compatibility_doc.py`. Every launch stops at the part's deadline; the cells it had not
# reached read "not run yet", and the file given back as PREVIOUS.jsonl makes a second run do only those (and
# again any cell an older runner recorded as "the launch died during this cell").
set -euo pipefail
part=${1:?say single (1 GPU) or multi (2 GPUs)}
previous=${2:-}
case "$part" in
  single) deadline=285 ;;
  multi) deadline=225 ;;
  *) echo "say single (1 GPU) or multi (2 GPUs), not '$part'" >&2; exit 2 ;;
esac
source "$(dirname "$0")/device_env.sh"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')  # NVIDIA H100 ... -> h100
out="$OUT/$(date +%F)-$gpu-compatibility-$part.jsonl"
if [ -n "$previous" ]; then grep -v '"error": "the launch died during this cell' "$previous" > "$out" || true; fi
work=/tmp/compatibility
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
export OMP_NUM_THREADS=2  # a dozen processes share 16-32 cores; DeepSpeed's CPU Adam would take every core each

launch() {  # name command...: output in $OUT/<name>.log, killed at the deadline (less 15 s for the summary). A
  # launch ends early when a cell hangs (45 s) or a rank fails alone; it starts again with --resume, which runs
  # a hung cell once more and records a second hang, or the lone rank's error, as the cell's failure.
  local name=$1; shift
  timeout --kill-after=5 "$((deadline - 15 - SECONDS))" bash -c 'for attempt in $(seq 30); do "$@" && exit 0; sleep 1; done; exit 1' _ \
    "$@" --out "$out" --work-dir "$work" --resume --cell-timeout-s 45 > "$OUT/$name.log" 2>&1 &
}
build_cpu_adam() {  # DeepSpeed compiles its CPU Adam on first use: once here, beside the launches that need none
  if python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$OUT/cpu_adam_build.log" 2>&1
  then echo "DeepSpeed CPU Adam built at $SECONDS s"
  else echo "DeepSpeed CPU Adam did not build (the ZeRO cells will say why): $OUT/cpu_adam_build.log"
  fi
}
runner=benchmarks/compatibility.py
accelerate_launch() { echo accelerate launch --num_processes "$1" --main_process_port "$2" --config_file "$3"; }
zero2=accelerate_configs/zero2_offload4.yaml
zero3=accelerate_configs/zero3_offload4.yaml

if [ "$part" = single ]; then
  launch single python3 "$runner" --launch single  # plain python, as a user runs one process
  build_cpu_adam
  # ZeRO with 1 process under the DeepSpeed accelerate configs, as with 2; each launch gets a port of its own.
  launch zero2-a $(accelerate_launch 1 29611 $zero2) "$runner" --launch zero2-offload --shard 1/2
  launch zero2-b $(accelerate_launch 1 29612 $zero2) "$runner" --launch zero2-offload --shard 2/2
  launch zero3-a $(accelerate_launch 1 29613 $zero3) "$runner" --launch zero3-offload --shard 1/2
  launch zero3-b $(accelerate_launch 1 29614 $zero3) "$runner" --launch zero3-offload --shard 2/2
else
  launch ddp $(accelerate_launch 2 29621 accelerate_configs/ddp4.yaml) "$runner" --launch ddp
  launch fsdp $(accelerate_launch 2 29622 accelerate_configs/fsdp4.yaml) "$runner" --launch fsdp
  build_cpu_adam
  launch zero2-a $(accelerate_launch 2 29623 $zero2) "$runner" --launch zero2-offload --shard 1/2
  launch zero2-b $(accelerate_launch 2 29624 $zero2) "$runner" --launch zero2-offload --shard 2/2
  launch zero3-a $(accelerate_launch 2 29625 $zero3) "$runner" --launch zero3-offload --shard 1/2
  launch zero3-b $(accelerate_launch 2 29626 $zero3) "$runner" --launch zero3-offload --shard 2/2
fi
wait || true
echo "launches done at $SECONDS s"
for log in "$OUT"/*.log; do
  echo "== $log"
  grep -E '^\[[0-9]+/' "$log" | tail -n 2 || tail -n 5 "$log"
done
python3 - "$out" <<'PY'
import collections, json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
counts = collections.Counter(
    (f"x{l['processes']} {l['cell']['launch']}", "refused" if l["verdict"]["refused"] else "accepted", l["outcome"]["status"])
    for l in lines)
for key, n in sorted(counts.items()):
    print(*key, n)
PY
