"""Streaming video: every session.config field and sampling parameter checked on arrival, per-stage
mapping of sampling_params_list, WAV audio deltas, and a query that fails inside the worker."""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from rt_scripted_engine import ScriptedEngine
from video_helpers import errors_of as _errors
from video_helpers import png_b64 as _png
from video_helpers import run_video as _run

from omni_runtime.contract.engine import EngineError, EngineEvent, GenerationRequest, SamplingParams
from omni_runtime.realtime.errors import ProtocolError

CONFIG_CASES = [
    ({"modalities": "text"}, "modalities"),
    ({"modalities": ["video"]}, "modalities[0]"),
    ({"num_frames": "4"}, "num_frames"),
    ({"num_sample_frames": 0}, "num_sample_frames"),
    ({"num_frames": 4.5}, "num_frames"),
    ({"max_frames": True}, "max_frames"),
    ({"max_frames": 257}, "max_frames"),
    ({"system_prompt": 7}, "system_prompt"),
    ({"system_prompt": "\ud800"}, "system_prompt"),
    ({"use_audio_in_video": "yes"}, "use_audio_in_video"),
    ({"enable_frame_filter": 1}, "enable_frame_filter"),
    ({"evs_enabled": "false"}, "evs_enabled"),
    ({"frame_filter_threshold": "high"}, "frame_filter_threshold"),
    ({"evs_threshold": 1.5}, "evs_threshold"),
    ({"video_fps": 0}, "video_fps"),
    ({"voice": ["Chelsie"]}, "voice"),
    ({"voice": "nobody"}, "voice"),
    ({"model": 3}, "model"),
    ({"sampling_params_list": {"max_tokens": 3}}, "sampling_params_list"),
    ({"sampling_params_list": [{}, {}, {}, {}]}, "sampling_params_list"),
    ({"sampling_params_list": ["hot"]}, "sampling_params_list[0]"),
    ({"stage_params": {"vocoder": {}}}, "stage_params.vocoder"),
    ({"stage_params": []}, "stage_params"),
    ({"sampling_params_list": [{}], "stage_params": {"talker": {}}}, "stage_params"),
]


@pytest.mark.parametrize(("body", "param"), CONFIG_CASES)
def test_every_config_field_is_checked_with_an_error_naming_it(
    engine: ScriptedEngine, body: dict[str, Any], param: str
) -> None:
    events = _run(
        engine,
        [
            {"type": "session.config", **body},
            {"type": "video.frame", "data": _png(1)},
            {"type": "video.query", "text": "what is there?"},
        ],
    )
    assert _errors(events) == [("invalid_value", param)]
    # the session went on with its previous (default) config and answered
    assert [e["status"] for e in events if e["type"] == "response.done"] == ["completed"]


SAMPLING_CASES = [
    ({"max_tokens": "abc"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_new_tokens": "8"}, "max_new_tokens"),
    ({"max_tokens": 10**9}, "max_tokens"),  # above the model's context
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": "1"}, "top_p"),
    ({"top_k": 1.5}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"seed": "7"}, "seed"),
    ({"stop": 5}, "stop"),
    ({"stop": [1]}, "stop[0]"),
    ({"stop": ""}, "stop"),
    ({"stop": ["END", ""]}, "stop"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"codes_per_text_token": 0}, "codes_per_text_token"),
    ({"detokenize": "no"}, "detokenize"),
    ({"stop_token_ids": [1.5]}, "stop_token_ids[0]"),
    ({"presence_penalty": 0.5}, "presence_penalty"),  # not supported here: refused, not ignored
]


@pytest.mark.parametrize(("params", "key"), SAMPLING_CASES)
def test_every_sampling_param_is_checked_at_config_and_at_query(
    engine: ScriptedEngine, params: dict[str, Any], key: str
) -> None:
    events = _run(
        engine,
        [
            {"type": "session.config", "modalities": ["text"], "sampling_params_list": [params]},
            {"type": "video.frame", "data": _png(1)},
            {"type": "video.query", "text": "q1", "stage_params": {"talker": {}, "thinker": params}},
            {"type": "video.query", "text": "q2"},
        ],
    )
    assert _errors(events) == [
        ("invalid_value", f"sampling_params_list[0].{key}"),
        ("invalid_value", f"stage_params.thinker.{key}"),
    ]
    message = next(e for e in events if e["type"] == "error")["message"]
    assert message.startswith(f"sampling_params_list[0].{key}: ")
    # the refused query was never asked; the good one was answered with the defaults
    assert [e["status"] for e in events if e["type"] == "response.done"] == ["completed"]
    assert len(engine.requests) == 1


