"""The load generator: chat requests timed as a client sees them, in a closed or an open loop.

Closed loop (`run_level`): N requests with a fixed number in flight. Open loop (`run_open_loop`):
requests arrive as a Poisson process at a given rate for a given time, whatever the server's pace,
so a level shows a steady state instead of one wave.

Every request asks for exactly ``max_tokens`` tokens (``ignore_eos``), and a speech request given a
talker budget (``--extra-body '{"stage_params": {"talker": {"max_tokens": 400}}}'``) for exactly
that many codes (``stage_params.talker.ignore_eos``), so levels and A/B sides compare equal work.
Without a budget the talker ends where it ends (the model's default budget is minutes of audio).

Streaming requests time the first text delta and every audio delta: each delta is a small WAV file
(or raw 16-bit PCM), so its arrival and its duration give the stream's audio timeline
(`omni_runtime.bench.playback` plays it back). Non-streaming replies carry all audio at once, so
first token, first audio and latency coincide.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import random
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

import httpx

from omni_runtime.bench.stats import Chunk, RequestSample

PROMPT = "Tell me a long story about a lighthouse keeper and the sea, in many short sentences."


@dataclass(frozen=True)
class LoadSpec:
    url: str  # base URL of a worker or router
    model: str
    mode: str  # text | speech
    stream: bool
    max_tokens: int
    timeout_s: float = 600.0
    extra_body: dict[str, object] | None = None  # merged into every request (e.g. stage_params)
    pcm_rate: int = 24000  # sample rate of raw pcm16 deltas (WAV deltas carry their own)


def audio_seconds(data: str, *, pcm_rate: int) -> float:
    """Seconds of audio in one base64 delta: a WAV file (its header says), else 16-bit mono PCM."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"audio delta is not base64: {exc}") from exc
    if raw[:4] == b"RIFF":
        try:
            with wave.open(io.BytesIO(raw)) as wav:
                return wav.getnframes() / wav.getframerate()
        except (wave.Error, EOFError) as exc:
            raise ValueError(f"audio delta is not a readable WAV file: {exc}") from exc
    return len(raw) / 2 / pcm_rate


def request_body(spec: LoadSpec) -> dict[str, object]:
    body: dict[str, object] = {
        "model": spec.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": spec.max_tokens,
        "ignore_eos": True,  # fixed output length (maps to SamplingParams.ignore_eos)
        "temperature": 0.0,
        "stream": spec.stream,
    }
    stage_params: dict[str, dict[str, object]] = {}
    extra = dict(spec.extra_body or {})
    extra_stages = cast(dict[str, dict[str, object]], extra.pop("stage_params", None) or {})
    if spec.mode == "speech":
        body["modalities"] = ["text", "audio"]
        body["audio"] = {"format": "wav"}
        if "max_tokens" in extra_stages.get("talker", {}):  # a talker budget: spoken whole, every reply
            stage_params["talker"] = {"ignore_eos": True}
    for stage, params in extra_stages.items():  # merged per stage
        stage_params[stage] = {**stage_params.get(stage, {}), **params}
    body.update(extra)
    if stage_params:
        body["stage_params"] = stage_params
    return body


async def _one_streaming(client: httpx.AsyncClient, spec: LoadSpec) -> RequestSample:
    began = time.perf_counter()
    ttft = ttfa = last_text = None
    deltas = chunks = tokens = 0
    audio: list[Chunk] = []
    async with client.stream("POST", "/v1/chat/completions", json=request_body(spec)) as response:
        if response.status_code != 200:
            body = (await response.aread()).decode(errors="replace")
            return RequestSample(
                ok=False,
                latency_s=time.perf_counter() - began,
                error=f"HTTP {response.status_code}: {body[:300]}",
                status=response.status_code,
            )
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                return RequestSample(
                    ok=False, latency_s=time.perf_counter() - began, error=str(event["error"])
                )
            now = time.perf_counter() - began
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    deltas += 1
                    ttft = now if ttft is None else ttft
                    last_text = now
                if payload := (delta.get("audio") or {}).get("data"):
                    chunks += 1
                    ttfa = now if ttfa is None else ttfa
                    audio.append(Chunk(now, audio_seconds(payload, pcm_rate=spec.pcm_rate)))
            if event.get("usage"):
                tokens = int(event["usage"].get("completion_tokens") or 0)
    return RequestSample(
        ok=True,
        latency_s=time.perf_counter() - began,
        ttft_s=ttft,
        last_text_s=last_text,
        ttfa_s=ttfa,
        output_tokens=tokens or deltas,
        text_deltas=deltas,
        audio_chunks=chunks,
        audio=tuple(audio),
    )


