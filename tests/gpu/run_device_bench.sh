#!/usr/bin/env bash
# GPU benchmark run (issue: runtime performance). Runs on the device machine from the repo root:
# installs the carried wheels, serves Qwen2.5-Omni-7B-shaped dummy weights with `omni serve`,
# runs `omni bench` for text and streaming speech at c=1,4,16, then the plain HF `generate`
# baseline on the same GPU. Results land in $OUT. SERVE_ARGS adds omni serve flags (placement over
# several GPUs); PLACEMENT_CHECK=1 then checks with nvidia-smi that each process sits where they say.
# Speech rows are what a listener hears (TTFA p50/p95/p99, stall per stream, RTF, streams in real
# time, audio s/s): closed loop at SPEECH_LEVELS, open loop at SPEECH_RATES (arrivals/s, Poisson,
# SPEECH_DURATION s each) when set; speech-vs-hf/ puts them next to the HF rows of the same run.
# HF_SPEECH_LEVELS sets the HF baseline's speech levels (default SPEECH_LEVELS, else 1,4).
# MAX_SPEECH_STREAMS is the worker's admission limit (default 0: none, so the bench sees the
# worker past its capacity; set it to see the 429s instead).
# AFTER_READY runs a command once the server is ready (SERVER holds its pid).
# Carry .whl (`bash tests/gpu/wheels.sh` writes it): the device lacks the API's packages.
set -uo pipefail
OUT=${OUT:-/tmp/omni-bench}; mkdir -p "$OUT"
rm -rf /tmp/site
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/operator:$PWD/runtime
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMNI_CACHE_DIR=/tmp/omni-cache TOKENIZERS_PARALLELISM=false
OMNI_CLI="python3 -m omni_operator.cli"
PIPELINE=${PIPELINE:-streaming-speech}
TEXT_TOKENS=${TEXT_TOKENS:-128}
LEVELS=${LEVELS:-1,4,16}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/gpu.txt"

# A checkpoint directory without weights: the released config (tokenizer and processor files
# from the tiny checkpoint); --load-format dummy builds it at full size with random weights.
# FAMILY=qwen3_omni_moe serves Qwen3-Omni-30B-A3B's shape instead of Qwen2.5-Omni-7B's.
FAMILY=${FAMILY:-qwen2_5_omni}
if [ "$FAMILY" = qwen3_omni_moe ]; then
  DUMMY=/tmp/qwen3-omni-30b-a3b-dummy
  MODEL_NAME=qwen3-omni-30b-a3b-dummy
else
  DUMMY=/tmp/qwen2.5-omni-7b-dummy
  MODEL_NAME=qwen2.5-omni-7b-dummy
fi
$OMNI_CLI tiny-checkpoint --family "$FAMILY" --shape released --force "$DUMMY" > /dev/null || exit 1
# Codec tokens per speech reply: Qwen2.5's talker makes 50 per second of audio, Qwen3's 12.5.
TALKER_TOKENS=${TALKER_TOKENS:-400}
if [ "${RUN_OMNI:-1}" = 1 ]; then
$OMNI_CLI serve --model-path "$DUMMY" --load-format dummy --device cuda --pipeline "$PIPELINE" --model-name "$MODEL_NAME" \
  --port 8000 --max-batch-size 32 --max-speech-streams "${MAX_SPEECH_STREAMS:-0}" ${SERVE_ARGS:-} > "$OUT/serve.log" 2>&1 &
SERVER=$!
launched=$SECONDS
for _ in $(seq 1 420); do
  curl -sf localhost:8000/ready >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "server died"; tail -50 "$OUT/serve.log"; exit 1; }
  sleep 1
done
curl -sf localhost:8000/ready >/dev/null || { echo "server not ready"; tail -50 "$OUT/serve.log"; exit 1; }
echo "server ready in $((SECONDS - launched)) s"; grep -i "ready\|loaded" "$OUT/serve.log" | tail -3
if [ -n "${AFTER_READY:-}" ]; then  # e.g. tests/gpu/profile_speech.sh's levels, against this server
  SERVER=$SERVER OUT=$OUT bash -c "$AFTER_READY"
fi
if [ "${PLACEMENT_CHECK:-0}" = 1 ]; then  # each process on the GPUs its flags name (nvidia-smi)
  python3 -m omni_runtime.entrypoints.gpu_placement -- --pipeline "$PIPELINE" ${SERVE_ARGS:-} 2>&1 | tee "$OUT/placement.txt"
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
fi

