"""Pure pieces of the realtime package: resampling, VAD state machine, history trimming, outbox."""

from __future__ import annotations

import json

import numpy as np
import pytest

from omni_runtime.contract.engine import ChatTurn
from omni_runtime.media.resample import resample
from omni_runtime.realtime.audio import StreamingResampler, decode_b64, pcm16_to_float
from omni_runtime.realtime.errors import ProtocolError
from omni_runtime.realtime.outbox import Outbox
from omni_runtime.realtime.session.conversation import (
    Conversation,
    Item,
    Part,
    trim_to_played,
    window_start,
)
from omni_runtime.realtime.session.turn_detection import (
    SpeechLong,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)


@pytest.mark.parametrize(
    ("orig", "target"), [(24_000, 16_000), (16_000, 24_000), (44_100, 16_000), (16_000, 16_000)]
)
def test_streaming_resampler_equals_one_shot(orig: int, target: int) -> None:
    rng = np.random.default_rng(7)
    signal = (0.3 * rng.standard_normal(7001)).astype(np.float32)
    resampler = StreamingResampler(orig_sr=orig, target_sr=target)
    pieces, start = [], 0
    while start < signal.size:
        size = int(rng.integers(1, 900))
        pieces.append(resampler.push(signal[start : start + size]))
        start += size
    pieces.append(resampler.flush())
    streamed = np.concatenate(pieces)
    whole = resample(signal, orig_sr=orig, target_sr=target)
    assert streamed.shape == whole.shape
    np.testing.assert_allclose(streamed, whole, atol=1e-6)


def test_decode_b64_refuses_bad_input_with_codes() -> None:
    with pytest.raises(ProtocolError) as bad:
        decode_b64("not base64!!", param="audio", max_bytes=100)
    assert bad.value.code == "invalid_base64"
    with pytest.raises(ProtocolError) as big:
        decode_b64("A" * 400, param="audio", max_bytes=100)
    assert big.value.code == "event_too_large"
    with pytest.raises(ProtocolError) as odd:
        pcm16_to_float(b"\x00\x01\x02", param="audio")
    assert odd.value.code == "invalid_audio"
    assert pcm16_to_float(b"\x00\x80\xff\x7f", param="audio").tolist() == [-1.0, 32767 / 32768]


def test_turn_detector_events_and_hysteresis() -> None:
    detector = TurnDetector(threshold=0.5, silence_duration_ms=96, long_speech_ms=128)
    # 2 silent frames, speech for 6 frames with a dip to 0.4 (above 0.5-0.15: still speech), 3 silent frames.
    probs = [0.1, 0.2, 0.9, 0.9, 0.4, 0.9, 0.9, 0.9, 0.1, 0.1, 0.1]
    events = [event for p in probs if (event := detector.feed(p)) is not None]
    assert events == [
        SpeechStarted(audio_start_ms=64),
        SpeechLong(audio_start_ms=64, speech_ms=128),
        SpeechStopped(audio_start_ms=64, audio_end_ms=352, speech_end_ms=256),
    ]
    assert not detector.in_speech


def test_trim_to_played_cuts_at_word_boundaries() -> None:
    text = "one two three four five six seven eight"
    assert trim_to_played(text, played_ms=None, total_ms=1000) == text
    assert trim_to_played(text, played_ms=1000, total_ms=1000) == text
    assert trim_to_played(text, played_ms=0, total_ms=1000) == ""
    assert trim_to_played(text, played_ms=500, total_ms=1000) == "one two three four"
    assert trim_to_played(text, played_ms=250, total_ms=1000) == "one two"


def test_conversation_turns_order_history_and_budget() -> None:
    conv = Conversation(max_items=10)
    conv.add(Item(id="a", role="user", content=[Part(type="input_text", text="hello")]))
    conv.add(
        Item(
            id="b",
            role="assistant",
            content=[Part(type="output_audio", transcript="hi there friend", audio_ms=900)],
        )
    )
    conv.add(Item(id="c", role="user", content=[Part(type="input_text", text="again")]))
    conv.add(
        Item(id="first", role="system", content=[Part(type="input_text", text="be brief")]),
        previous_item_id="root",
    )
    conv.get("b").played_ms = 300
    assert conv.turns(instructions="sys", token_budget=1000) == (
        ChatTurn(role="system", text="sys"),
        ChatTurn(role="system", text="be brief"),
        ChatTurn(role="user", text="hello"),
        ChatTurn(role="assistant", text="hi"),
        ChatTurn(role="user", text="again"),
    )
    # A tiny budget keeps only the newest item.
    assert conv.turns(instructions="", token_budget=1) == (ChatTurn(role="user", text="again"),)
    conv.delete("c")
    with pytest.raises(ProtocolError) as missing:
        conv.get("c")
    assert missing.value.code == "item_not_found"