def test_sampling_params_list_maps_each_entry_to_its_stage() -> None:
    from omni_runtime.realtime.video.sampling import resolve_sampling

    plan = resolve_sampling(
        [
            {"max_tokens": 7, "temperature": 0.2, "top_k": 5, "stop": "END", "seed": 3, "detokenize": True},
            {"max_tokens": 40, "temperature": 0.5, "top_p": 0.9, "seed": 1, "detokenize": False},
            {"temperature": 0.0, "max_tokens": 65536},
        ],
        default_max_tokens=100,
        max_model_len=4096,
    )
    assert plan.sampling == SamplingParams(max_tokens=7, temperature=0.2, top_k=5, stop=("END",), seed=3)
    assert plan.stage_params == {
        "talker": {"max_tokens": 40, "temperature": 0.5, "top_p": 0.9},
        "talker_stream": {"temperature": 0.0, "max_tokens": 65536},
    }
    by_name = resolve_sampling(
        None,
        {"code2wav": {"seed": 2}, "talker": {"max_new_tokens": 9}},
        default_max_tokens=100,
        max_model_len=4096,
    )
    assert by_name.sampling == SamplingParams(max_tokens=100)
    assert by_name.stage_params == {"talker": {"max_tokens": 9}, "talker_stream": {"seed": 2}}
    fixed = resolve_sampling(
        None, {"talker": {"max_tokens": 9, "ignore_eos": True}}, default_max_tokens=5, max_model_len=9
    )
    assert fixed.stage_params == {"talker": {"max_tokens": 9, "ignore_eos": True}}  # the talker applies it
    assert resolve_sampling([], default_max_tokens=5, max_model_len=4096).stage_params == {}
    with pytest.raises(ProtocolError) as twice:
        resolve_sampling(None, {"talker_stream": {}, "code2wav": {}}, default_max_tokens=5, max_model_len=9)
    assert twice.value.param == "stage_params.code2wav"


def test_the_engine_gets_per_stage_params_and_audio_as_wav_files(engine: ScriptedEngine) -> None:
    events = _run(
        engine,
        [
            {
                "type": "session.config",
                "modalities": ["text", "audio"],
                "sampling_params_list": [{"max_tokens": 2, "ignore_eos": True}, {"max_tokens": 30}],
            },
            {"type": "video.frame", "data": _png(1)},
            {"type": "video.query", "text": "q1"},
        ],
    )
    request = engine.requests[0]
    assert request.sampling.max_tokens == 2 and request.sampling.ignore_eos
    assert request.stage_params == {"talker": {"max_tokens": 30}}
    released = [e for e in events if e["type"] == "response.output_audio.delta"]
    legacy = [e for e in events if e["type"] == "response.audio.delta"]
    assert len(released) == len(legacy) == 2  # one chunk per word; both names carry the same WAV
    for new, old in zip(released, legacy, strict=True):
        assert new["data"] == old["data"] and new["format"] == old["format"] == "wav"
        with wave.open(io.BytesIO(base64.b64decode(new["data"]))) as wav:
            assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24_000)
            assert wav.getnframes() == 24_000 * engine.chunk_ms // 1000
    types = [e["type"] for e in events]
    assert types.index("response.output_audio.done") < types.index("response.done")
    assert "response.audio.done" in types


