#!/usr/bin/env bash
# One device call for the decode attention kernels (executor/decode_attention.py): their CUDA tests,
# then the engine in-process at 16 streams with every kernel recorded (profile_speech.py
# --trace-levels), once per kernel: PyTorch's SDPA on the packed query (the default) and the
# split-key Triton pair (OMNI_DECODE_KERNEL=split). Each run's log, levels and GPU timeline land in
# $OUT/<kernel>/; the summary lines print as they come. Run from the repo root on the device, with
# the carried wheels (.whl):
#   bash tests/gpu/decode_kernel_ab.sh
# KERNELS (default "sdpa split"), LEVELS (default 16), RUN_TIMEOUT (seconds per run, default 240),
# VARIANTS (see the end).
set -uo pipefail
OUT=${OUT:-/tmp/omni-decode-ab}
mkdir -p "$OUT"
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/operator:$PWD/runtime PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
# The kernel tests need no model (seconds); a model-building fixture would take minutes.
timeout 120 python -m pytest -q -p no:cacheprovider tests/gpu/test_engine_cuda.py -k packed > "$OUT/tests.log" 2>&1
echo "kernel tests rc=$?: $(tail -1 "$OUT/tests.log")"
CKPT=/tmp/qwen2.5-omni-7b-dummy
[ -d "$CKPT" ] || python -m omni_operator.cli tiny-checkpoint --shape released "$CKPT" > /dev/null 2>&1
for kernel in ${KERNELS:-sdpa split}; do
  mkdir -p "$OUT/$kernel"
  began=$(date +%s)
  (cd tests/gpu && OMNI_DECODE_KERNEL=$kernel timeout "${RUN_TIMEOUT:-240}" python profile_speech.py "$CKPT" \
    --requests 1 --concurrency "${LEVELS:-16}" --waves 2 --trace-levels "${LEVELS:-16}" --out "$OUT/$kernel") \
    > "$OUT/$kernel/run.log" 2>&1
  echo "== $kernel: rc=$? in $(($(date +%s) - began)) s"
  grep -E "stall per stream|first text|GPU busy|^    (vocoder|talker|thinker):|runner calls" "$OUT/$kernel/run.log" | cut -c1-300
done
# VARIANTS='[{}, {"holds_spare_text": false}]': one more load (default kernel) running those
# profile_speech window variants side by side at LEVELS, e.g. the hold rule with the faster text.
if [ -n "${VARIANTS:-}" ]; then
  mkdir -p "$OUT/variants"
  (cd tests/gpu && timeout "${RUN_TIMEOUT:-240}" python profile_speech.py "$CKPT" --requests 1 \
    --concurrency "${LEVELS:-16}" --waves 2 --variants-only --window-variants "$VARIANTS" --out "$OUT/variants") \
    > "$OUT/variants/run.log" 2>&1
  echo "== variants: rc=$?"
  grep -E "stall per stream|first text|^  [a-z_]+=|^  default" "$OUT/variants/run.log" | cut -c1-300
fi
