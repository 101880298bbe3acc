#!/usr/bin/env bash
# One device call: prefill_graph_diff.py for both tiny checkpoints, greedy and sampled, side by
# side (four processes on one GPU), each padded prefill shadowed by an unpadded one. Run from the
# repo root on the device with the carried wheels (.whl). Results in $OUT/diff/*.log.
set -uo pipefail
OUT=${OUT:-/tmp/omni-prefill-diff}
mkdir -p "$OUT/diff"
source tests/gpu/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for family in ${FAMILIES:-qwen2_5_omni qwen3_omni_moe}; do
  for t in ${TEMPERATURES:-0.0 1.0}; do
    (cd tests/gpu && timeout "${RUN_TIMEOUT:-500}" python prefill_graph_diff.py --family "$family" --temperature "$t" \
      ${SHADOW---shadow} > "$OUT/diff/$family-t$t.log" 2>&1; echo "rc=$?" >> "$OUT/diff/$family-t$t.log") &
  done
done
wait
for f in "$OUT"/diff/*.log; do
  echo "== $f"; grep -E "^mode|reply|DIFFERS|rc=|Error|captured" "$f" | cut -c1-260 | head -40
done
