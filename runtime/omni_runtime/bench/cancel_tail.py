"""Cancel probe: the work a worker keeps doing after a realtime response is cancelled mid-speech.

``python -m omni_runtime.bench.cancel_tail --url ws://HOST:PORT/v1/realtime`` opens one realtime
session on an otherwise idle worker, asks for a long spoken reply, sends ``response.cancel`` once
``--after-deltas`` audio deltas arrived, and reads the worker's /metrics before the cancel and
until its stages stop accruing busy time. Per stage it reports the busy seconds accrued after the
cancel (``omni_stage_busy_seconds_total``), the part the engine attributes to calls running at
the cancel (``omni_stage_busy_after_cancel_seconds_total``) and the rows or windows the cancel
finished or dropped (``omni_stage_cancelled_total``); plus cancel → ``response.done`` and cancel
→ quiet. Other load on the worker would count as tail: run it alone. One JSON line per repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from typing import Any

import httpx
import websockets

BUSY = "omni_stage_busy_seconds_total"
AFTER_CANCEL = "omni_stage_busy_after_cancel_seconds_total"
CANCELLED = "omni_stage_cancelled_total"
WORKING = "omni_stage_working"
POLL_S = 0.01
QUIET_POLLS = 20  # busy time unchanged for this many polls (200 ms): the stages are done


def stage_counters(text: str, name: str) -> dict[str, float]:
    """``name{stage="S"} value`` lines of a Prometheus exposition, by stage."""
    pattern = rf'^{re.escape(name)}\{{stage="([^"]+)"\}} (\S+)$'
    return {stage: float(value) for stage, value in re.findall(pattern, text, re.MULTILINE)}


def metrics_url_of(url: str) -> str:
    """A worker's /metrics from any of its URLs (``ws://HOST:PORT/v1/realtime`` and the like)."""
    return re.sub(r"^ws", "http", url.split("/v1/")[0]) + "/metrics"


def tail_report(before: str, after: str) -> dict[str, dict[str, float]]:
    """Per stage, what each counter gained from ``before`` to ``after`` (stages that gained nothing
    in every counter are left out)."""
    report: dict[str, dict[str, float]] = {}
    for key, name in (("busy_s", BUSY), ("busy_after_cancel_s", AFTER_CANCEL), ("cancelled", CANCELLED)):
        old, new = stage_counters(before, name), stage_counters(after, name)
        for stage, value in new.items():
            gained = round(value - old.get(stage, 0.0), 4)
            if gained:
                report.setdefault(stage, {"busy_s": 0.0, "busy_after_cancel_s": 0.0, "cancelled": 0.0})
                report[stage][key] = gained
    return dict(sorted(report.items()))


async def _next(ws: Any, *wanted: str, deadline: float, errors: bool = False) -> dict[str, Any]:
    """The next event of a ``wanted`` type; an ``error`` event raises, or is returned with
    ``errors``; past ``deadline`` a TimeoutError names what it waited for."""
    while True:
        left = deadline - time.monotonic()
        try:
            message = await asyncio.wait_for(ws.recv(), timeout=max(left, 0.001))
        except TimeoutError:
            raise TimeoutError(f"no {' or '.join(wanted)} event in time") from None
        event = json.loads(message)
        if event["type"] == "error" and not errors:
            raise RuntimeError(f"server error: {event['error']}")
        if event["type"] in (*wanted, "error"):
            return event


async def _settle(http: httpx.AsyncClient, metrics_url: str, deadline: float) -> tuple[str, float, bool]:
    """The metrics once no stage works (no call running or waiting) and busy time stopped
    growing, when the last work ended (monotonic), and whether that happened before
    ``deadline`` (if not: the metrics at the deadline)."""
    text = (await http.get(metrics_url)).text
    last, since, polls = stage_counters(text, BUSY), time.monotonic(), 0
    while polls < QUIET_POLLS and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        text = (await http.get(metrics_url)).text
        busy = stage_counters(text, BUSY)
        if busy == last and not any(stage_counters(text, WORKING).values()):
            polls += 1
        else:
            last, since, polls = busy, time.monotonic(), 0
    return text, since, polls >= QUIET_POLLS


async def cancel_once(
    url: str,
    metrics_url: str,
    *,
    after_deltas: int = 3,
    max_output_tokens: int = 200,
    timeout_s: float = 60.0,
    settle_s: float = 10.0,
) -> dict[str, Any]:
    """One cancelled reply. ``status`` is the response's (``cancelled``), or
    ``ended_before_cancel`` when the reply ended before ``after_deltas`` audio deltas or before
    the cancel arrived. ``settled`` is false when some stage still worked ``settle_s`` after the
    cancel's ``response.done``: ``working`` then names those stages."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10) as http, websockets.connect(url, max_size=None) as ws:
        await _next(ws, "session.created", deadline=deadline)
        update = {"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": max_output_tokens}
        await ws.send(json.dumps({"type": "session.update", "session": update}))
        await _next(ws, "session.updated", deadline=deadline)
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Tell a story."}],
        }
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create"}))
        deltas = 0
        while deltas < after_deltas:
            event = await _next(ws, "response.output_audio.delta", "response.done", deadline=deadline)
            if event["type"] == "response.done":  # a short reply: nothing left to cancel
                return {"status": "ended_before_cancel", "audio_deltas": deltas}
            deltas += 1
        before = (await http.get(metrics_url)).text
        cancelled_at = time.monotonic()
        await ws.send(json.dumps({"type": "response.cancel"}))
        # An error here: the reply ended before the cancel arrived (nothing to cancel).
        done = await _next(ws, "response.done", deadline=deadline, errors=True)
        done_at = time.monotonic()
        after, quiet_at, settled = await _settle(http, metrics_url, done_at + settle_s)
    result = {
        "status": done["response"]["status"] if done["type"] == "response.done" else "ended_before_cancel",
        "audio_deltas": deltas,
        "cancel_to_done_s": round(done_at - cancelled_at, 4),
        "cancel_to_quiet_s": round(max(quiet_at - cancelled_at, 0.0), 4),
        "settled": settled,
        "stages": tail_report(before, after),
    }
    if not settled:
        result["working"] = {k: v for k, v in stage_counters(after, WORKING).items() if v}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m omni_runtime.bench.cancel_tail", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--url", required=True, help="ws://HOST:PORT/v1/realtime of one worker")
    parser.add_argument("--metrics-url", help="the worker's /metrics (default: from --url)")
    parser.add_argument("--after-deltas", type=int, default=3, help="audio deltas before the cancel")
    parser.add_argument("--max-output-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for one repeat's events")
    parser.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds after the cancel's response.done to wait for quiet",
    )
    args = parser.parse_args(argv)
    metrics_url = args.metrics_url or metrics_url_of(args.url)
    failed = 0
    for _ in range(args.repeats):
        try:
            result = asyncio.run(
                cancel_once(
                    args.url,
                    metrics_url,
                    after_deltas=args.after_deltas,
                    max_output_tokens=args.max_output_tokens,
                    timeout_s=args.timeout,
                    settle_s=args.settle,
                )
            )
        except (TimeoutError, RuntimeError, OSError, websockets.WebSocketException, httpx.HTTPError) as exc:
            failed += 1
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
