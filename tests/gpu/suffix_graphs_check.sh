#!/usr/bin/env bash
# One device call (an H100, issue 20's machine): do suffix prefills after a kept conversation
# prefix, replayed as CUDA graphs (OMNI_SUFFIX_GRAPHS=1, opt-in), bring a realtime turn's first
# audio sooner? Realtime at 1 and 8 sessions through `omni serve`, the switch off then on, two
# servers in one call (ab_bench.sh on this tree); the new server's log says how many suffix graphs
# it captured at start-up and in how long (none are captured while serving). Run from the repo root on the device with the
# carried wheels (.whl). Results in $OUT/ab/{base,new}.
# The GPU tests of the graphs themselves fit another call:
#   pytest tests/gpu/test_engine_cuda.py -k "prefill_graphs_equal or speech_with_prefill"
set -uo pipefail
OUT=${OUT:-/tmp/omni-suffix-check}
mkdir -p "$OUT"
OUT="$OUT/ab" BASE_DIR=. BASE_ENV=OMNI_SUFFIX_GRAPHS=0 NEW_ENV=OMNI_SUFFIX_GRAPHS=1 TEXT=0 SPEECH=0 \
  RT_LEVELS="${RT_LEVELS:-1,8,8}" RT_TURNS="${RT_TURNS:-4}" BASELINE=0 AB_LINES=14 bash tests/gpu/ab_bench.sh
grep -h "suffix prefill graphs\|capture failed\|prefill graphs" "$OUT"/ab/*/serve.log | cut -c1-200 | sort | uniq -c | head -20
