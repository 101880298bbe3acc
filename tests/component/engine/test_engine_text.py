"""Text generation through the real pipeline: tokens, usage, media inputs, errors, seeds."""

from __future__ import annotations

import pytest
from engine_harness import Harness, finished, image, request, token_ids, tone, video

from omni_runtime.contract.engine import EngineError, Finished, TextDelta


def test_text_generation_streams_tokens_and_finishes_with_usage(speech_engine: Harness) -> None:
    events = speech_engine.collect(request(max_tokens=12))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    done = finished(events)
    assert done.reason == "length"
    assert done.usage.completion_tokens == 12
    assert done.usage.prompt_tokens > 10
    assert len(token_ids(events)) <= 12
    assert len(deltas) >= 2, "text must stream as several deltas, not one aggregate"
    assert all(isinstance(e, TextDelta) for e in events[:-1])


def test_stop_string_ends_generation_without_the_stop_text(speech_engine: Harness) -> None:
    free = speech_engine.collect(request(max_tokens=24))
    text = "".join(e.text for e in free if isinstance(e, TextDelta))
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), "need a visible stop string from the greedy text"
    events = speech_engine.collect(request(max_tokens=24, stop=(stop,)))
    stopped = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert stopped == text[: text.index(stop)]
    assert finished(events).reason == "stop"


@pytest.mark.parametrize(
    ("kind", "media"),
    [
        ("audio", (tone(1.0),)),
        ("image", (image(),)),
        ("video", (video(),)),
        ("all", (tone(0.5), image(), video())),
    ],
)
def test_media_inputs_add_prompt_tokens_and_run_the_encoders(
    speech_engine: Harness, kind: str, media
) -> None:
    stages = speech_engine.engine.stages.local
    speech_engine.forget_encodings()  # the same media in an earlier case would be encoder-cache hits
    audio_before, vision_before = stages.audio.batches, stages.vision.batches
    plain = finished(speech_engine.collect(request("Describe it.", max_tokens=2))).usage.prompt_tokens
    events = speech_engine.collect(request("Describe it.", max_tokens=2, media=media))
    with_media = finished(events).usage.prompt_tokens
    assert with_media > plain + 4
    wants_audio = kind in ("audio", "all")
    wants_vision = kind in ("image", "video", "all")
    assert (stages.audio.batches > audio_before) == wants_audio
    assert (stages.vision.batches > vision_before) == wants_vision


def test_seed_makes_sampling_reproducible(speech_engine: Harness) -> None:
    first = token_ids(speech_engine.collect(request(max_tokens=16, temperature=1.0, seed=1234)))
    again = token_ids(speech_engine.collect(request(max_tokens=16, temperature=1.0, seed=1234)))
    other = token_ids(speech_engine.collect(request(max_tokens=16, temperature=1.0, seed=4321)))
    assert first == again
    assert first != other


def test_prompt_longer_than_the_model_context_is_a_messages_error(speech_engine: Harness) -> None:
    with pytest.raises(EngineError) as err:
        speech_engine.collect(request("word " * 2000, max_tokens=2))
    assert err.value.param == "messages"


def test_unknown_voice_is_an_audio_voice_error(speech_engine: Harness) -> None:
    bad = request(want_audio=True)
    bad = type(bad)(**{**bad.__dict__, "voice": "Nobody"})
    with pytest.raises(EngineError) as err:
        speech_engine.collect(bad)
    assert err.value.param == "audio.voice"


def test_stats_report_an_idle_engine_after_requests(speech_engine: Harness) -> None:
    speech_engine.collect(request(max_tokens=3))
    stats = speech_engine.engine.stats()
    assert stats.active_requests == 0
    assert stats.running_batch == 0
    assert stats.max_running_batch >= 1
    assert isinstance(finished(speech_engine.collect(request(max_tokens=1))), Finished)
