"""Thin route for chat completions: parse (pydantic), hand to the serving class."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from omni_runtime.api.chat.protocol import ChatCompletionRequest
from omni_runtime.api.chat.serving import ChatServing
from omni_runtime.api.errors import ErrorResponse
from omni_runtime.api.state import get_state

router = APIRouter()

_ERRORS = {status: {"model": ErrorResponse} for status in (400, 404, 413, 500, 503)}


@router.post("/v1/chat/completions", responses=_ERRORS)  # type: ignore[arg-type]
async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    return await ChatServing(get_state(raw)).create(body, raw)
