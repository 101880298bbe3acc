#!/usr/bin/env bash
# Where streaming speech spends its time under load (issue: speech at scale). Runs on the device
# machine from the repo root: serves Qwen2.5-Omni-7B-shaped dummy weights (as run_device_bench.sh),
# then for each level in PROFILE_LEVELS runs the speech bench while py-spy samples every thread of
# the server (speedscope JSON + a per-thread summary) and nvidia-smi samples GPU utilisation.
# Needs py-spy among the carried wheels (.whl/). Results land in $OUT/profile-c<level>/.
set -uo pipefail
OUT=${OUT:-/tmp/omni-profile}; mkdir -p "$OUT"
if [ -z "${SERVER:-}" ]; then  # started by hand: let run_device_bench.sh serve, and come back
  export PATH=/tmp/site/bin:$PATH
  AFTER_READY="bash $0" TEXT=0 SPEECH=0 REALTIME=0 BASELINE=0 exec bash tests/gpu/run_device_bench.sh
fi
OMNI_CLI="python3 -m omni_operator.cli"
for level in ${PROFILE_LEVELS:-4 16}; do
  dir="$OUT/profile-c$level"; mkdir -p "$dir"
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader -lms 200 > "$dir/gpu-util.csv" &
  SMI=$!
  py-spy record --pid $SERVER --threads --idle --rate 50 --duration "${PROFILE_SECONDS:-25}" \
    --format speedscope --output "$dir/speedscope.json" --nonblocking > "$dir/py-spy.log" 2>&1 &
  SPY=$!
  curl -s localhost:8000/metrics > "$dir/metrics-before.txt"
  $OMNI_CLI bench --url http://127.0.0.1:8000 --concurrency "$level" --mode speech --stream \
    --requests "$level" --warmup 0 --max-tokens 64 --out "$dir/bench" --label "omni-c$level" \
    --extra-body '{"stage_params": {"talker": {"max_tokens": 400}}}' 2>&1 | tail -8 | tee "$dir/bench.txt"
  curl -s localhost:8000/metrics > "$dir/metrics-after.txt"
  python3 - "$dir" <<'PY'
import json, re, sys
d = sys.argv[1]
def read(name):
    out = {}
    for m in re.finditer(r'^omni_stage_(\w+)_total\{stage="([^"]+)"\} (\S+)$', open(f"{d}/{name}").read(), re.M):
        out[(m.group(1), m.group(2))] = float(m.group(3))
    return out
a, b = read("metrics-before.txt"), read("metrics-after.txt")
wall = json.load(open(f"{d}/bench/bench.json"))["levels"][0]["wall_s"]
print(f"stage load over the level's {wall:.1f} s:")
for stage in sorted({s for _, s in b}):
    busy = b.get(("busy_seconds", stage), 0) - a.get(("busy_seconds", stage), 0)
    calls = b.get(("calls", stage), 0) - a.get(("calls", stage), 0)
    items = b.get(("items", stage), 0) - a.get(("items", stage), 0)
    if calls:
        print(f"  {stage:14s} busy {busy / wall:6.1%}  calls/s {calls / wall:7.1f}  mean batch {items / calls:5.2f}  ms/call {1000 * busy / calls:7.2f}")
PY
  wait $SPY; kill $SMI 2>/dev/null
  python3 - "$dir" <<'PY'
import json, sys, collections
d = sys.argv[1]
try:
    prof = json.load(open(f"{d}/speedscope.json"))
except Exception as exc:
    print("no profile:", exc); sys.exit(0)
frames = prof["shared"]["frames"]
out = []
for p in prof["profiles"]:
    total = len(p["samples"])
    busy = collections.Counter()
    for s, w in zip(p["samples"], p["weights"]):
        leaf = frames[s[-1]] if s else {"name": "?"}
        busy[f'{leaf["name"]} ({leaf.get("file","").split("/")[-1]}:{leaf.get("line","")})'] += 1
    out.append((total, p["name"], busy.most_common(6)))
for total, name, top in sorted(out, reverse=True)[:12]:
    print(f"== {name}: {total} samples")
    for leaf, n in top:
        print(f"   {n / max(total, 1):6.1%} {leaf}")
PY
  awk -F', ' '{gsub(/ %/,"",$1); s+=$1; n++} END {if (n) printf "gpu util mean %.0f%% over %d samples\n", s/n, n}' "$dir/gpu-util.csv"
done
grep -i 'error\|warn' "$OUT/serve.log" | tail -5
