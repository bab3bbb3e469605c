#!/usr/bin/env bash
# Issue 14: moving the engine out of recipes/ must cost no speed and no memory. The same recipe runs from the tree
# before the move (95c4649, carried as runs/before.tar) and from this tree, alternating, ROUNDS times each, on
# lab-format photos (512x384 JPEG, 8-25-word captions), on the device machine (no network; carry .whl and
# runs/before.tar, made here with `git archive 95c4649 > runs/before.tar`):
#   bash benchmarks/gpu_move.sh graphs   opt27-bf16-graphs: 512 photos x 2 epochs, CUDA graphs
#   bash benchmarks/gpu_move.sh zero2    opt27-bf16 without its `optim` (the ZeRO config's optimizer section steps),
#                                        --deepspeed ds_configs/zero2_offload.json, MAX_STEPS steps
# Each run appends its record to $OUT/move.jsonl (its output_dir names tree, part and round); the table comes last.
# TREES="after" (or "before") runs one tree only, to finish a round a call ran out of time for.
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
ROUNDS=${ROUNDS:-2}
MAX_STEPS=${MAX_STEPS:-3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/gpu.txt"
rm -rf /tmp/before && mkdir -p /tmp/before && tar xf runs/before.tar -C /tmp/before
[ -f /tmp/lab/dataset_dict.json ] ||
  python3 -m altscale.data.synthetic --lab --out /tmp/lab --num-train 512 --num-test 64

run() {  # TREE PART ROUND RECIPE [overrides...]: TREE is before (/tmp/before) or after (this tree); RECIPE is
  # the name of a recipes/blip2/ file, or a path to a YAML file
  local tree=$1 part=$2 round=$3 recipe=$4 dir=$PWD
  shift 4
  [ "$tree" = before ] && dir=/tmp/before
  echo "=== $tree $part $round at ${SECONDS}s"
  [[ $recipe == *.yaml ]] || recipe=recipes/blip2/$recipe.yaml
  (cd "$dir" && timeout -k 10 "${LIMIT_S:-240}" python3 recipes/train.py "$recipe" \
     --dataset_path /tmp/lab --output_dir "/tmp/move-$tree-$part-$round" --overwrite_output_dir true \
     --save_model false --results_file "$OUT/move.jsonl" "$@") > "/tmp/move-$tree-$part-$round.log" 2>&1 \
    || echo "exit $? (log: /tmp/move-$tree-$part-$round.log)"
  grep -E "^(train |error)" "/tmp/move-$tree-$part-$round.log" | tail -2 || tail -5 "/tmp/move-$tree-$part-$round.log"
}

for part in "$@"; do
  case $part in
    graphs)
      run after warmup 0 opt27-bf16-graphs --max_steps 4  # a fresh machine's first run is slow
      for round in $(seq "$ROUNDS"); do
        for tree in ${TREES:-before after}; do run "$tree" graphs "$round" opt27-bf16-graphs; done
      done ;;
    zero2)
      # A recipe's `optim` under a ZeRO config with an optimizer section is refused (strategies/deepspeed.py).
      grep -v '^optim:' recipes/blip2/opt27-bf16.yaml > /tmp/opt27-bf16-zero2.yaml
      # First: DeepSpeed compiles its CPU Adam once per machine (about a minute), which no measured run should pay.
      run after zero2-warmup 0 /tmp/opt27-bf16-zero2.yaml --deepspeed ds_configs/zero2_offload.json --max_steps 1
      for round in $(seq "$ROUNDS"); do
        for tree in ${TREES:-before after}; do
          run "$tree" zero2 "$round" /tmp/opt27-bf16-zero2.yaml --deepspeed ds_configs/zero2_offload.json --max_steps "$MAX_STEPS" \
            --logging_steps 1
        done
      done ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
tar czf "$OUT/move-logs.tgz" -C /tmp $(cd /tmp && ls -d move-*.log) 2>/dev/null || true
python3 - "$OUT/move.jsonl" <<'PY'
import json, sys
print(f"{'run':28} {'status':6} {'samples/s':>9} {'after step 1':>12} {'peak GiB':>8} {'train s':>7} {'1st step s':>10}")
for line in open(sys.argv[1]):
    r = json.loads(line); s = r.get("summary") or {}
    name = r["config"]["training_args"]["output_dir"].removeprefix("/tmp/move-")
    peak = s.get("peak_allocated_bytes")
    print(f"{name:28} {r['status']:6} {s.get('samples_per_s') or 0:9.2f} {s.get('steady_samples_per_s') or 0:12.2f} "
          f"{(peak or 0) / 2**30:8.3f} {s.get('train_time_s') or 0:7.1f} {s.get('time_to_first_step_s') or 0:10.1f}")
PY
