"""The load generator: N chat requests at a fixed concurrency, timed as a client sees them.

Every request asks for exactly ``max_tokens`` tokens (``ignore_eos``), so levels compare equal
work. Streaming requests time the first text delta and the first audio delta; non-streaming ones
get both with the whole reply, so their first-token and first-audio times equal their latency.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from omni_runtime.bench.stats import RequestSample

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


def request_body(spec: LoadSpec) -> dict[str, object]:
    body: dict[str, object] = {
        "model": spec.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": spec.max_tokens,
        "ignore_eos": True,  # fixed output length (maps to SamplingParams.ignore_eos)
        "temperature": 0.0,
        "stream": spec.stream,
    }
    if spec.mode == "speech":
        body["modalities"] = ["text", "audio"]
        body["audio"] = {"format": "wav"}
    body.update(spec.extra_body or {})
    return body


async def _one_streaming(client: httpx.AsyncClient, spec: LoadSpec) -> RequestSample:
    began = time.perf_counter()
    ttft = ttfa = None
    deltas = chunks = tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=request_body(spec)) as response:
        if response.status_code != 200:
            body = (await response.aread()).decode(errors="replace")
            return RequestSample(
                ok=False,
                latency_s=time.perf_counter() - began,
                error=f"HTTP {response.status_code}: {body[:300]}",
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
                if (delta.get("audio") or {}).get("data"):
                    chunks += 1
                    ttfa = now if ttfa is None else ttfa
            if event.get("usage"):
                tokens = int(event["usage"].get("completion_tokens") or 0)
    return RequestSample(
        ok=True,
        latency_s=time.perf_counter() - began,
        ttft_s=ttft,
        ttfa_s=ttfa,
        output_tokens=tokens or deltas,
        text_deltas=deltas,
        audio_chunks=chunks,
    )


async def _one_complete(client: httpx.AsyncClient, spec: LoadSpec) -> RequestSample:
    began = time.perf_counter()
    response = await client.post("/v1/chat/completions", json=request_body(spec))
    latency = time.perf_counter() - began
    if response.status_code != 200:
        return RequestSample(
            ok=False, latency_s=latency, error=f"HTTP {response.status_code}: {response.text[:300]}"
        )
    body = response.json()
    message = body["choices"][0]["message"]
    has_audio = bool((message.get("audio") or {}).get("data"))
    return RequestSample(
        ok=True,
        latency_s=latency,
        ttft_s=latency,
        ttfa_s=latency if has_audio else None,
        output_tokens=int(body.get("usage", {}).get("completion_tokens") or 0),
        audio_chunks=1 if has_audio else 0,
    )


async def one_request(client: httpx.AsyncClient, spec: LoadSpec) -> RequestSample:
    began = time.perf_counter()
    try:
        if spec.stream:
            return await _one_streaming(client, spec)
        return await _one_complete(client, spec)
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError) as exc:
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
                samples.append(await one_request(client, spec))
                if on_done is not None:
                    on_done(len(samples))

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return samples, time.perf_counter() - began


async def discover_model(url: str, *, timeout_s: float = 30.0) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
        response = await client.get("/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
