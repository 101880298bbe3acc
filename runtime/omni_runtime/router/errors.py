"""Errors the router answers itself, as OpenAI-style error JSON with the right status.

One exception type carries the status, the OpenAI `type` and `code`, and a message that says what
happened and what to do; HTTP answers and WebSocket handshake refusals render it the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence


class RouterError(Exception):
    def __init__(
        self,
        *,
        status: int,
        code: str,
        message: str,
        error_type: str = "server_error",
        worker: str | None = None,
        session: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.error_type = error_type
        self.worker = worker  # for logs and metrics: the worker and session the error concerns
        self.session = session

    def body(self) -> bytes:
        payload = {
            "error": {"message": self.message, "type": self.error_type, "param": None, "code": self.code}
        }
        return json.dumps(payload).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body())).encode()),
        ]
        if self.status == 503:
            headers.append((b"retry-after", b"1"))
        if self.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        return headers

    # The errors, one constructor each, so messages stay consistent.

    @classmethod
    def unauthorized(cls) -> RouterError:
        return cls(
            status=401,
            code="invalid_api_key",
            error_type="invalid_request_error",
            message="Missing or invalid API key: send `Authorization: Bearer <key>` with a key "
            "from the router's --api-keys-file.",
        )

    @classmethod
    def admin_forbidden(cls, *, reason: str) -> RouterError:
        return cls(
            status=403,
            code="admin_forbidden",
            error_type="invalid_request_error",
            message=reason,
        )

    @classmethod
    def admin_unauthorized(cls) -> RouterError:
        return cls(
            status=401,
            code="invalid_admin_key",
            error_type="invalid_request_error",
            message="Missing or invalid admin key: the admin API needs `Authorization: Bearer <key>` "
            "with a key from the router's --admin-keys-file (client API keys are not admin keys).",
        )

    @classmethod
    def headers_too_large(cls, *, limit: int) -> RouterError:
        return cls(
            status=431,
            code="request_headers_too_large",
            error_type="invalid_request_error",
            message=f"The request line and headers are larger than the router's limit of {limit} bytes "
            "(--max-header-bytes); send smaller headers.",
        )

    @classmethod
    def session_key_too_long(cls, *, header: str, limit: int) -> RouterError:
        return cls(
            status=431,
            code="session_key_too_long",
            error_type="invalid_request_error",
            message=f"The {header} header is longer than {limit} bytes; use a shorter session key.",
        )

    @classmethod
    def too_large(cls, *, limit: int) -> RouterError:
        return cls(
            status=413,
            code="request_too_large",
            error_type="invalid_request_error",
            message=f"Request body is larger than the router's limit of {limit} bytes "
            "(--max-body-bytes); send a smaller body or raise the limit.",
        )

    @classmethod
    def no_ready_worker(cls, *, known: Sequence[str]) -> RouterError:
        detail = f"known workers: {', '.join(known)}" if known else "the worker table is empty"
        return cls(
            status=503,
            code="no_ready_worker",
            message=f"No worker is ready to take a new session ({detail}); retry shortly.",
        )

    @classmethod
    def all_workers_full(cls, *, limit: int, count: int) -> RouterError:
        return cls(
            status=503,
            code="all_workers_full",
            message=f"All {count} ready workers have {limit} live sessions "
            "(--max-sessions-per-worker); retry shortly.",
        )

    @classmethod
    def session_worker_unavailable(cls, *, session: str, worker_id: str) -> RouterError:
        return cls(
            status=503,
            code="session_worker_unavailable",
            message=f"Session {session} lives on worker {worker_id}, which is gone; start a new session.",
            worker=worker_id,
            session=session,
        )

    @classmethod
    def worker_unreachable(cls, *, worker_id: str, detail: str) -> RouterError:
        return cls(
            status=503,
            code="worker_unreachable",
            message=f"Worker {worker_id} could not be reached ({detail}); retry shortly.",
        )

    @classmethod
    def worker_timeout(cls, *, worker_id: str, seconds: float) -> RouterError:
        return cls(
            status=504,
            code="worker_timeout",
            message=f"Worker {worker_id} sent no response within {seconds:g} s (--upstream-timeout).",
        )

    @classmethod
    def worker_failed(cls, *, worker_id: str, detail: str) -> RouterError:
        return cls(
            status=502,
            code="worker_failed",
            message=f"Worker {worker_id} failed while answering ({detail}); retry the request.",
        )
