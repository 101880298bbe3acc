"""A stage process's counters over its stage link (``stats.get``): the ProcessStats a worker
merges into its /metrics arrive exactly, and a process that does not answer in time is a missing
report (None), not a stalled scrape."""

from __future__ import annotations

import asyncio
import time

import pytest

from omni_runtime.contract.engine import GpuMemory, ProcessStats, StageLoad, TimeHistogram
from omni_runtime.pipeline import remote, wire
from omni_runtime.pipeline.link.client import StageLinkClient
from omni_runtime.pipeline.link.server import StageLinkServer

REPORT = ProcessStats(
    process="audio_encoder,image_encoder,mm_aggregate,thinker",
    queue_depth=3,
    running_batch=2,
    max_running_batch=5,
    thinker_steps=700,
    thinker_steps_ahead=650,
    stages=(
        StageLoad(
            stage="thinker", busy_s=1.5, calls=40, items=90, cancelled=2, after_cancel_s=0.25, working=True,
            waits=(TimeHistogram("admission", (1, 2, 0, 0, 0, 0, 0, 0, 0, 1), 12.75),),
        ),
        StageLoad(stage="audio_encoder", calls=4),
    ),
    gpus=(GpuMemory(0, 1_000, 2_000, 1, 0),),
    session_kv={"entries": 2, "hits": 5, "capacity_bytes": 64 << 20},
    talker_kv={"entries": 1, "reused_tokens": 40},
)  # fmt: skip


def test_the_report_round_trips_exactly() -> None:
    assert wire.unpack_process_stats(wire.pack_process_stats(REPORT)) == REPORT


async def test_a_stage_process_reports_and_a_silent_one_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "STATS_TIMEOUT_S", 0.3)

    async def answer(payload, tensors):
        return wire.pack_process_stats(REPORT), {}

    async def stall(payload, tensors):
        await asyncio.sleep(30)
        return {}, {}

    for handler, expected in ((answer, REPORT), (stall, None)):
        async with StageLinkServer({"stats.get": handler}) as server:
            address = await server.start()
            linked = remote.LinkedStages(StageLinkClient(address, connect_timeout=2.0))
            started = time.monotonic()
            assert await linked.stats() == expected
            assert time.monotonic() - started < 2.0
            await linked.close()
