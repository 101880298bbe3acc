"""Stages in other processes: `omni stage` serves them over stage links, with the same results.

Two real `omni stage` processes (encoders + mm_aggregate + thinker in one, talker in the other)
and an engine that hosts only preprocessing and decode, as the planner lays out a 7B worker; and
Qwen3-Omni's talker (frames of codes) in its own stage process.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from engine_harness import Harness, finished, image, request, tiny_options, token_ids

from omni_runtime.contract.engine import AudioChunk, ChatTurn, GenerationRequest, TextDelta

STAGE_START_TIMEOUT_S = 600.0
THINKER_SIDE = "audio_encoder,image_encoder,mm_aggregate,thinker"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_stage(checkpoint: Path, stages: str, port: int, log: Path) -> subprocess.Popen:
    argv = [
        sys.executable, "-m", "omni_operator.cli", "stage", "--stages", stages,
        "--model-path", str(checkpoint), "--pipeline", "streaming-speech", "--device", "cpu",
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024", "--max-batch-size", "8",
        "--session-kv-mb", "64",  # conversation KV on, as the in-process harness has it
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ})


def _wait_serving(procs: list[tuple[subprocess.Popen, Path]]) -> None:
    deadline = time.monotonic() + STAGE_START_TIMEOUT_S
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        for proc, log in list(pending):
            if proc.poll() is not None:
                pytest.fail(f"omni stage exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            text = log.read_text()
            if "omni stage: serving" in text:
                # Warm, then frozen out of full garbage collections, as omni serve is.
                assert "startup objects out of the garbage collector's passes" in text, text[-3000:]
                pending.remove((proc, log))
        time.sleep(0.5)
    if pending:
        pytest.fail(
            f"omni stage not ready in {STAGE_START_TIMEOUT_S:g}s:\n{pending[0][1].read_text()[-3000:]}"
        )


@pytest.fixture(scope="module")
def split_engine(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    logs = tmp_path_factory.mktemp("stage-logs")
    thinker_port, talker_port = _free_port(), _free_port()
    procs = [
        (
            _start_stage(tiny_checkpoint, THINKER_SIDE, thinker_port, logs / "thinker.log"),
            logs / "thinker.log",
        ),
        (_start_stage(tiny_checkpoint, "talker", talker_port, logs / "talker.log"), logs / "talker.log"),
    ]
    try:
        _wait_serving(procs)
        remote = {stage: f"127.0.0.1:{thinker_port}" for stage in THINKER_SIDE.split(",")}
        remote["talker"] = f"127.0.0.1:{talker_port}"
        harness = Harness(tiny_options(tiny_checkpoint, remote_stages=remote))
        yield harness
        harness.close()
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_split_engine_hosts_only_preprocessing_and_decode(split_engine: Harness) -> None:
    local = split_engine.engine.stages.local
    assert local.thinker is None and local.talker is None and local.audio is None
    loaded = split_engine.engine.adapter.loaded
    assert loaded.text is None and loaded.talker is None and loaded.visual is None


def test_greedy_tokens_through_stage_links_equal_in_process(
    split_engine: Harness, speech_engine: Harness
) -> None:
    for media in ((), (image(),)):
        local = token_ids(speech_engine.collect(request("Describe it.", max_tokens=16, media=media)))
        remote_events = split_engine.collect(request("Describe it.", max_tokens=16, media=media))
        assert token_ids(remote_events) == local
        assert finished(remote_events).reason == "length"


def test_speech_through_a_remote_talker(split_engine: Harness) -> None:
    events = split_engine.collect(request(max_tokens=12, want_audio=True, talker_tokens=30))
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    assert chunks and {c.sample_rate for c in chunks} == {24000}
    samples = sum(len(c.pcm) for c in chunks)
    assert samples > 0 and samples % 480 == 0 and samples // 480 <= 30
    assert finished(events).usage.audio_seconds == pytest.approx(samples / 24000)


def test_cancel_through_a_stage_link_frees_the_remote_slot(split_engine: Harness) -> None:
    """A cancelled request's row leaves the thinker process's batch: the worker's stats (what a
    /metrics scrape asks the stage processes for, ``refresh_stats``) report it running, then none,
    and not only when another token comes back."""
    engine = split_engine.engine

    async def running() -> int:
        await engine.refresh_stats()
        return engine.stats().running_batch

    async def scenario() -> tuple[int, int, int]:
        stream = engine.generate(request(max_tokens=500))
        await stream.__anext__()
        during = await running()
        await stream.aclose()
        deadline = asyncio.get_running_loop().time() + 10
        while (after := await running()) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)  # the cancel reaches the stage process within a step or two
        return during, after, engine.stats().max_running_batch

    during, after, largest = split_engine.run(scenario())
    assert (during, after) == (1, 0) and largest >= 1
    probe = split_engine.collect(request(max_tokens=3))  # and the freed slot serves the next one
    assert finished(probe).reason == "length"


@pytest.fixture(scope="module")
def qwen3_remote_talker(
    qwen3_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    """Qwen3-Omni with its talker (and Code2Wav) in an `omni stage` process, the rest in-process."""
    logs = tmp_path_factory.mktemp("qwen3-stage-logs")
    port = _free_port()
    proc = _start_stage(qwen3_checkpoint, "talker", port, logs / "talker.log")
    try:
        _wait_serving([(proc, logs / "talker.log")])
        harness = Harness(tiny_options(qwen3_checkpoint, remote_stages={"talker": f"127.0.0.1:{port}"}))
        yield harness
        harness.close()
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_qwen3_frames_through_a_remote_talker_speak_as_in_process(
    qwen3_remote_talker: Harness, qwen3_speech_engine: Harness
) -> None:
    """Talker frames (tuples of 4 codes) cross the stage link as lists and reach the remote
    Code2Wav windows intact: the same greedy reply speaks the same audio either way."""
    assert qwen3_remote_talker.engine.stages.local.talker is None

    def speech() -> GenerationRequest:
        req = request("Say something.", max_tokens=8, want_audio=True)
        return replace(req, stage_params={"talker": {"max_tokens": 24, "temperature": 0.0}})

    remote = qwen3_remote_talker.collect(speech())
    local = qwen3_speech_engine.collect(speech())
    audio = [
        np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)]) for events in (remote, local)
    ]
    assert audio[0].shape == audio[1].shape and audio[0].size > 0
    assert np.abs(audio[0] - audio[1]).max() <= 1e-4 * np.abs(audio[1]).max()
    assert token_ids(remote) == token_ids(local)


def test_conversation_kv_through_a_stage_link(split_engine: Harness, speech_engine: Harness) -> None:
    """The session key travels with the thinker call: the remote scheduler keeps and reuses the
    KV (the reused count comes back with the tokens), and end_session reaches it."""
    engine = split_engine.engine

    def ask(turns: list[ChatTurn]) -> GenerationRequest:
        return replace(request(max_tokens=6), turns=tuple(turns), session_key="link-s")

    turns = [ChatTurn(role="user", text="Hello over the link.")]
    first = split_engine.collect(ask(turns))
    text = "".join(e.text for e in first if isinstance(e, TextDelta))
    turns += [ChatTurn(role="assistant", text=text), ChatTurn(role="user", text="And again?")]
    second = split_engine.collect(ask(turns))
    assert finished(first).usage.cached_tokens == 0
    assert finished(first).usage.prompt_tokens <= finished(second).usage.cached_tokens
    assert token_ids(second) == token_ids(speech_engine.collect(replace(ask(turns), session_key=None)))

    async def end() -> None:
        engine.end_session("link-s")
        await asyncio.gather(*engine.stages.thinker._ending)

    split_engine.run(end())
    assert finished(split_engine.collect(ask(turns))).usage.cached_tokens == 0  # forgotten remotely


def test_speech_turns_keep_the_talker_kv_in_the_talker_process(
    split_engine: Harness, speech_engine: Harness
) -> None:
    """The session key also travels with the talker call: the talker process keeps the session's
    prompt KV, restores it for the next speech turn (its counters reach the worker's stats), the
    audio equals a full prefill's in one process, and end_session reaches the talker process too."""
    engine = split_engine.engine

    def ask(turns: list[ChatTurn], session: str | None = "talk-s") -> GenerationRequest:
        spoken = request(max_tokens=6, want_audio=True, seed=5, talker_tokens=24)  # seeded: the vocoder too
        return replace(spoken, turns=tuple(turns), session_key=session)

    def talker_counts() -> tuple[int, int]:
        split_engine.run(engine.refresh_stats())
        stats = engine.stats()
        return stats.talker_kv_hits, stats.talker_kv_reused_tokens

    turns = [ChatTurn(role="user", text="Say something.")]
    first = split_engine.collect(ask(turns))
    first_prompt = len(engine.adapter.preprocess(ask(turns)).input_ids)
    turns += [
        ChatTurn(role="assistant", text="".join(e.text for e in first if isinstance(e, TextDelta))),
        ChatTurn(role="user", text="Once more."),
    ]
    hits, reused = talker_counts()
    second = split_engine.collect(ask(turns))
    assert talker_counts() == (hits + 1, reused + first_prompt)  # Qwen2.5: the whole first prompt
    full = speech_engine.collect(ask(turns, session=None))
    assert token_ids(second) == token_ids(full)
    audio = [np.concatenate([e.pcm for e in ev if isinstance(e, AudioChunk)]) for ev in (second, full)]
    assert audio[0].size == audio[1].size > 0
    assert np.abs(audio[0] - audio[1]).max() <= 1e-4 * np.abs(audio[1]).max()

    async def end() -> None:
        engine.end_session("talk-s")
        await asyncio.gather(*engine.stages.thinker._ending, *engine.stages.talker._ending)

    split_engine.run(end())
    hits, reused = talker_counts()
    split_engine.collect(ask(turns))
    assert talker_counts() == (hits, reused)  # forgotten in the talker process: a full prefill


def test_the_workers_stats_cover_its_stage_processes(split_engine: Harness) -> None:
    """/metrics of a split worker: each stage process reports its counters over its stage link
    (``stats.get``), merged into the worker's stats. Each stage once, wherever it runs; the kept
    session KV counted where the thinker runs (before: zeros, and no thinker or talker series)."""
    from omni_runtime.api.metrics import ApiMetrics

    engine = split_engine.engine

    def stats():  # as the /metrics route does: the stage processes' counters, then the merged stats
        split_engine.run(engine.refresh_stats())
        return engine.stats()

    before = stats()

    def ask(turns: list[ChatTurn]) -> GenerationRequest:
        return replace(request(max_tokens=4), turns=tuple(turns), session_key="stats-s")

    turns = [ChatTurn(role="user", text="Count me.")]
    first = split_engine.collect(ask(turns))
    turns += [
        ChatTurn(role="assistant", text="".join(e.text for e in first if isinstance(e, TextDelta))),
        ChatTurn(role="user", text="Again."),
    ]
    split_engine.collect(ask(turns))
    split_engine.collect(request(max_tokens=6, want_audio=True, talker_tokens=12))
    after = stats()

    names = [load.stage for load in after.stages]
    assert len(names) == len(set(names)), names  # no stage twice (no idle preprocessing pool remotely)
    assert {"preprocessing", "thinker", "talker", "vocoder"} <= set(names), names
    calls = {load.stage: load.calls for load in after.stages}
    calls_before = {load.stage: load.calls for load in before.stages}
    for stage in ("thinker", "talker", "vocoder"):  # remote stages worked, and their counters moved
        assert calls[stage] > calls_before.get(stage, 0), stage
    assert after.session_kv_hits == before.session_kv_hits + 1
    assert after.session_kv_misses == before.session_kv_misses + 1
    assert after.session_kv_capacity_bytes == 64 << 20  # the stage process's --session-kv-mb
    assert after.remote_stats_failures == 0
    text = ApiMetrics(stats=lambda: after, in_flight=lambda: 0).render().decode()
    assert f'omni_stage_calls_total{{stage="thinker"}} {float(calls["thinker"])}' in text
    assert f"omni_session_kv_hits_total {float(after.session_kv_hits)}" in text
