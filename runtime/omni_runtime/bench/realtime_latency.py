"""Realtime latency probe: end of user speech to the first response audio, at a given concurrency.

``python -m omni_runtime.bench.realtime_latency --url ws://HOST:PORT/v1/realtime --concurrency 1,8``
opens that many realtime sessions at once; each sends a spoken turn and measures the time from the
end of the user's speech to the first ``response.output_audio.delta``. The end of speech is the
client's ``input_audio_buffer.commit`` (``--turn commit``) or the server's ``speech_stopped``
event (``--turn vad``, which needs real speech: ``--wav``). It prints one JSON line per
concurrency with the median, p90, p95 and max, so the numbers in docs/benchmarks.md can be rerun, and
``by_turn``: the same per turn index (turn 1 vs turn N of every session), with the prompt tokens
of that turn and how many of them the worker served from the session's kept KV
(``usage.input_token_details.cached_tokens``): with conversation KV the cost of turn N does not
grow with the turns before it (``omni serve --session-kv-mb 0`` is the re-prefill baseline).
``phases`` (and each ``by_turn`` row) split the wait: when ``response.created`` came (the turn
accepted), when the reply's first text came (the thinker's first token), and first audio (talker
and vocoder after that), medians from the same end of speech. ``stages`` is each stage thread's
share of the round's wall time (``omni_stage_busy_seconds`` from the worker's /metrics before and
after the round; ``--metrics-url``, default from ``--url``; left out where it cannot be read, as
behind the router): the stage near 1.0 is the one the turns queued behind. ``waits`` is, per stage
and kind of work, what waited for that stage's calls during the round (``omni_stage_wait_seconds``):
how many, their mean, and the share that waited over 0.1 s; ``vocoder/first`` is how long each
reply's first audio window queued behind other windows, ``talker/admission`` how long a reply's
talker waited for a step. ``first_audio_phases`` splits the worker's own time to first audio
of the round's replies (``omni_first_audio_phase_seconds``): prompt, first_token,
talker_first_code, first_window_codes, first_window; their means add up to the worker's part of
the wait. ``loop_lag`` is how late the worker's event loop woke a task due every 20 ms during the
round (``omni_event_loop_lag_seconds``: wakes, mean, share over 10 ms): what the sockets' events
and the worker's token handoffs waited for. Each round's line carries its ``latencies_s`` (end of
speech to first audio, every turn, None for a turn without audio); a level named more than once (``--concurrency 1,8,8,8``) ends with
a ``pooled`` line over all its rounds: one round's p95 of 32 turns is its second-largest value, so
it moves by tenths of a second from round to round under the same load, and the pooled one over
three or four rounds is the number to hold against a goal.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import websockets

from omni_runtime.bench.cancel_tail import metrics_url_of
from omni_runtime.bench.quantile import percentile
from omni_runtime.bench.worker_metrics import fetch_metrics, worker_report
from omni_runtime.support.cli_types import positive_float

RATE = 16_000


@dataclass(frozen=True)
class TurnSample:
    latency_s: float | None  # end of speech to the first response audio (None: a reply with none)
    input_tokens: int  # the turn's prompt
    cached_tokens: int  # of those, served from the session's kept KV
    # Where the latency went, seconds from the same end of speech: the server's response.created
    # (the turn accepted and its response begun) and the first text of the reply (its transcript
    # delta: the thinker's first token out); the rest up to the latency is talker and vocoder.
    created_s: float | None = None
    first_text_s: float | None = None


@dataclass(frozen=True)
class Probe:
    url: str
    speech: np.ndarray  # 16 kHz mono float32
    turns: int = 3
    turn: str = "commit"  # commit | vad
    max_output_tokens: int = 16
    timeout_s: float = 300.0
    metrics_url: str | None = None  # the worker's /metrics: each round's stage shares
    paced: bool = False  # send the speech as it is spoken (0.1 s a piece, 0.1 s apart), not at once


def _pcm16(pcm: np.ndarray) -> str:
    return base64.b64encode((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def synthetic_speech(seconds: float = 1.5) -> np.ndarray:
    """A voiced-sounding test signal (harmonics under a syllable envelope); fine for commit mode."""
    t = np.arange(int(seconds * RATE)) / RATE
    voice = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 8))
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    return (0.2 * voice * envelope).astype(np.float32)


# Events that mark a turn's phases before its first audio (the first of each counts).
MARKED = {
    "response.created": "created",
    "response.output_audio_transcript.delta": "text",
    "response.output_text.delta": "text",
}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


async def _next(ws: Any, wanted: set[str], deadline: float) -> dict[str, Any]:
    while True:
        message = await asyncio.wait_for(ws.recv(), timeout=max(deadline - time.monotonic(), 0.001))
        event = json.loads(message)
        if event["type"] == "error":
            raise RuntimeError(f"server error: {event['error']}")
        if event["type"] in wanted:
            return event


async def one_session(probe: Probe) -> list[TurnSample]:
    """``probe.turns`` spoken turns on one session, in order."""
    vad = {"type": "server_vad", "silence_duration_ms": 500} if probe.turn == "vad" else None
    samples: list[TurnSample] = []
    async with websockets.connect(probe.url, max_size=None) as ws:
        deadline = time.monotonic() + probe.timeout_s
        await _next(ws, {"session.created"}, deadline)
        update = {
            "type": "realtime",
            "output_modalities": ["audio"],
            "max_output_tokens": probe.max_output_tokens,
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": vad}},
        }
        await ws.send(json.dumps({"type": "session.update", "session": update}))
        await _next(ws, {"session.updated"}, deadline)
        tail = np.zeros(RATE, dtype=np.float32) if probe.turn == "vad" else np.zeros(0, dtype=np.float32)
        audio = np.concatenate([probe.speech, tail])
        for _ in range(probe.turns):
            for start in range(0, audio.size, RATE // 10):
                await ws.send(
                    json.dumps(
                        {
                            "type": "input_audio_buffer.append",
                            "audio": _pcm16(audio[start : start + RATE // 10]),
                        }
                    )
                )
                if probe.paced:  # as a microphone sends it: the worker can work while the user speaks
                    await asyncio.sleep(0.1)
            if probe.turn == "commit":
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                ended = time.monotonic()
                await ws.send(json.dumps({"type": "response.create"}))
            else:
                await _next(ws, {"input_audio_buffer.speech_stopped"}, deadline)
                ended = time.monotonic()
            # A reply may carry no audio at all (a random talker can end at once): then it counts
            # as such instead of leaving the probe waiting for audio that never comes.
            marks: dict[str, float] = {}
            while True:
                first = await _next(ws, {*MARKED, "response.output_audio.delta", "response.done"}, deadline)
                if first["type"] not in MARKED:
                    break
                marks.setdefault(MARKED[first["type"]], time.monotonic() - ended)
            latency = None if first["type"] == "response.done" else time.monotonic() - ended
            done = first if first["type"] == "response.done" else await _next(ws, {"response.done"}, deadline)
            usage = done["response"].get("usage") or {}
            cached = (usage.get("input_token_details") or {}).get("cached_tokens", 0)
            samples.append(
                TurnSample(
                    latency,
                    int(usage.get("input_tokens", 0)),
                    int(cached),
                    created_s=marks.get("created"),
                    first_text_s=marks.get("text"),
                )
            )
    return samples


def _spread(samples: list[float | None]) -> dict[str, Any]:
    """Median, p90, p95 (issue 20's goal is a p95; ``bench.quantile``, as every bench number) and
    max of the latencies, and how many replies had no audio."""
    timed = [v for v in samples if v is not None]
    if not timed:
        return {"median_s": None, "p90_s": None, "p95_s": None, "max_s": None, "no_audio": len(samples)}
    return {
        "no_audio": len(samples) - len(timed),
        "median_s": round(statistics.median(timed), 4),
        "p90_s": round(percentile(timed, 90), 4),
        "p95_s": round(percentile(timed, 95), 4),
        "max_s": round(max(timed), 4),
    }


def by_turn(sessions: list[list[TurnSample]]) -> list[dict[str, Any]]:
    """Per turn index (1-based), across sessions: latency spread, median prompt and cached tokens."""
    rows = []
    for index in range(max((len(s) for s in sessions), default=0)):
        turn = [s[index] for s in sessions if len(s) > index]
        rows.append(
            {
                "turn_index": index + 1,
                "samples": len(turn),
                **_spread([t.latency_s for t in turn]),
                "input_tokens": int(statistics.median(t.input_tokens for t in turn)),
                "cached_tokens": int(statistics.median(t.cached_tokens for t in turn)),
                "created_s": _median([t.created_s for t in turn]),
                "first_text_s": _median([t.first_text_s for t in turn]),
            }
        )
    return rows


async def measure(probe: Probe, *, concurrency: int) -> dict[str, Any]:
    before = await fetch_metrics(probe.metrics_url)
    began = time.monotonic()
    results = await asyncio.gather(*(one_session(probe) for _ in range(concurrency)))
    wall = time.monotonic() - began
    after = await fetch_metrics(probe.metrics_url)
    values = [sample.latency_s for session in results for sample in session]
    worker = worker_report(before, after, wall)
    return {
        "concurrency": concurrency,
        "turn": probe.turn,
        "samples": len(values),
        **_spread(values),
        # Medians of each phase's end over every turn, from the end of speech.
        "phases": {
            "created_s": _median([t.created_s for session in results for t in session]),
            "first_text_s": _median([t.first_text_s for session in results for t in session]),
            "first_audio_s": _median(values),
        },
        "by_turn": by_turn(list(results)),
        "wall_s": round(wall, 3),
        **worker,
        "latencies_s": [None if v is None else round(v, 4) for v in values],
    }


def pooled(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per concurrency level measured in more than one round: the spread of every turn
    of those rounds together."""
    levels: dict[int, list[dict[str, Any]]] = {}
    for report in rounds:
        levels.setdefault(report["concurrency"], []).append(report)
    return [
        {
            "pooled": True,
            "concurrency": level,
            "rounds": len(reports),
            "samples": sum(len(r["latencies_s"]) for r in reports),
            **_spread([v for r in reports for v in r["latencies_s"]]),
        }
        for level, reports in levels.items()
        if len(reports) > 1
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m omni_runtime.bench.realtime_latency", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--url", required=True, help="ws://HOST:PORT/v1/realtime (a worker or the router)")
    parser.add_argument(
        "--concurrency", default="1,8", help="comma list of concurrent sessions (default 1,8)"
    )
    parser.add_argument("--turns", type=int, default=3, help="spoken turns per session (default 3)")
    parser.add_argument(
        "--turn", choices=("commit", "vad"), default="commit", help="how the user's turn ends"
    )
    parser.add_argument("--wav", help="speech to send (any rate; default: a synthetic voiced signal)")
    parser.add_argument("--max-output-tokens", type=int, default=16)
    parser.add_argument(
        "--speech-seconds",
        type=positive_float,
        default=1.5,
        help="length of the synthetic speech of each turn (default 1.5; ignored with --wav)",
    )
    parser.add_argument(
        "--paced",
        action="store_true",
        help="send the speech in real time (0.1 s pieces, 0.1 s apart) instead of at once, so work done "
        "while the user speaks (early encoding, warm-ups) shows in the latency",
    )
    parser.add_argument("--metrics-url", help="the worker's /metrics (default: from --url; 'none' skips it)")
    args = parser.parse_args(argv)
    if args.wav:
        import soundfile as sf

        from omni_runtime.media.resample import resample

        pcm, rate = sf.read(args.wav, dtype="float32", always_2d=True)
        speech = resample(pcm.mean(axis=1), orig_sr=rate, target_sr=RATE)
    elif args.turn == "vad":
        parser.error("--turn vad needs real speech: pass --wav (for example made by espeak-ng -w)")
    else:
        speech = synthetic_speech(args.speech_seconds)
    probe = Probe(
        url=args.url,
        speech=speech,
        turns=args.turns,
        turn=args.turn,
        max_output_tokens=args.max_output_tokens,
        paced=args.paced,
        metrics_url=None if args.metrics_url == "none" else (args.metrics_url or metrics_url_of(args.url)),
    )
    rounds = []
    for level in (int(part) for part in args.concurrency.split(",")):
        rounds.append(asyncio.run(measure(probe, concurrency=level)))
        print(json.dumps(rounds[-1]), flush=True)
    for line in pooled(rounds):
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