def test_conversation_drops_oldest_past_item_cap() -> None:
    conv = Conversation(max_items=2)
    for name in "abc":
        conv.add(Item(id=name, role="user", content=[Part(type="input_text", text=name)]))
    assert [item.id for item in conv.items] == ["b", "c"]


async def test_outbox_beta_names_epoch_filter_and_replay() -> None:
    stale: list[int] = []
    box = Outbox(
        beta=True, keep_log=True, max_log_events=100, max_log_bytes=1 << 20, on_stale=lambda: stale.append(1)
    )
    box.emit("response.output_audio.delta", epoch=0, delta="a")
    box.emit("conversation.item.added", item={"content": [{"type": "output_text", "text": "x"}]})
    box.emit("conversation.item.done", item={})  # not a beta event: skipped
    box.bump_epoch()
    box.emit("response.output_audio.delta", epoch=1, delta="b")
    sent = [json.loads(await box.next_text()) for _ in range(2)]
    assert [event["type"] for event in sent] == ["conversation.item.created", "response.audio.delta"]
    assert sent[0]["item"]["content"][0]["type"] == "text"
    assert sent[1]["delta"] == "b" and sent[1]["epoch"] == 1
    assert stale == [1]
    box.detach()
    box.emit("response.done", response={})
    replayed, complete = box.attach(last_event_id="event_2")
    assert (replayed, complete) == (
        2,
        True,
    )  # event_3 (epoch 1 delta) and event_4; the stale delta is not replayed
    assert [json.loads(await box.next_text())["event_id"] for _ in range(2)] == ["event_3", "event_4"]


async def test_outbox_log_is_bounded_and_reports_gaps() -> None:
    box = Outbox(beta=False, keep_log=True, max_log_events=3, max_log_bytes=1 << 20)
    for index in range(6):
        box.emit("session.updated", session={"n": index})
    box.detach()
    replayed, complete = box.attach(last_event_id="event_1")
    assert (replayed, complete) == (3, False)


def test_the_realtime_package_does_not_import_torch() -> None:
    """Only realtime.session.vad imports torch, and only when a session turns server VAD on."""
    import subprocess
    import sys

    code = (
        "import sys, omni_runtime.realtime, omni_runtime.realtime.session.session, omni_runtime.realtime.video.endpoint, "
        "omni_runtime.realtime.streaming_input.manager; print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("costs", "budget", "sticky", "expected"),
    [
        ([], 10, None, 0),
        ([3, 3, 3], 10, None, 0),  # everything fits
        ([3, 3, 3, 3], 10, None, 1),  # no window yet: the newest items that fill the budget
        ([3, 3, 3, 3], 10, 0, 3),  # the window overflows: it moves on to half the budget at once
        ([3, 3, 3], 10, 1, 1),  # items before the window stay out while the window fits
        ([3, 3, 3, 1], 10, 1, 1),  # the window keeps its start as the conversation grows
        ([3, 3, 3, 3, 3], 10, 1, 4),
        ([2, 2, 2, 2, 2, 2], 10, 0, 4),  # refilled to 4 of 10: room for 3 more turns
        ([20, 3], 10, None, 1),  # an item larger than the budget is left out
        ([3, 20], 10, 0, 1),  # the newest item is always in, even past the budget
        ([4, 4, 4], 6, 0, 2),  # nothing fits in half the budget but the newest item
    ],
)
def test_window_start_moves_rarely(costs, budget, sticky, expected) -> None:
    assert window_start(costs, budget=budget, sticky=sticky) == expected


def test_a_sticky_window_keeps_the_prompt_prefix_between_moves() -> None:
    """Each turn adds an item of 10 tokens under a budget of 60: a window that slid every turn
    would change the prompt right after the instructions; the sticky one moves twice in 12 turns."""
    conv = Conversation(max_items=100)
    firsts = []
    for i in range(12):
        text = f"item {i:02d} ".ljust(24, "x")  # 24 characters: 6 tokens, plus 4 per item
        conv.add(Item(id=f"u{i}", role="user", content=[Part(type="input_text", text=text)]))
        firsts.append(conv.turns(instructions="", token_budget=60, window="response")[0].text[:7])
    assert firsts == ["item 00"] * 6 + ["item 04"] * 4 + ["item 08"] * 2
    # Unnamed, the window holds the newest items that fit: its first item moves every turn.
    assert conv.turns(instructions="", token_budget=60)[0].text[:7] == "item 06"
    # A deleted first item: the window starts afresh.
    conv.delete("u8")
    assert conv.turns(instructions="", token_budget=60, window="response")[0].text[:7] == "item 05"
