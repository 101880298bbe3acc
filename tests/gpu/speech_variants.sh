#!/usr/bin/env bash
# One device call: the engine in-process (profile_speech.py) with several window/engine variants
# side by side in one model load, Qwen2.5-Omni-7B shape with dummy weights. Run from the repo root
# on the device, with the carried wheels (.whl):
#   VARIANTS='[{}, {"vocoder_far": [1.0, 4]}, {"vocoder_buckets": [1,2,4,6,8,10,12,14,16]}]' \
#     bash tests/gpu/speech_variants.sh
# FAMILY (default qwen2_5_omni; qwen3_omni_moe wants TALKER_TOKENS=125 and an H200), TALKER_TOKENS
# (default 400), LEVELS (default 1,16,32; empty: none), WAVES (default 2), RATES (open-loop levels,
# Poisson arrivals a second, e.g. 2; default none) and DURATION (seconds of arrivals, default 30), TRACE (levels traced with CUPTI, default 16; empty:
# none), RUN_TIMEOUT (seconds, default 520). The keys a variant takes are profile_speech.py's
# (--window-variants). Results in $OUT/v: run.log, levels.json, speech.png, GPU timelines.
set -uo pipefail
OUT=${OUT:-/tmp/omni-speech-variants}
source tests/gpu/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILY=${FAMILY:-qwen2_5_omni}
CKPT=${CKPT:-/tmp/$FAMILY-released-dummy}
[ -d "$CKPT" ] || python -m omni_operator.cli tiny-checkpoint --family "$FAMILY" --shape released "$CKPT" > /dev/null 2>&1
mkdir -p "$OUT/v"
began=$SECONDS
variants=${VARIANTS:-}
[ -n "$variants" ] || variants='[{}]'
trace=()
[ -n "${TRACE-16}" ] && trace=(--trace-levels "${TRACE-16}")
(cd tests/gpu && timeout "${RUN_TIMEOUT:-520}" python profile_speech.py "$CKPT" --requests 1 \
  --talker-tokens "${TALKER_TOKENS:-400}" --concurrency "${LEVELS-1,16,32}" --waves "${WAVES:-2}" "${trace[@]}" --variants-only \
  --rates "${RATES:-}" --duration "${DURATION:-30}" \
  --window-variants "$variants" --out "$OUT/v") > "$OUT/v/run.log" 2>&1
echo "rc=$? in $((SECONDS - began)) s"
grep -E "stall per stream|calls by window size|talker ends|^prefill:|prefill graphs|GPU busy|^    (vocoder|talker|thinker):|runner calls|worst stream|ended|capture failed|warm in" \
  "$OUT/v/run.log" | cut -c1-400