class FailingEngine(ScriptedEngine):
    """Fails the first ``failures`` requests mid-stream with an error no handler expects."""

    failures: int = 1

    async def _run(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        if len(self.requests) <= self.failures:
            async for item in super()._run(request):
                yield item
                raise RuntimeError("device lost")
        async for item in super()._run(request):
            yield item


def test_a_query_that_fails_inside_the_worker_ends_in_an_error_and_the_session_goes_on() -> None:
    engine = FailingEngine()
    events = _run(
        engine,
        [
            {"type": "session.config", "modalities": ["text"]},
            {"type": "video.frame", "data": _png(1)},
            {"type": "video.query", "text": "q1"},
            {"type": "video.query", "text": "q2"},
        ],
    )
    assert _errors(events) == [("server_error", None)]
    assert [e["status"] for e in events if e["type"] == "response.done"] == ["failed", "completed"]
    texts = [e["text"] for e in events if e["type"] == "response.text.done"]
    assert texts == ["turns1", "turns1 w1 w2 w3"]  # the failed answer is not history for q2
    assert events[-1]["type"] == "session.done"


def _pcm(samples: int) -> str:
    return base64.b64encode(np.full(samples, 1000, "<i2").tobytes()).decode()


def test_audio_overflow_is_an_error_that_clears_the_buffer(engine: ScriptedEngine) -> None:
    half_second = _pcm(8_000)
    events = _run(
        engine,
        [
            {"type": "session.config", "modalities": ["text"]},
            {"type": "video.frame", "data": _png(1)},
            {"type": "audio.chunk", "data": half_second},
            {"type": "audio.chunk", "data": half_second},
            {"type": "audio.chunk", "data": half_second},  # 1.5 s > 1 s: overflow
            {"type": "audio.chunk", "data": _pcm(4_000)},
            {"type": "video.query", "text": "", "audio_data": _pcm(2_000)},
            {"type": "video.query", "text": ""},  # no audio left: a question about the frames alone
            {"type": "ping"},
        ],
        max_video_audio_seconds=1.0,
    )
    assert _errors(events) == [("audio_buffer_full", "data")]
    overflow = next(e for e in events if e["type"] == "error")
    assert "the buffered audio and this chunk were dropped" in overflow["message"]
    start = next(e for e in events if e["type"] == "response.start")
    assert start["stats"]["audio_buffered_s"] == 0.375  # only what came after the overflow
    (audio,) = [m for m in engine.requests[0].turns[-1].media if m.kind == "audio"]
    assert audio.data.size == 6_000
    assert [m.kind for m in engine.requests[1].turns[-1].media] == ["video"]  # the first query took it
    assert "pong" in [e["type"] for e in events]


class ShortContextEngine(ScriptedEngine):
    """Refuses ``messages`` (before any output) when the prompt holds more than 3 turns."""

    async def _run(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        if len(request.turns) > 3:
            raise EngineError("the prompt is longer than this model's context", param="messages")
        async for item in super()._run(request):
            yield item


def test_when_the_history_outgrows_the_context_the_oldest_turns_leave_it() -> None:
    engine = ShortContextEngine()
    events = _run(
        engine,
        [
            {"type": "session.config", "modalities": ["text"]},
            *({"type": "video.query", "text": f"q{i}"} for i in range(1, 5)),
        ],
    )
    assert _errors(events) == []
    assert [e["text"] for e in events if e["type"] == "response.text.done"] == [
        "turns1 w1 w2 w3",
        "turns3 w1 w2 w3",
        "turns3 w1 w2 w3",  # q1 and its answer left: q2, a2, q3
        "turns3 w1 w2 w3",
    ]
    asked = [[t.text for t in r.turns] for r in engine.requests]
    assert asked[2:4] == [
        ["q1", "turns1 w1 w2 w3", "q2", "turns3 w1 w2 w3", "q3"],
        ["q2", "turns3 w1 w2 w3", "q3"],
    ]


def test_vllm_omnis_own_stage_defaults_are_accepted_as_a_list() -> None:
    """The three default_sampling_params of vLLM-Omni's deploy/qwen2_5_omni.yaml, copied by a client."""
    from omni_runtime.realtime.video.sampling import resolve_sampling

    thinker = {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 2048,
        "seed": 42,
        "repetition_penalty": 1.1,
    }
    talker = {
        "temperature": 0.9,
        "top_p": 0.8,
        "top_k": 40,
        "max_tokens": 2048,
        "seed": 42,
        "repetition_penalty": 1.05,
    }
    plan = resolve_sampling([thinker, talker, dict(thinker)], default_max_tokens=100, max_model_len=8192)
    assert plan.sampling == SamplingParams(**thinker)
    assert plan.stage_params["talker"] == {k: v for k, v in talker.items() if k != "seed"}
    assert plan.stage_params["talker_stream"] == thinker


def test_a_query_may_override_the_sessions_sampling_for_itself_only(engine: ScriptedEngine) -> None:
    _run(
        engine,
        [
            {"type": "session.config", "modalities": ["text"], "sampling_params_list": [{"max_tokens": 3}]},
            {"type": "video.query", "text": "q1", "stage_params": {"thinker": {"max_tokens": 1, "seed": 5}}},
            {"type": "video.query", "text": "q2"},
        ],
    )
    assert [(r.sampling.max_tokens, r.sampling.seed) for r in engine.requests] == [(1, 5), (3, None)]
