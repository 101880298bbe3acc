#!/usr/bin/env bash
# The MoE decode kernels on a GPU, one call (issue 17): correctness against grouped_mm, the launch
# sweep, the thinker decode step with each experts kernel beside HF generate and the bandwidth
# bound, and a kernel profile at batch 1. Run on the device machine from the repo root:
#   bash tests/gpu/run_moe_decode.sh        (results in $OUT)
# STEPS_TIMEOUT bounds each step (seconds) so one hang does not take the whole call.
set -uo pipefail
OUT=${OUT:-/tmp/omni-moe}; mkdir -p "$OUT"
if [ -d .whl ]; then
  rm -rf /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/operator:$PWD/runtime
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMNI_CACHE_DIR=/tmp/omni-cache TOKENIZERS_PARALLELISM=false
T=${STEPS_TIMEOUT:-240}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers, triton; print("torch", torch.__version__, "transformers", transformers.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
status=0
step() {  # name, command...
  local name=$1; shift
  echo "== $name"; local t0=$SECONDS
  timeout "$T" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  tail -${TAIL:-25} "$OUT/$name.log"; echo "-- $name rc=$rc in $((SECONDS - t0)) s"
  [ $rc = 0 ] || status=1
}
[ "${CHECK:-1}" = 1 ] && step check python3 -m pytest tests/gpu/test_moe_decode_cuda.py tests/gpu/test_moe_layer_cuda.py -q -p no:cacheprovider
[ "${SWEEP:-1}" = 1 ] && step sweep python3 -m omni_runtime.bench.moe_kernel --rows "${ROWS:-1,2,4,8,16}" --json "$OUT/moe-kernel.json"
[ "${DECODE:-1}" = 1 ] && step decode python3 -m omni_runtime.bench.decode --family qwen3_omni_moe \
  --batches "${BATCHES:-1,4,8,32}" --steps 64 --experts "${EXPERTS:-omni_fused+qkv+pdl,omni_fused+qkv+layer,omni_fused+qkv,grouped_mm}" --json "$OUT/decode.json"
[ "${PROFILE:-1}" = 1 ] && TAIL=80 step profile python3 tests/gpu/profile_decode.py --family qwen3_omni_moe \
  --batches 1 --experts "${PROFILED:-omni_fused+qkv+pdl,omni_fused+qkv}" --out "$OUT/profile.txt"
exit $status
