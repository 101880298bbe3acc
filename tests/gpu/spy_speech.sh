#!/usr/bin/env bash
# Where the serving process and the bench client spend their CPU during one speech level (run by
# run_device_bench.sh's AFTER_READY, which sets SERVER and OUT). py-spy (a carried wheel) samples
# both processes without pausing them while `omni bench` runs SPY_LEVEL streams for SPY_WAVES
# waves; collapsed stacks per thread land in $OUT/spy/{server,client}.txt, the level's rows in
# $OUT/spy/bench. Summarise with tests/gpu/spy_top.py.
set -uo pipefail
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
mkdir -p "$OUT/spy"
LEVEL=${SPY_LEVEL:-32}
python3 -m omni_operator.cli bench --url http://127.0.0.1:8000 --concurrency "$LEVEL" --mode speech --stream \
  --waves "${SPY_WAVES:-2}" --max-tokens 64 --out "$OUT/spy/bench" --label "spy-c$LEVEL" \
  --extra-body "{\"stage_params\": {\"talker\": {\"max_tokens\": ${TALKER_TOKENS:-400}}}}" > "$OUT/spy/bench.log" 2>&1 &
CLIENT=$!
sleep 0.3
"$SPY" record --nonblocking --threads -r 200 -d "${SPY_SECONDS:-10}" -f raw -o "$OUT/spy/server.txt" --pid "$SERVER" > "$OUT/spy/server.log" 2>&1 &
"$SPY" record --nonblocking --threads -r 200 -d "${SPY_SECONDS:-10}" -f raw -o "$OUT/spy/client.txt" --pid "$CLIENT" > "$OUT/spy/client.log" 2>&1 &
wait
tail -6 "$OUT/spy/bench.log"
