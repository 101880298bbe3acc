#!/usr/bin/env bash
# Device calls (an H100, issue 21's machine): the longer first window under load (default: 20
# codes from 4 streaming replies on) against the short one at any load (OMNI_BUSY_STREAMS=0),
# through HTTP (`omni bench --mode speech`, two waves at 1, 4, 16 and 32 streams) and realtime at 8
# sessions. Both sides do not fit one 600 s call on a fresh machine (its first server start
# compiles for about 200 s): SIDE=base (the short window) in one call, then SIDE=new (the
# default) in the next, on the same warm machine. The in-process rows that set the default are in
# docs/benchmarks.md ("A longer first window under load"). Run from the repo root on the device
# with the carried wheels (.whl). Results in $OUT/ab/$SIDE: speech-vs-hf.txt, speech/bench.json,
# realtime.txt.
set -uo pipefail
OUT=${OUT:-/tmp/omni-busy-window}
SIDE=${SIDE:-base}
case "$SIDE" in
  base) side_env=OMNI_BUSY_STREAMS=0 ;;
  new) side_env= ;;
  *) echo "SIDE must be base or new, got '$SIDE'"; exit 2 ;;
esac
mkdir -p "$OUT/ab"
env $side_env OUT="$OUT/ab/$SIDE" TEXT=0 SPEECH_LEVELS="${SPEECH_LEVELS:-1,4,16,32}" SPEECH_WAVES=2 \
  RT_LEVELS="${RT_LEVELS:-8}" RT_TURNS="${RT_TURNS:-3}" BASELINE=0 bash tests/gpu/run_device_bench.sh 2>&1 | tail -16
