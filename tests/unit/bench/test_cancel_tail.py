"""The cancel probe's arithmetic: per-stage counter gains read from two /metrics expositions."""

from __future__ import annotations

import pytest
from scripted_realtime import scripted_server  # beside this file

from omni_runtime.bench.cancel_tail import stage_counters, tail_report

BEFORE = """\
# HELP omni_stage_busy_seconds_total Wall time.
omni_stage_busy_seconds_total{stage="thinker"} 10.0
omni_stage_busy_seconds_total{stage="talker"} 4.5
omni_stage_busy_seconds_total{stage="vocoder"} 7.25
omni_stage_busy_after_cancel_seconds_total{stage="vocoder"} 0.5
omni_stage_cancelled_total{stage="talker"} 2.0
omni_stage_items_total{stage="vocoder"} 40.0
"""


def test_stage_counters_reads_one_family_by_stage() -> None:
    assert stage_counters(BEFORE, "omni_stage_busy_seconds_total") == {
        "thinker": 10.0,
        "talker": 4.5,
        "vocoder": 7.25,
    }
    assert stage_counters(BEFORE, "omni_stage_busy_after_cancel_seconds_total") == {"vocoder": 0.5}
    assert stage_counters(BEFORE, "omni_stage_missing_total") == {}


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (BEFORE, {}),  # nothing ran after the cancel
        (
            BEFORE.replace('"vocoder"} 7.25', '"vocoder"} 7.5')
            .replace(
                'after_cancel_seconds_total{stage="vocoder"} 0.5',
                'after_cancel_seconds_total{stage="vocoder"} 0.75',
            )
            .replace('cancelled_total{stage="talker"} 2.0', 'cancelled_total{stage="talker"} 3.0'),
            {
                "talker": {"busy_s": 0.0, "busy_after_cancel_s": 0.0, "cancelled": 1.0},
                "vocoder": {"busy_s": 0.25, "busy_after_cancel_s": 0.25, "cancelled": 0.0},
            },
        ),
        (  # a stage that first appears after the cancel counts from zero
            BEFORE + 'omni_stage_cancelled_total{stage="vocoder"} 3.0\n',
            {"vocoder": {"busy_s": 0.0, "busy_after_cancel_s": 0.0, "cancelled": 3.0}},
        ),
    ],
)
def test_tail_report_is_what_each_stage_gained(after: str, expected: dict) -> None:
    assert tail_report(BEFORE, after) == expected


def test_a_reply_that_ends_before_its_audio_is_reported_not_waited_on() -> None:
    """A reply shorter than --after-deltas (a random-weight model's early end) ends the repeat
    at its response.done instead of waiting for audio that never comes."""
    import asyncio

    from omni_runtime.bench.cancel_tail import cancel_once

    async def run() -> dict:
        delta = {"type": "response.output_audio.delta", "delta": ""}
        server = await scripted_server(
            [delta, {"type": "response.done", "response": {"status": "completed"}}]
        )
        port = server.sockets[0].getsockname()[1]
        try:
            return await cancel_once(
                f"ws://127.0.0.1:{port}/v1/realtime", f"http://127.0.0.1:{port}/metrics", timeout_s=5
            )
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(run()) == {"status": "ended_before_cancel", "audio_deltas": 1}


def test_a_silent_worker_times_out_with_what_was_awaited(capsys) -> None:
    """No audio and no response.done: the CLI prints an error line naming the awaited events and
    exits 1 (no traceback, no hang past --timeout)."""
    import asyncio
    import json
    import threading

    from omni_runtime.bench.cancel_tail import main

    ready = threading.Event()
    box: dict = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        box["server"] = loop.run_until_complete(scripted_server([]))
        box["loop"] = loop
        ready.set()
        loop.run_forever()

    threading.Thread(target=serve, daemon=True).start()
    ready.wait(10)
    port = box["server"].sockets[0].getsockname()[1]
    try:
        code = main(["--url", f"ws://127.0.0.1:{port}/v1/realtime", "--repeats", "1", "--timeout", "0.5"])
    finally:
        server = box["server"]

        async def close() -> None:
            server.close()
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), box["loop"]).result(10)
        box["loop"].call_soon_threadsafe(box["loop"].stop)
    line = json.loads(capsys.readouterr().out.strip())
    assert code == 1
    assert line == {"error": "TimeoutError: no response.output_audio.delta or response.done event in time"}