if [ "${TEXT:-1}" = 1 ]; then
  $OMNI_CLI bench --url http://127.0.0.1:8000 --concurrency "$LEVELS" --mode text --stream \
    --max-tokens "$TEXT_TOKENS" --out "$OUT/text" --label omni-text 2>&1 | tail -20
fi
if [ "$PIPELINE" != text ] && [ "${SPEECH:-1}" = 1 ]; then
  # SPEECH_WAVES=N: N x concurrency requests per level; else SPEECH_REQUESTS (8) per level.
  if [ -n "${SPEECH_WAVES:-}" ]; then SPEECH_COUNT=(--waves "$SPEECH_WAVES"); else SPEECH_COUNT=(--requests "${SPEECH_REQUESTS:-8}"); fi
  $OMNI_CLI bench --url http://127.0.0.1:8000 --concurrency "${SPEECH_LEVELS:-$LEVELS}" --mode speech --stream \
    "${SPEECH_COUNT[@]}" \
    --max-tokens 64 --out "$OUT/speech" --label omni-speech \
    --extra-body "{\"stage_params\": {\"talker\": {\"max_tokens\": $TALKER_TOKENS}}}" 2>&1 | tail -20
  if [ -n "${SPEECH_RATES:-}" ]; then  # open loop: a steady state instead of one wave
    $OMNI_CLI bench --url http://127.0.0.1:8000 --rate "$SPEECH_RATES" --duration "${SPEECH_DURATION:-60}" \
      --mode speech --stream --max-tokens 64 --out "$OUT/speech-open" --label omni-speech \
      --extra-body "{\"stage_params\": {\"talker\": {\"max_tokens\": $TALKER_TOKENS}}}" 2>&1 | tail -20
  fi
fi
if [ "${REALTIME:-1}" = 1 ]; then
  # RT_TURNS turns per session (the by_turn rows show turn 1 vs turn N); RT_LABEL names the file;
  # RT_LEVELS the concurrent sessions per round (1,8,8: eight sessions twice, first time vs again);
  # RT_ARGS more of realtime_latency's flags (e.g. "--paced --speech-seconds 4.5").
  timeout "${RT_TIMEOUT:-120}" python3 -m omni_runtime.bench.realtime_latency --url ws://127.0.0.1:8000/v1/realtime \
    --concurrency "${RT_LEVELS:-1,8}" --turns "${RT_TURNS:-2}" --turn commit ${RT_ARGS:-} 2>&1 | tail -"${RT_LINES:-8}" | tee "$OUT/realtime${RT_LABEL:-}.txt"
fi
# What the worker counted over the whole run: stage busy time, GPU memory and allocator retries.
curl -sf localhost:8000/metrics | grep -E "^omni_(stage_busy|stage_calls|gpu_|session_kv)" > "$OUT/metrics.txt"
grep omni_gpu_ "$OUT/metrics.txt"
kill $SERVER; sleep 5; kill -9 $SERVER 2>/dev/null
tail -5 "$OUT/serve.log"
fi
if [ "${BASELINE:-1}" = 1 ]; then  # 64 text + TALKER_TOKENS codec tokens, as the speech rows above
  HF_TEXT=(); [ "${TEXT:-1}" = 1 ] || HF_TEXT=(--no-text)  # no omni text rows: no HF text rows either
  python3 -m omni_runtime.bench.hf_baseline --family "$FAMILY" --concurrency "$LEVELS" --max-tokens "$TEXT_TOKENS" \
    --speech --speech-concurrency "${HF_SPEECH_LEVELS:-${SPEECH_LEVELS:-1,4}}" --talker-tokens "$TALKER_TOKENS" \
    "${HF_TEXT[@]}" --out "$OUT/hf.json" 2>&1 | grep -v Warning | tail -12
fi
SPEECH_FILES=$(ls "$OUT"/speech/bench.json "$OUT"/speech-open/bench.json "$OUT"/hf.json 2>/dev/null)
if [ -n "$SPEECH_FILES" ]; then  # one table: omni's speech rows and HF's, same run, same GPU
  python3 -m omni_runtime.bench.combine --speech $SPEECH_FILES --out "$OUT/speech-vs-hf" \
    --title "speech: 64 text + $TALKER_TOKENS codec tokens per reply" 2>&1 | tee "$OUT/speech-vs-hf.txt"
fi
