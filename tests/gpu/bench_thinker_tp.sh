#!/usr/bin/env bash
# Thinker decode time per step, TP=1 vs TP=2 (or TPS="1 2 4"), on Qwen2.5-Omni-7B-shaped dummy
# weights, built the way `omni serve --load-format dummy --thinker-tp-size N` builds them
# (python -m omni_runtime.bench.decode --tp N). Needs as many GPUs as the largest TP size.
# Run on the device machine from the repo root:  bash tests/gpu/bench_thinker_tp.sh
# Results (JSON per TP size, a summary table) land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/omni-tp-bench}; mkdir -p "$OUT"
if [ -d .whl ]; then
  rm -rf /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/operator:$PWD/runtime
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMNI_CACHE_DIR=${OMNI_CACHE_DIR:-/tmp/omni-cache} TOKENIZERS_PARALLELISM=false
TPS=${TPS:-"1 2"}
BATCHES=${BATCHES:-1,4,16}
STEPS=${STEPS:-128}
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$OUT/gpu.txt"
nvidia-smi topo -m >> "$OUT/gpu.txt" 2>&1 || true
status=0
for tp in $TPS; do
  echo "== TP=$tp"
  python3 -m omni_runtime.bench.decode --tp "$tp" --batches "$BATCHES" --steps "$STEPS" \
    --json "$OUT/tp$tp.json" 2>&1 | tee "$OUT/tp$tp.log" | grep -v "Model config" | tail -8
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
python3 - "$OUT" $TPS <<'PY'
import json, sys
out, sizes = sys.argv[1], sys.argv[2:]
runs = {}
for tp in sizes:
    try:
        runs[tp] = json.load(open(f"{out}/tp{tp}.json"))
    except OSError:
        print(f"TP={tp}: no result"); continue
if not runs:
    sys.exit(0)
first = next(iter(runs.values()))
print(f"\nthinker decode ms/step on {first['gpu']} ({first['dtype']}), serving path, greedy")
print("batch " + " ".join(f"{'TP=' + tp:>10}" for tp in runs) + "   speedup vs first")
for i, row in enumerate(first["rows"]):
    cells = [r["rows"][i]["runtime_ms_per_step"] for r in runs.values()]
    print(f"{row['batch']:>5} " + " ".join(f"{c:10.2f}" for c in cells) + "   " + " ".join(f"{cells[0] / c:5.2f}x" for c in cells))
PY
exit $status
