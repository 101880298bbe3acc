"""One error model for the whole API: OpenAI error JSON with the right HTTP status.

Client mistakes arrive as typed exceptions (`ApiError`, pydantic's `RequestValidationError`,
`MediaError`, `EngineError`, Starlette's `HTTPException`, and the realtime layer's `ProtocolError`
from streaming-input sessions) and each maps to
``{"error": {"message", "type", "param", "code"}}`` with its own status. Anything else is a fault of
the worker: a 500 with a generic message, logged with its traceback, never shown to the client.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from omni_runtime.contract.engine import EngineError
from omni_runtime.media.errors import MediaError
from omni_runtime.realtime.errors import ProtocolError

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
SERVICE_UNAVAILABLE = "service_unavailable_error"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for a route: each status with the OpenAI error JSON body."""
    return {
        status: {"model": ErrorResponse, "description": _DESCRIPTIONS.get(status, "Error")}
        for status in statuses
    }


_DESCRIPTIONS = {
    400: "Invalid request",
    404: "Not found",
    409: "Conflict with the session's state",
    413: "Request too large",
    429: "Too many sessions",
    499: "Client closed the request",
    500: "Worker fault",
    503: "Not ready",
}


class ApiError(Exception):
    """A request the API refuses, with everything the OpenAI error JSON needs."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,  # e.g. Retry-After on a 429
    ) -> None:
        super().__init__(message)
        self.detail = ErrorDetail(message=message, type=type, param=param, code=code)
        self.status = status
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(
            ErrorResponse(error=self.detail).model_dump(), status_code=self.status, headers=self.headers
        )


def error_type_for(status: int) -> str:
    if status == 503:
        return SERVICE_UNAVAILABLE
    return SERVER_ERROR if status >= 500 else INVALID_REQUEST


def from_media_error(exc: MediaError) -> ApiError:
    message = f"{exc.param}: {exc.message}" if exc.param else exc.message
    return ApiError(message, status=exc.status, param=exc.param, code=exc.code)


def from_engine_error(exc: EngineError) -> ApiError:
    # Engine faults stay generic; refusals of the client's request (4xx) say what was wrong.
    if exc.status >= 500:
        log.error("engine error: %s", exc)
        return internal_error()
    return ApiError(str(exc), status=exc.status, param=exc.param, code=getattr(exc, "code", None))


def from_protocol_error(exc: ProtocolError, *, headers: dict[str, str] | None = None) -> ApiError:
    """A session layer refusal (streaming input, speech capacity): its message, status, type, param
    and code as they are."""
    return ApiError(
        exc.message, status=exc.status, type=exc.type, param=exc.param, code=exc.code, headers=headers
    )


def internal_error(request_id: str | None = None) -> ApiError:
    where = f" (request {request_id})" if request_id else ""
    return ApiError(
        f"The worker failed while serving this request{where}; the details are in its log.",
        status=500,
        type=SERVER_ERROR,
        code="internal_error",
    )


# --- pydantic validation errors -> one 400 with the field path as ``param`` -------------------

# Segments pydantic adds for union members ("str", "list[...]") are not field names.
_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "bytes"}
_TYPE_ERRORS_SUFFIXES = ("_type", "_parsing")
_LOCATIONS = {"body", "query", "path", "header"}  # where FastAPI found the value, not a field name


def _is_type_tag(segment: str) -> bool:
    return segment in _TYPE_TAGS or not segment.replace("_", "a").isalnum()


def field_path(loc: Sequence[int | str]) -> str:
    """``("body", "messages", 0, "content", "list[...]", 1, "image_url")`` -> ``messages[0].content[1].image_url``;
    ``("query", "wait")`` -> ``wait``."""
    path = ""
    for segment in loc:
        if isinstance(segment, int):
            path += f"[{segment}]"
        elif segment in _LOCATIONS and not path:
            continue
        elif not _is_type_tag(segment):
            path += f".{segment}" if path else segment
    return path


def _code_for(error_type: str) -> str:
    if error_type == "missing":
        return "missing_required_parameter"
    if error_type == "json_invalid":
        return "invalid_json"
    if error_type.endswith(_TYPE_ERRORS_SUFFIXES) or error_type in {
        "model_attributes_type",
        "int_from_float",
    }:
        return "invalid_type"
    return "invalid_value"


def _message_of(error: dict[str, Any]) -> str:
    message = str(error.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if error.get("type") == "union_tag_invalid":
        # Our discriminated unions tag members "type=<value>" so tags never look like field names.
        ctx = error.get("ctx") or {}
        tag = str(ctx.get("tag", "")).removeprefix("type=")
        expected = str(ctx.get("expected_tags", "")).replace("'type=", "'")
        message = f"unknown type '{tag}'; expected one of {expected}"
    elif error.get("type") == "union_tag_not_found":
        message = 'the item has no "type" field saying what it is'
    return message


def from_validation_errors(errors: Sequence[Any]) -> ApiError:
    """The first offending field of a validation failure, with every reason pydantic gave for it."""
    if not errors:
        return ApiError("The request is invalid.", code="invalid_value")
    # A union reports one error per member; when one member got deeper into the input, the
    # input was meant for it, so the shallow "not a string" errors of the others are noise.
    deepest = [e for e in errors if not (e.get("loc") and _is_type_tag(str(e["loc"][-1])))] or list(errors)
    first = deepest[0]
    if first.get("type") == "json_invalid":
        return ApiError(
            f"The request body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}.",
            code="invalid_json",
        )
    param = field_path(first.get("loc", ()))
    reasons: list[str] = []
    for error in deepest:
        if field_path(error.get("loc", ())) == param and _message_of(error) not in reasons:
            reasons.append(_message_of(error))
    code = _code_for(str(first.get("type", "")))
    if not param:
        return ApiError(f"The request body must be a JSON object: {'; or '.join(reasons)}.", code=code)
    if code == "missing_required_parameter":
        return ApiError(f"Missing required parameter: '{param}'.", param=param, code=code)
    return ApiError(f"Invalid value for '{param}': {'; or '.join(reasons)}.", param=param, code=code)


def document_errors_as_served(app: FastAPI) -> None:
    """FastAPI documents a 422 for every route with parameters; this API answers 400 instead
    (`from_validation_errors`), so the OpenAPI document drops the 422s and their schemas."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            for operations in doc.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = doc.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_error_handlers(app: FastAPI) -> None:
    """Replace FastAPI's 422 and Starlette's plain-text errors with OpenAI error JSON."""

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return from_validation_errors(exc.errors()).response()

    async def on_media(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, MediaError)
        return from_media_error(exc).response()

    async def on_engine(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, EngineError)
        return from_engine_error(exc).response()

    async def on_protocol(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProtocolError)
        return from_protocol_error(exc).response()

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = str(exc.detail)
        if exc.status_code == 400 and message == "There was an error parsing the body":  # FastAPI's own
            message = (
                "The request body could not be parsed as JSON (not JSON, or nested too deep); send one JSON "
                'object, such as {"model": ..., "messages": [...]}.'
            )
            code = "invalid_json"
        if exc.status_code in (404, 405):
            message = (
                f"No route for {request.method} {request.url.path}; this worker serves POST /v1/chat/completions, "
                "GET /v1/models, GET /health, GET /ready and GET /metrics."
            )
        return ApiError(
            message, status=exc.status_code, type=error_type_for(exc.status_code), code=code
        ).response()

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Reached only by bugs: Starlette's ServerErrorMiddleware calls this, then re-raises so
        # the server logs the traceback. The client sees a generic message.
        log.error("unhandled error serving %s %s", request.method, request.url.path, exc_info=exc)
        return internal_error().response()

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(MediaError, on_media)
    app.add_exception_handler(EngineError, on_engine)
    app.add_exception_handler(ProtocolError, on_protocol)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
