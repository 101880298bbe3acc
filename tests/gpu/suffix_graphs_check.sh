#!/usr/bin/env bash
# One device call (an H100, issue 20's machine): are suffix prefills after a kept conversation
# prefix, replayed as CUDA graphs (OMNI_SUFFIX_GRAPHS=1, opt-in), equal to unpadded ones, and do
# they bring a realtime turn's first audio sooner? First the GPU tests of the tiny checkpoints
# (fresh and suffix graphs against unpadded prefills), then realtime at 1 and 8 sessions through
# `omni serve` with the switch off and on, two servers in one call (ab_bench.sh on this tree).
# Run from the repo root on the device with the carried wheels (.whl). Results in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/omni-suffix-check}
mkdir -p "$OUT"
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/operator:$PWD/runtime PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name --format=csv,noheader
timeout "${TESTS_TIMEOUT:-240}" python -m pytest -q -p no:cacheprovider tests/gpu/test_engine_cuda.py \
  -k "prefill_graphs_equal" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|^E " "$OUT/tests.log" | head -20
OUT="$OUT/ab" BASE_DIR=. BASE_ENV=OMNI_SUFFIX_GRAPHS=0 NEW_ENV=OMNI_SUFFIX_GRAPHS=1 TEXT=0 SPEECH=0 \
  RT_LEVELS="${RT_LEVELS:-1,8,8,8}" RT_TURNS="${RT_TURNS:-4}" BASELINE=0 AB_LINES=14 bash tests/gpu/ab_bench.sh
grep -h "suffix\|capture failed\|prefill graphs" "$OUT"/ab/*/serve.log | sort | uniq -c | head
