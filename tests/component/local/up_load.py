"""Steady client load through the router for rollout tests, with every outcome recorded.

Two kinds of clients run in threads until told to stop:
- long sessions: streamed chat completions (SSE), each a few seconds long and one connection,
  bound by the router to the least-loaded worker (no session key), so every worker in rotation
  holds one most of the time; every chunk carries the serving worker's revision
  (`system_fingerprint`), so a session that changed revision mid-stream would show two;
- steady HTTP: short non-streamed completions in a loop, each with its own session key.
The official `openai` client is used with retries off, so a failure is never hidden by a retry.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import openai


@dataclass
class Outcome:
    kind: str  # "session" (SSE stream) or "request"
    key: str
    started: float
    ended: float = 0.0
    revisions: tuple[str, ...] = ()  # distinct revisions seen, in order
    chunks: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_reason is not None


@dataclass
class Load:
    base_url: str
    sessions: int = 3  # concurrent long sessions
    requesters: int = 1  # concurrent steady HTTP clients
    session_tokens: int = 400
    request_pause_s: float = 0.2
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=120)

    def _record(self, outcome: Outcome) -> None:
        outcome.ended = time.monotonic()
        with self._lock:
            self.outcomes.append(outcome)

    def _session_loop(self, slot: int) -> None:
        client = self._client()
        n = 0
        while not self._stop.is_set():
            key = f"session-{slot}-{n}"
            n += 1
            outcome = Outcome(kind="session", key=key, started=time.monotonic())
            seen: list[str] = []
            try:
                stream = client.chat.completions.create(
                    model="tiny-omni",
                    messages=[{"role": "user", "content": f"Tell me a long story number {n}."}],
                    max_tokens=self.session_tokens,
                    stream=True,
                    # random weights may draw EOS early; a session must outlive the drain it spans
                    extra_body={"ignore_eos": True},
                )
                for chunk in stream:
                    outcome.chunks += 1
                    if chunk.system_fingerprint and (not seen or seen[-1] != chunk.system_fingerprint):
                        seen.append(chunk.system_fingerprint)
                    if chunk.choices and chunk.choices[0].finish_reason:
                        outcome.finish_reason = chunk.choices[0].finish_reason
            except openai.OpenAIError as exc:
                outcome.error = f"{type(exc).__name__}: {exc}"
            outcome.revisions = tuple(seen)
            self._record(outcome)

    def _request_loop(self, slot: int) -> None:
        client = self._client()
        n = 0
        while not self._stop.is_set():
            key = f"request-{slot}-{n}"
            n += 1
            outcome = Outcome(kind="request", key=key, started=time.monotonic())
            try:
                completion = client.chat.completions.create(
                    model="tiny-omni",
                    messages=[{"role": "user", "content": "Hello!"}],
                    max_tokens=8,
                    extra_headers={"X-Session-Id": key},
                )
                outcome.chunks = 1
                outcome.finish_reason = completion.choices[0].finish_reason
                outcome.revisions = (completion.system_fingerprint or "",)
            except openai.OpenAIError as exc:
                outcome.error = f"{type(exc).__name__}: {exc}"
            self._record(outcome)
            self._stop.wait(self.request_pause_s)

    def start(self) -> None:
        for slot in range(self.sessions):
            self._threads.append(threading.Thread(target=self._session_loop, args=(slot,), daemon=True))
        for slot in range(self.requesters):
            self._threads.append(threading.Thread(target=self._request_loop, args=(slot,), daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self, *, timeout: float = 180.0) -> None:
        """Stop starting new work and wait for what is in flight to finish."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=timeout)
        assert not any(thread.is_alive() for thread in self._threads), "load threads did not finish"

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)