async def _one_complete(client: httpx.AsyncClient, spec: LoadSpec) -> RequestSample:
    began = time.perf_counter()
    response = await client.post("/v1/chat/completions", json=request_body(spec))
    latency = time.perf_counter() - began
    if response.status_code != 200:
        return RequestSample(
            ok=False,
            latency_s=latency,
            error=f"HTTP {response.status_code}: {response.text[:300]}",
            status=response.status_code,
        )
    body = response.json()
    message = body["choices"][0]["message"]
    data = (message.get("audio") or {}).get("data")
    has_audio = bool(data)
    return RequestSample(
        ok=True,
        latency_s=latency,
        ttft_s=latency,
        ttfa_s=latency if has_audio else None,
        output_tokens=int(body.get("usage", {}).get("completion_tokens") or 0),
        audio_chunks=1 if has_audio else 0,
        audio=(Chunk(latency, audio_seconds(data, pcm_rate=spec.pcm_rate)),) if data else (),
    )


async def one_request(client: httpx.AsyncClient, spec: LoadSpec) -> RequestSample:
    began = time.perf_counter()
    try:
        if spec.stream:
            return await _one_streaming(client, spec)
        return await _one_complete(client, spec)
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:  # JSONDecodeError is a ValueError
        return RequestSample(
            ok=False, latency_s=time.perf_counter() - began, error=f"{type(exc).__name__}: {exc}"
        )


async def run_level(
    spec: LoadSpec, *, concurrency: int, requests: int, on_done: Callable[[int], None] | None = None
) -> tuple[list[RequestSample], float]:
    """Run ``requests`` requests with ``concurrency`` in flight; returns samples and wall seconds."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=spec.url, timeout=spec.timeout_s, limits=limits) as client:
        samples: list[RequestSample] = []
        remaining = iter(range(requests))

        async def worker() -> None:
            for _ in remaining:  # a shared iterator: each worker takes the next request number
                sent = time.perf_counter() - began
                samples.append(replace(await one_request(client, spec), sent_s=sent))
                if on_done is not None:
                    on_done(len(samples))

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return samples, time.perf_counter() - began


def poisson_arrivals(rate_per_s: float, duration_s: float, *, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of a Poisson process, reproducible by seed."""
    if rate_per_s <= 0 or duration_s <= 0:
        raise ValueError("the arrival rate and the duration must be positive")
    rng = random.Random(seed)
    arrivals: list[float] = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        arrivals.append(t)
        t += rng.expovariate(rate_per_s)
    return arrivals


async def run_open_loop(
    spec: LoadSpec,
    *,
    arrivals: list[float],
    on_done: Callable[[int], None] | None = None,
) -> tuple[list[RequestSample], float, int]:
    """Send one request at each arrival time whatever is still in flight; returns the samples, the
    wall seconds until the last one finished, and the most requests that were in flight at once."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=spec.url, timeout=spec.timeout_s, limits=limits) as client:
        samples: list[RequestSample] = []
        in_flight = peak = 0
        began = time.perf_counter()

        async def arrive(at: float) -> None:
            nonlocal in_flight, peak
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - began)))
            in_flight += 1
            peak = max(peak, in_flight)
            sent = time.perf_counter() - began
            try:
                samples.append(replace(await one_request(client, spec), sent_s=sent))
            finally:
                in_flight -= 1
            if on_done is not None:
                on_done(len(samples))

        await asyncio.gather(*(arrive(at) for at in arrivals))
        return samples, time.perf_counter() - began, peak


async def discover_model(url: str, *, timeout_s: float = 30.0) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
        response = await client.get("/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
