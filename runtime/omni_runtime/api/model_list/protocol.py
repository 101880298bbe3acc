"""Model card models (OpenAI's list shape plus the omni metadata a client needs)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ModelMetadata(BaseModel):
    random_weights: bool
    note: str
    input_modalities: list[str]
    output_modalities: list[str]
    output_sample_rate: int | None
    max_model_len: int
    max_tokens_limit: int
    worker_id: str
    revision: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "omni"
    root: str | None = None
    max_model_len: int
    metadata: ModelMetadata


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
