# Sourced by the benchmarks/gpu_*.sh scripts on the device machine (no network): installs the wheels carried in
# .whl (datasets, bitsandbytes, deepspeed, …; see ../shared/device/wheelhouse.sh) and sets up $OUT for results.
OUT=${OUT:-runs/bench}
mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import datasets" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
