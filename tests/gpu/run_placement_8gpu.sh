#!/usr/bin/env bash
# The field's reference placement on 8 GPUs (issue: multi-GPU placement), Qwen2.5-Omni-7B-shaped
# dummy weights, one device call (nvidia-h200-x8, carry .whl):
#   1. serve/   `omni serve` with thinker TP=4 on GPUs 0-3, talker on GPU 4, image encoder TP=2 on
#               GPUs 5-6; nvidia-smi placement check (python -m omni_runtime.entrypoints.gpu_placement);
#               omni bench at c=1,4,16 for text and streaming speech (run_device_bench.sh).
#   2. up/      the same placement started by `omni up -f` from an OmniDeployment; placement check.
#   3. tp/      thinker decode ms/step at TP=1, 2, 4 (bench_thinker_tp.sh).
#   4. cuda-tests.txt  tests/gpu/test_thinker_tp_cuda.py and test_vision_tp_cuda.py.
# Results land in $OUT. Knobs: STEPS (1-4 to run, default "1 2 3 4").
set -uo pipefail
OUT=${OUT:-/tmp/omni-placement}; mkdir -p "$OUT"
STEPS=${STEPS:-"1 2 3 4"}
PLACEMENT="--thinker-tp-size 4 --thinker-gpus 0,1,2,3 --talker-gpu 4 --image-encoder-tp-size 2 --image-encoder-gpus 5,6"
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$OUT/gpus.txt"
status=0
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }

if has 1; then
  mkdir -p "$OUT/serve"
  OUT="$OUT/serve" SERVE_ARGS="$PLACEMENT" PLACEMENT_CHECK=1 BASELINE=0 REALTIME=0 \
    bash tests/gpu/run_device_bench.sh 2>&1 | tee "$OUT/serve/run.txt" || status=1
fi
# run_device_bench.sh installed the wheels into /tmp/site and wrote the dummy checkpoint directory.
export PYTHONPATH=/tmp/site:$PWD/operator:$PWD/runtime PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
  OMNI_CACHE_DIR=/tmp/omni-cache TOKENIZERS_PARALLELISM=false
if has 2; then
  mkdir -p "$OUT/up"
  cat > "$OUT/up/omnideployment.yaml" <<'YAML'
apiVersion: omni.dev/v1alpha1
kind: OmniDeployment
metadata:
  name: qwen25-omni-8gpu
spec:
  model:
    name: qwen2.5-omni-7b-dummy
    path: /tmp/qwen2.5-omni-7b-dummy
    loadFormat: dummy
  runtime:
    type: builtin
  pipeline: streaming-speech
  workers: 1
  stages:
    thinker:
      tensorParallelSize: 4
    imageEncoder:
      tensorParallelSize: 2
      placement: dedicated
  gpu:
    tier: h200
YAML
  python3 -m omni_operator.cli up -f "$OUT/up/omnideployment.yaml" --port 8200 > "$OUT/up/up.log" 2>&1 &
  UP=$!
  for _ in $(seq 1 420); do grep -q "^ready: " "$OUT/up/up.log" 2>/dev/null && break; kill -0 $UP 2>/dev/null || break; sleep 1; done
  grep -E "^(ready|plan|omni up)" "$OUT/up/up.log" | head -20
  # omni up's plan: a CPU api process, the thinker stage (rank 0) and its followers on GPUs 0-3,
  # the talker stage on GPU 4, the image-encoder stage (TP=2) on GPUs 5-6.
  python3 -m omni_runtime.entrypoints.gpu_placement --expect "stage audio_encoder,mm_aggregate,thinker=0" \
    --expect "thinker rank 1=1" --expect "thinker rank 2=2" --expect "thinker rank 3=3" \
    --expect "stage talker,segmenter,talker_stream=4" --expect "image_encoder rank 0=5" \
    --expect "image_encoder rank 1=6" 2>&1 | tee "$OUT/up/placement.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  nvidia-smi > "$OUT/up/nvidia-smi.txt" 2>&1
  kill -INT $UP; wait $UP
fi
if has 3; then
  mkdir -p "$OUT/tp"
  OUT="$OUT/tp" TPS="1 2 4" bash tests/gpu/bench_thinker_tp.sh || status=1
fi
if has 4; then
  # Per-test time limit and the tests' own files (serve logs) under $OUT, so a failure comes back
  # with its reason even when the call's limit stops the run.
  python3 -m pytest -c /dev/null --rootdir . -q -p no:cacheprovider -rA --tb=short --timeout 300 \
    --basetemp "$OUT/t" tests/gpu/test_thinker_tp_cuda.py tests/gpu/test_vision_tp_cuda.py \
    > "$OUT/cuda-tests.txt" 2>&1 || status=1
  tail -5 "$OUT/cuda-tests.txt"
fi
exit $status
