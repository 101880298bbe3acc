#!/usr/bin/env bash
# One device call: are prefills replayed as CUDA graphs (on by default; OMNI_PREFILL_GRAPHS=0 turns them off) equal to
# unpadded ones? The GPU tests of both tiny checkpoints (whole seeded replies with and without,
# and single prefills), then tests/gpu/profile_prefill.py on the released Qwen3-Omni shape in
# bfloat16 (per stack and shape: the largest relative difference of logits, hidden states, kept
# layer and keys, graph against unpadded, and the wall time of each). Run from the repo root on the
# device, with the carried wheels (.whl). Results in $OUT/check: tests.log, profile.log.
set -uo pipefail
OUT=${OUT:-/tmp/omni-prefill-check}
mkdir -p "$OUT/check"
source tests/gpu/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout "${TESTS_TIMEOUT:-300}" python -m pytest -q -p no:cacheprovider \
  tests/gpu/test_engine_cuda.py tests/gpu/test_qwen3_talker_cuda.py -k "prefill" \
  > "$OUT/check/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|^E " "$OUT/check/tests.log" | head -20
CKPT=/tmp/qwen3-omni-30b-a3b-dummy
[ -d "$CKPT" ] || python -m omni_operator.cli tiny-checkpoint --family qwen3_omni_moe --shape released "$CKPT" > /dev/null 2>&1
(cd tests/gpu && timeout "${PROFILE_TIMEOUT:-280}" python profile_prefill.py --model-path "$CKPT" --load-format dummy \
  --shapes "${SHAPES:-1x48,1x100,3x40,16x48,32x48}" --top 0) > "$OUT/check/profile.log" 2>&1
echo "profile rc=$?"; grep -E "graph against|wall|captured|prefill graphs" "$OUT/check/profile.log" | cut -c1-300
