"""Protocol errors a client can cause on a realtime socket or a streaming-input session.

A `ProtocolError` carries a stable ``code`` (clients and tests match on it), the field it concerns
(``param``) and, for HTTP, the status to answer with. On a socket it becomes an ``error`` event and
the session goes on; over HTTP the api layer renders it as OpenAI error JSON
(`omni_runtime.api.errors.from_protocol_error`).
"""

from __future__ import annotations

from typing import Any

# Stable codes. Where the OpenAI Realtime API has a code for the same fault we use its spelling.
INVALID_JSON = "invalid_json"
INVALID_EVENT = "invalid_event"  # not a JSON object, or no "type"
UNKNOWN_EVENT = "unknown_event_type"
INVALID_VALUE = "invalid_value"
MISSING_FIELD = "missing_required_parameter"
INVALID_BASE64 = "invalid_base64"
INVALID_AUDIO = "invalid_audio"
EVENT_TOO_LARGE = "event_too_large"
BUFFER_FULL = "input_audio_buffer_full"
COMMIT_EMPTY = "input_audio_buffer_commit_empty"
ITEM_NOT_FOUND = "item_not_found"
ITEM_LIMIT = "conversation_item_limit"
RESPONSE_ACTIVE = "conversation_already_has_active_response"
NO_ACTIVE_RESPONSE = "response_cancel_not_active"
UNSUPPORTED_MODALITY = "unsupported_modality"
SESSION_LIMIT = "session_limit_reached"
SESSION_EXPIRED = "session_expired"
SESSION_NOT_FOUND = "session_not_found"
SESSION_FINISHED = "session_finished"
SEQUENCE_OUT_OF_WINDOW = "sequence_id_out_of_window"
PROMPT_TOO_LONG = "prompt_too_long"
TOO_MANY_MESSAGES = "too_many_messages"
INPUT_NOT_FINISHED = "input_not_finished"
PAYLOAD_TOO_LARGE = "payload_too_large"
VIDEO_BUFFER_FULL = "video_buffer_full"
AUDIO_BUFFER_FULL = "audio_buffer_full"
NO_FRAMES = "no_frames"
INVALID_MEDIA = "invalid_media"
ENGINE_ERROR = "engine_error"
NOT_READY = "not_ready"
DISABLED = "streaming_input_disabled"

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class ProtocolError(Exception):
    """A client mistake, answered with an ``error`` event (sockets) or error JSON (HTTP)."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        param: str | None = None,
        status: int = 400,
        type: str = INVALID_REQUEST,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.status = status
        self.type = type

    def error_body(self, *, event_id: str | None = None) -> dict[str, Any]:
        """The ``error`` object of an error event or of OpenAI error JSON."""
        body: dict[str, Any] = {
            "type": self.type,
            "code": self.code,
            "message": self.message,
            "param": self.param,
        }
        if event_id is not None:
            body["event_id"] = event_id
        return body


def missing(field: str, *, where: str) -> ProtocolError:
    return ProtocolError(f"{where} needs the field '{field}'", code=MISSING_FIELD, param=field)


def invalid(field: str, message: str) -> ProtocolError:
    return ProtocolError(f"{field}: {message}", code=INVALID_VALUE, param=field)
