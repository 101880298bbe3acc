#!/usr/bin/env bash
# One device call (an H100, issue 21's machine): do far windows bounded only while a stream is near
# (OMNI_VOCODER_FAR=1.0,4,near, opt-in) keep more streams real time through HTTP? Streaming speech
# at 16 streams (two waves) and Poisson arrivals at 2 a second, the switch off then on, two servers
# in one call (ab_bench.sh on this tree; realtime left out so both fit, about 520 s). Each level
# also prints where its time to first audio went inside the worker (omni bench's phase lines).
# Run from the repo root on the device with the carried wheels (.whl). Results in $OUT/ab/{base,new};
# `python -m omni_runtime.bench.timelines $OUT/ab/new/speech-open/requests.jsonl` says where streams
# ran dry.
set -uo pipefail
OUT=${OUT:-/tmp/omni-far-near}
mkdir -p "$OUT"
OUT="$OUT/ab" BASE_DIR=. BASE_ENV=OMNI_VOCODER_FAR=off NEW_ENV=OMNI_VOCODER_FAR=1.0,4,near TEXT=0 REALTIME=0 \
  SPEECH_LEVELS="${SPEECH_LEVELS:-16}" SPEECH_WAVES="${SPEECH_WAVES:-2}" SPEECH_RATES="${SPEECH_RATES:-2}" \
  SPEECH_DURATION="${SPEECH_DURATION:-45}" BASELINE=0 AB_LINES=24 bash tests/gpu/ab_bench.sh
