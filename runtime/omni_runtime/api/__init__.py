"""The worker's OpenAI-compatible HTTP API (FastAPI; no torch or transformers here).

`build_app(engine=..., settings=...)` assembles the app; per-feature packages hold protocol
models, serving classes and thin routes (`chat/`, `model_list/`, `ops/`, `streaming_input/`).
"""

from omni_runtime.api.app import build_app
from omni_runtime.api.settings import ApiSettings

__all__ = ["ApiSettings", "build_app"]
