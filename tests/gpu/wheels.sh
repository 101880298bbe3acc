#!/usr/bin/env bash
# The wheels a device call carries (`carry: [".whl"]`): what the device's Python 3.12 lacks for
# `omni serve`, `omni bench` and the GPU scripts, at the versions uv.lock pins. The device has
# torch, numpy, tokenizers, safetensors and huggingface_hub, and no network; every script under
# tests/gpu installs .whl/*.whl into /tmp/site first. Run here (it needs the package index):
#
#     bash tests/gpu/wheels.sh          # writes .whl/ (ignored by git through .git/info/exclude)
#
# PyAV (35 MB) is left out to stay under the 64 MiB a call carries: video requests need it, the
# benches do not. Missing one of these cost a whole device call before (soundfile needs cffi).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.whl}
PACKAGES=(
  transformers fastapi starlette uvicorn httptools websockets prometheus-client soundfile cffi pycparser
  silero-vad opentelemetry-api httpx httpcore h11 anyio pydantic pydantic-core typing-inspection
  annotated-types annotated-doc uvloop openai jiter distro
)
pins=$(python3 - "${PACKAGES[@]}" <<'PY'
import sys, tomllib
lock = {p["name"]: p["version"] for p in tomllib.load(open("uv.lock", "rb"))["package"]}
print(" ".join(f"{name}=={lock[name]}" if name in lock else name for name in sys.argv[1:]))
PY
)
mkdir -p "$DEST"
grep -qxF "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
# shellcheck disable=SC2086  # one word per pin
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$DEST" $pins py-spy
du -sh "$DEST"
