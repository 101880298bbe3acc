"""Request bodies of streaming-input HTTP: bounded reads, JSON bodies and Mode A's NDJSON frames.

Bodies are read piece by piece and refused (413) as soon as they pass what one session may carry,
before they are held whole. Faults are `ProtocolError`s with the field they concern (``param``);
the routes render them through `omni_runtime.api.errors`.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from omni_runtime.realtime.errors import INVALID_JSON, PAYLOAD_TOO_LARGE, ProtocolError, invalid
from omni_runtime.realtime.settings import RealtimeSettings
from omni_runtime.realtime.streaming_input.manager import StreamingInputManager
from omni_runtime.realtime.streaming_input.models import Chunk, StreamingInputParams
from omni_runtime.realtime.streaming_input.session import StreamingInputSession

# A Mode A line with any of these is a chunk (modality is optional); one with none, request parameters.
_CHUNK_FIELDS = frozenset({"modality", "payload", "text", "end_of_input", "sequence_id", "offset"})
_BODY_OVERHEAD = 64 * 1024  # JSON around a payload whose base64 is 4/3 of its bytes


def body_limit(settings: RealtimeSettings) -> int:
    """The most bytes a request body may hold: one session's payload cap, as base64 in JSON."""
    return settings.max_payload_per_session * 4 // 3 + _BODY_OVERHEAD


def _too_large(limit: int) -> ProtocolError:
    return ProtocolError(
        f"the request body passes {limit} bytes, more than one session may carry",
        code=PAYLOAD_TOO_LARGE,
        status=413,
    )


def _validation(exc: ValidationError, *, prefix: str = "") -> ProtocolError:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    return invalid(f"{prefix}{field}" if field else prefix.rstrip(".") or "body", first["msg"])


async def read_body(request: Request, *, limit: int) -> bytes:
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def parse_body(model: type[BaseModel], raw: bytes, *, prefix: str = "") -> Any:
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to parse
        raise ProtocolError(f"the body is not valid JSON: {exc}", code=INVALID_JSON) from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation(exc, prefix=prefix) from exc


async def feed_ndjson(
    request: Request, *, manager: StreamingInputManager
) -> tuple[StreamingInputSession, StreamingInputParams]:
    """Mode A: a session fed from the NDJSON body, line by line as it arrives (an optional first
    line of request parameters, then chunk lines; line order is the sequence order unless lines
    carry offsets). Each chunk goes into the session as its line arrives, so the start policy's
    early work runs while the body is still uploading."""
    session: StreamingInputSession | None = None
    params = StreamingInputParams.model_validate({})
    pending = b""
    line_no = 0
    chunks = 0
    total = 0
    limit = body_limit(manager.settings)

    async def handle(line: bytes) -> None:
        nonlocal session, params, chunks
        try:
            frame = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to parse
            raise ProtocolError(f"line {line_no} is not valid JSON: {exc}", code=INVALID_JSON) from exc
        if not isinstance(frame, dict):
            raise invalid(f"line {line_no}", "each line is a JSON object")
        if not _CHUNK_FIELDS & frame.keys():
            if session is not None:
                raise invalid(f"line {line_no}", "request parameters must come before the first chunk")
            try:
                params = StreamingInputParams.model_validate(frame)
            except ValidationError as exc:
                raise _validation(exc) from exc
            session = manager.create(params)
            return
        if session is None:
            session = manager.create(params)
        if "offset" not in frame:
            frame.setdefault("sequence_id", chunks)
        chunks += 1
        try:
            chunk = Chunk.model_validate(frame)
        except ValidationError as exc:
            raise _validation(exc, prefix=f"line {line_no}.") from exc
        await session.add_chunk(chunk)

    try:
        async for piece in request.stream():
            total += len(piece)
            if total > limit:
                raise _too_large(limit)
            pending += piece
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    line_no += 1
                    await handle(line)
        if pending.strip():
            line_no += 1
            await handle(pending)
    except ProtocolError:
        if session is not None:
            await manager.remove(session.id)
        raise
    if session is None:
        raise invalid("body", "the NDJSON body holds no input frames")
    return session, params
