#!/usr/bin/env bash
# One device call (an H100, issue 20's machine): does prefilling the turn being spoken into the
# session's KV while the user speaks (OMNI_WARM_SPOKEN_AUDIO=1, opt-in) bring a realtime turn's
# first audio sooner? Realtime at 1 and 8 sessions through `omni serve`, 4.5 s of speech a turn
# sent in real time (--paced: the worker can work while the user speaks), the switch off then on,
# two servers in one call (ab_bench.sh on this tree). Run from the repo root on the device with the
# carried wheels (.whl). Results in $OUT/ab/{base,new}; each turn's cached_tokens shows the reuse.
set -uo pipefail
OUT=${OUT:-/tmp/omni-warm-spoken}
mkdir -p "$OUT"
OUT="$OUT/ab" BASE_DIR=. BASE_ENV=OMNI_WARM_SPOKEN_AUDIO=0 NEW_ENV=OMNI_WARM_SPOKEN_AUDIO=1 TEXT=0 SPEECH=0 \
  RT_LEVELS="${RT_LEVELS:-1,8}" RT_TURNS="${RT_TURNS:-3}" RT_ARGS="--paced --speech-seconds 4.5" \
  RT_TIMEOUT="${RT_TIMEOUT:-200}" BASELINE=0 AB_LINES=14 bash tests/gpu/ab_bench.sh
