#!/usr/bin/env bash
# One device call, two builds: run_device_bench.sh over a baseline tree, then over this one, with the
# same settings on the same machine (a baseline from another call may land on another machine, and
# one H100 differs from the next by more than many changes do). Results: $OUT/base and $OUT/new.
#
# Here, before the call (the baseline as a tree beside the checkout, ignored by git and carried):
#   mkdir .bench-base && git archive REF operator runtime tests/gpu | tar x -C .bench-base
#   grep -qx '/.bench-base/' .git/info/exclude || echo '/.bench-base/' >> .git/info/exclude
#   bash tests/gpu/wheels.sh     # .whl, if missing
# Then run, with carry [".whl", ".bench-base"] and run_device_bench.sh's settings in the environment:
#   TEXT=0 SPEECH=0 RT_LEVELS=8,8,8,8 RT_TURNS=4 BASELINE=0 bash tests/gpu/ab_bench.sh
# NEW_ENV adds settings to the new build's run only (an environment switch measured against its
# absence, e.g. NEW_ENV="OMNI_STREAM_PRIORITIES=thinker=-1"); BASE_ENV the same for the baseline.
# Two servers start in one call (130-200 s each; each says how long): keep the rest short enough
# for 600 s. One server's speech levels 1,16,32 (two waves), Poisson 2/s for 30 s and realtime 1,8
# (3 paced turns) took about 330 s with its start, so both did not fit; drop realtime (REALTIME=0)
# or levels for an A/B of both.
set -uo pipefail
OUT=${OUT:-/tmp/omni-ab}
BASE_DIR=${BASE_DIR:-.bench-base}
[ -d "$BASE_DIR/runtime" ] || { echo "no baseline tree at $BASE_DIR (see the top of $0)"; exit 2; }
ln -sfn "$PWD/.whl" "$BASE_DIR/.whl"
(cd "$BASE_DIR" && env ${BASE_ENV:-} OUT="$OUT/base" bash tests/gpu/run_device_bench.sh) 2>&1 | tail -"${AB_LINES:-20}"
env ${NEW_ENV:-} OUT="$OUT/new" bash tests/gpu/run_device_bench.sh 2>&1 | tail -"${AB_LINES:-20}"
