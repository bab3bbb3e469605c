# Sourced by the benchmarks/gpu_*.sh scripts on the device machine (no network): installs the wheels carried in
# .whl (datasets, bitsandbytes, deepspeed, …; see ../shared/device/wheelhouse.sh) and sets up $OUT for results.
OUT=${OUT:-runs/bench}
mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import datasets" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

# The GPU recipes' photos (recipes/blip2/*.yaml: dataset_path data/synthetic_food-224), drawn once per machine;
# the same set as `make data-224`, whose venv step the device machine skips.
data_224() {
  [ -f data/synthetic_food-224/dataset_dict.json ] ||
    python3 -m data.synthetic --out data/synthetic_food-224 --size 224 --num-train 512 --num-test 64
}
