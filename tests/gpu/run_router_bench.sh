#!/usr/bin/env bash
# Router overhead run (issue: router). Runs on the device machine from the repo root, no internet:
# installs the carried wheels (as run_device_bench.sh does), then measures the same load direct and
# through `omni router` in one run per scenario:
#   1. single/  one router process; scenarios `worker` (a real `omni serve` on $DEVICE: chat
#      completions whole and streamed at 1 and 64 clients, realtime WebSocket round trips) and
#      `echo` (the 0 ms upstream: the worst case for a proxy).
#   2. processes-$PROCESSES/  both scenarios again behind `omni router --processes $PROCESSES`
#      (a burst of answers from a saturated worker is relayed by several loops, not one).
# Every table also gives the router's own p99 per request (its omni_router_overhead_seconds
# histogram) and the full garbage collections of worker and router during the loads.
# Results (results.json, router_overhead.png, the table in bench.txt) land in $OUT.
# Knobs: MODEL_PATH (default: the tiny checkpoint), DEVICE (cuda), PIPELINE (text), SERVE_ARGS
# (extra omni serve flags, space separated), MAX_TOKENS (8), ROUND_SECONDS (3), ROUNDS (4; the whole script stays under the device's 10-minute call),
# CLIENT_PROCESSES (4), PROCESSES (4; 0 skips run 2), UPSTREAMS (worker,echo; worker alone leaves
# time for more rounds).
set -uo pipefail
OUT=${OUT:-/tmp/omni-router-bench}; mkdir -p "$OUT"
rm -rf /tmp/site
WHEELS=${WHEELS:-.whl}  # WHEELS=none: use the python3 environment as it is (a development machine)
if [ -d "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/operator:$PWD/runtime
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMNI_CACHE_DIR=${OMNI_CACHE_DIR:-/tmp/omni-cache} TOKENIZERS_PARALLELISM=false
DEVICE=${DEVICE:-cuda}
PROCESSES=${PROCESSES:-4}
UPSTREAMS=${UPSTREAMS:-worker,echo}
COMMON=(--seconds "${ROUND_SECONDS:-3}" --rounds "${ROUNDS:-4}" --concurrency 1,64 --ws-concurrency 8
        --client-processes "${CLIENT_PROCESSES:-4}")
WORKER=(--device "$DEVICE" --pipeline "${PIPELINE:-text}" --max-tokens "${MAX_TOKENS:-8}")
[ -n "${MODEL_PATH:-}" ] && WORKER+=(--model-path "$MODEL_PATH")
for arg in ${SERVE_ARGS:-}; do WORKER+=("--serve-arg=$arg"); done

{ nproc; grep -m1 "model name" /proc/cpuinfo; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null; } | tee "$OUT/host.txt"
python3 -c 'from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint; ensure_tiny_checkpoint(progress=False)' || exit 1

mkdir -p "$OUT/single"
python3 -m omni_runtime.bench.router.run --out "$OUT/single" --upstream "$UPSTREAMS" "${COMMON[@]}" "${WORKER[@]}" \
  2>&1 | tee "$OUT/single/bench.txt" || exit 1
if [ "$PROCESSES" -gt 1 ]; then
  mkdir -p "$OUT/processes-$PROCESSES"
  python3 -m omni_runtime.bench.router.run --out "$OUT/processes-$PROCESSES" --upstream "$UPSTREAMS" "${COMMON[@]}" \
    "${WORKER[@]}" "--router-arg=--processes=$PROCESSES" 2>&1 | tee "$OUT/processes-$PROCESSES/bench.txt"
fi
