"""Thin route for chat completions: parse (pydantic), hand to the serving class.

A request with ``X-Streaming-Input: true`` (or ``Content-Type: application/x-multipart-streaming``) carries an NDJSON body of input frames, not one JSON
object: `ChatCompletionsRoute` hands it to streaming input (`omni_runtime.api.streaming_input`)
before the body is parsed as a `ChatCompletionRequest`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from omni_runtime.api.chat.protocol import ChatCompletionRequest, ChatCompletionResponse
from omni_runtime.api.chat.serving import ChatServing
from omni_runtime.api.errors import error_responses
from omni_runtime.api.state import get_state
from omni_runtime.api.streaming_input import routes as streaming_input


class ChatCompletionsRoute(APIRoute):
    """The chat route, with streaming-input requests (Mode A) handed to streaming input."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        parse_and_serve = super().get_route_handler()

        async def handler(request: Request) -> Response:
            if streaming_input.is_streaming_input(request):
                return await streaming_input.chat_completion(request)
            return await parse_and_serve(request)

        return handler


router = APIRouter(route_class=ChatCompletionsRoute)

_RESPONSES: dict[int | str, dict[str, Any]] = {
    **error_responses(400, 404, 413, 500, 503),
    200: {
        "description": "A chat completion (JSON), or with stream=true chat.completion.chunk events (SSE)",
        "model": ChatCompletionResponse,
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
}


@router.post("/v1/chat/completions", response_model=None, responses=_RESPONSES)
async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    return await ChatServing(get_state(raw)).create(body, raw)
