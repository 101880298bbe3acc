"""Route for GET /v1/models."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from omni_runtime.api.model_list.protocol import ModelCard, ModelList, ModelMetadata
from omni_runtime.api.state import get_state

router = APIRouter()
_STARTED = int(time.time())

RANDOM_NOTE = (
    "This checkpoint has RANDOM weights (the tiny test checkpoint or --load-format dummy): the API, "
    "batching and audio path are real, but its text and speech are noise."
)


@router.get("/v1/models")
async def list_models(raw: Request) -> ModelList:
    state = get_state(raw)
    engine, limits = state.engine, state.serving_limits()
    outputs = ["text", "audio"] if engine.supports_audio_output else ["text"]
    metadata = ModelMetadata(
        random_weights=state.random_weights,
        note=RANDOM_NOTE if state.random_weights else "Trained weights loaded from the checkpoint.",
        input_modalities=["text", "image", "audio", "video"],
        output_modalities=outputs,
        output_sample_rate=engine.output_sample_rate if engine.supports_audio_output else None,
        max_model_len=engine.max_model_len,
        max_tokens_limit=limits.max_tokens_limit,
        worker_id=state.settings.worker_id,
        revision=state.settings.revision,
    )
    card = ModelCard(
        id=state.model_name,
        created=_STARTED,
        root=state.settings.model_path,
        max_model_len=engine.max_model_len,
        metadata=metadata,
    )
    return ModelList(data=[card])
