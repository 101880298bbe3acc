#!/usr/bin/env bash
# One device call (an H100, issue 21's machine): the longer first window under load (default: 20
# codes from 4 streaming replies on) against the short one at any load (OMNI_BUSY_STREAMS=0),
# through HTTP (`omni bench --mode speech`, two waves at 1, 4, 16 and 32 streams) and realtime at 8
# sessions, two servers in one call (ab_bench.sh on this tree: the short window is the baseline).
# The in-process rows that set the default are in docs/benchmarks.md ("A longer first window
# under load"). Run from the repo root on the device with the carried wheels (.whl).
# Results in $OUT/ab/{base,new}: bench.json, speech.png, realtime.txt per build.
set -uo pipefail
OUT=${OUT:-/tmp/omni-busy-window}
mkdir -p "$OUT"
OUT="$OUT/ab" BASE_DIR=. BASE_ENV=OMNI_BUSY_STREAMS=0 NEW_ENV= TEXT=0 SPEECH_LEVELS="${SPEECH_LEVELS:-1,4,16,32}" \
  SPEECH_WAVES=2 RT_LEVELS="${RT_LEVELS:-8}" RT_TURNS="${RT_TURNS:-3}" BASELINE=0 AB_LINES=16 bash tests/gpu/ab_bench.sh
