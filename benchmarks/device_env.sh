# Sourced by the benchmarks/gpu_*.sh scripts on the device machine (no network): installs the wheels carried in
# .whl (datasets, bitsandbytes, deepspeed, …; see ../shared/device/wheelhouse.sh) and sets up $OUT for results.
OUT=${OUT:-runs/bench}
mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import datasets" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# The engine as the package altscale (README.md, "Layout"): the image has no venv, so this tree is installed into its
# python3 in place; setuptools >= 70.1 comes with the carried wheels when the image's is older.
python3 -c "import altscale.config" 2>/dev/null ||
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "Running pip as the 'root' user" || true
python3 -c "import altscale.config" || { echo "altscale did not install: see README.md, Layout" >&2; exit 1; }

# The GPU recipes' photos (recipes/blip2/*.yaml: dataset_path data/synthetic_food-224), drawn once per machine;
# the same set as `make data-224`, whose venv step the device machine skips.
data_224() {
  [ -f data/synthetic_food-224/dataset_dict.json ] ||
    python3 -m altscale.data.synthetic --out data/synthetic_food-224 --size 224 --num-train 512 --num-test 64
}

# Logs go to one folder, packed into $OUT/logs.tgz when the script exits: a device call returns at most 8 files.
keep_logs() {
  LOGS=/tmp/logs
  mkdir -p "$LOGS"
  trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" .' EXIT
}

# run_recipe NAME CONFIG RECIPE LIMIT_S [accelerate flags...] -- [train.py overrides...]
# recipes/blip2/RECIPE.yaml under accelerate_configs/CONFIG, its log in $LOGS/NAME.log and its record in
# $OUT/results.jsonl. Its time limit is cut to leave 15 s before DEADLINE (seconds since the script started), and
# it is skipped with under 30 s left. accelerate turns every exit code into 1: read the status from the record.
run_recipe() {
  local name=$1 config=$2 recipe=$3 limit=$4 flags=()
  shift 4
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  local left=$((DEADLINE - SECONDS - 15))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 30 ]; then echo "$name: skipped, ${left}s left"; return; fi
  echo "=== $name (accelerate_configs/$config, limit ${limit}s, at ${SECONDS}s)"
  timeout -k 15 "$limit" accelerate launch --config_file "accelerate_configs/$config" "${flags[@]}" recipes/train.py \
    "recipes/blip2/$recipe.yaml" --results_file "$OUT/results.jsonl" --output_dir "/tmp/$name" \
    --overwrite_output_dir true "$@" > "$LOGS/$name.log" 2>&1
  echo "$name: exit $? after ${SECONDS}s"
  grep -E "^(train |learning_rate:|gradient_checkpointing:|error)" "$LOGS/$name.log" | head -4
}
