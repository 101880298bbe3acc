"""Qwen3-Omni-MoE speech through the staged pipeline equals transformers' own ``generate``.

The tiny random-weight checkpoint (MoE talker with a shared expert, a code predictor for 4
codebooks, Code2Wav at 24 kHz) runs through the real engine on the CPU:

- greedy talker frames (first codebook from the talker, the rest from the code predictor) equal
  the codes ``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)`` hands its
  Code2Wav, for text, audio, image, video and multi-turn prompts with a system turn (this checks
  which thinker positions and layer the talker reads, the projections, the codec special ids and
  speaker, the talker's rope, the suppressed ids and the per-step text feed), and the audio
  equals generate's waveform;
- Code2Wav windows: n frames give ``n * 1920 - lost`` samples (24 kHz, 12.5 frames a second);
  streamed windows equal one whole decode wherever their left context covers the receptive
  field (71 frames back per layer of the transformer's 72-frame sliding window, plus under 10
  frames of convolutions); the boundary effect of a shorter left context is measured; transformers' own
  ``chunked_decode`` with short chunks drops ``lost`` samples at every chunk boundary, which
  the right context of one frame avoids;
- rows batched in the talker's slots speak what they speak alone.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from engine_harness import (
    Harness,
    finished,
    image,
    request,
    tiny_options,
    token_ids,
    tone,
    video,
    video_with_soundtrack,
)

from omni_runtime.contract.engine import AudioChunk, ChatTurn, EngineError, GenerationRequest, SamplingParams
from omni_runtime.models.qwen3_omni_moe.adapter import CODEC_WINDOWS
from omni_runtime.pipeline.segmenter import CodecSegmenter, family_config

TALKER_STEPS = 20
_ids = itertools.count()


@pytest.fixture(scope="module")
def qwen3_speech(qwen3_checkpoint: Path) -> Iterator[Harness]:
    harness = Harness(tiny_options(qwen3_checkpoint, pipeline="speech"))
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def hf_model(hf_qwen3):
    return hf_qwen3


def _speech(turns: tuple[ChatTurn, ...], *, voice: str | None = None) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"q3-{next(_ids)}",
        turns=turns,
        sampling=SamplingParams(max_tokens=10, temperature=0.0),
        want_audio=True,
        voice=voice,
        stage_params={"talker": {"max_tokens": TALKER_STEPS, "temperature": 0.0}},
    )


def _ours(harness: Harness, req: GenerationRequest) -> tuple[list[int], list[tuple[int, ...]], np.ndarray]:
    """Text ids, the frames the vocoder was given and the audio of one non-streaming speech reply."""
    local = harness.engine.stages.local
    seen: list[list[Any]] = []
    original = local.synthesize

    async def spy(item: dict[str, Any]) -> Any:
        seen.append(list(item["codes"]))
        return await original(item)

    local.synthesize = spy
    try:
        events = harness.collect(req)
    finally:
        local.synthesize = original
    assert seen and all(codes == seen[0] for codes in seen)  # vocoded once the talker ended
    chunks = [e.pcm for e in events if isinstance(e, AudioChunk)]
    assert len(chunks) == 1
    return token_ids(events), [tuple(f) for f in seen[0]], chunks[0]


def _theirs(harness: Harness, hf_model, req: GenerationRequest, speaker: str):
    """transformers' generate on the same processor inputs: text ids, talker frames, waveform."""
    prompt = harness.engine.adapter.preprocess(req)
    ids = torch.tensor([prompt.input_ids])
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for part in (prompt.audio, prompt.images, prompt.videos):
        inputs.update(part or {})
    captured: dict[str, torch.Tensor] = {}
    decode = type(hf_model.code2wav).chunked_decode

    def spy(self, codes, **kwargs):
        captured["codes"] = codes.clone()
        return decode(self, codes, **kwargs)

    hf_model.code2wav.chunked_decode = spy.__get__(hf_model.code2wav)
    try:
        with torch.inference_mode():
            sequences, wav = hf_model.generate(
                **inputs,
                speaker=speaker,
                return_audio=True,
                thinker_max_new_tokens=10,
                thinker_eos_token_id=list(harness.engine.adapter.eos_token_ids),
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_max_new_tokens=TALKER_STEPS + 1,  # the last code drawn gets no frame
                use_audio_in_video=prompt.audio_in_video,
            )
    finally:
        del hf_model.code2wav.chunked_decode
    text = sequences[0, ids.shape[1] :].tolist()
    frames = [tuple(f) for f in captured["codes"][0].T.tolist()]
    return text, frames, wav[0, 0].numpy()


SYSTEM_MULTI_TURN = (
    ChatTurn(role="system", text="You are a helpful voice."),
    ChatTurn(role="user", text="Hello there.", media=(tone(0.3),)),
    ChatTurn(role="assistant", text="Hi! How can I help?"),
    ChatTurn(role="user", text="Describe this.", media=(image(seed=2),)),
)


@pytest.mark.parametrize(
    "turns",
    [
        request("Say something.").turns,
        request("What is this?", media=(tone(0.6),)).turns,
        request("What is this?", media=(image(),)).turns,
        request("What is this?", media=(video(),)).turns,
        request("What is this?", media=(tone(0.4), image(seed=3), video(seed=1))).turns,
        SYSTEM_MULTI_TURN,
        request("What is this?", media=(video_with_soundtrack(),)).turns,
    ],
    ids=["text", "audio", "image", "video", "audio-image-video", "system-multi-turn", "video-with-audio"],
)
def test_greedy_talker_frames_and_audio_equal_transformers_generate(
    qwen3_speech: Harness, hf_model, turns
) -> None:
    req = _speech(turns)
    ours_text, ours_frames, ours_audio = _ours(qwen3_speech, req)
    text, frames, wav = _theirs(qwen3_speech, hf_model, req, speaker="Ethan")
    eos = set(qwen3_speech.engine.adapter.eos_token_ids)
    assert ours_text == [t for t in text if t not in eos]
    assert len(frames[0]) == 4 and len(frames) > 0
    assert ours_frames == frames
    # The audio: generate decodes its frames in one chunk (under 300); ours in windows, each
    # with every earlier frame as context here (20 < 25 frames of left context).
    assert ours_audio.shape == wav.shape
    assert np.abs(ours_audio - wav).max() <= 1e-4 * np.abs(wav).max()


def test_the_voice_reaches_the_talker_as_its_speaker_id(qwen3_speech: Harness, hf_model) -> None:
    adapter = qwen3_speech.engine.adapter
    assert adapter.voices == ("Chelsie", "Ethan", "Aiden")
    assert adapter.default_voice == "Ethan"
    turns = request("Say something.").turns
    _, aiden, _ = _ours(qwen3_speech, _speech(turns, voice="aiden"))
    _, ethan, _ = _ours(qwen3_speech, _speech(turns))
    assert aiden == _theirs(qwen3_speech, hf_model, _speech(turns), speaker="Aiden")[1]
    assert aiden != ethan
    with pytest.raises(EngineError) as err:
        qwen3_speech.collect(_speech(turns, voice="Nobody"))
    assert err.value.param == "audio.voice"


# -- Code2Wav ------------------------------------------------------------------------------------
def _frames(count: int, seed: int = 0) -> list[tuple[int, ...]]:
    generator = torch.Generator().manual_seed(seed)
    return [tuple(row) for row in torch.randint(0, 2048, (count, 4), generator=generator).tolist()]


def _lost(config) -> int:
    """Samples a decode of n frames falls short of n * 1920: each decoder block's transposed
    convolution (kernel 2r, stride r) trims r samples at its end; the upsampling ones trim none."""
    length = 1
    for ratio in config.upsampling_ratios:
        length *= ratio
    for rate in config.upsample_rates:
        length = length * rate - rate
    return math.prod(config.upsampling_ratios + config.upsample_rates) - length


def _streamed(
    vocoder, frames: list[tuple[int, ...]], windows: dict[str, int]
) -> tuple[list[np.ndarray], list]:
    cuts = CodecSegmenter(family_config(windows)).push(len(frames), done=True)
    return vocoder.synthesize_many(
        [{"codes": frames, "window": asdict(w), "voice": "", "seed": 0} for w in cuts]
    ), cuts


def test_code2wav_gives_24_khz_and_n_times_1920_less_the_lost_tail(qwen3_speech: Harness) -> None:
    adapter = qwen3_speech.engine.adapter
    vocoder = adapter.vocoder()
    config = adapter.loaded.config.code2wav_config
    assert adapter.output_sample_rate == vocoder.sample_rate == 24000
    assert vocoder.samples_per_code == 1920  # 12.5 frames a second
    assert _lost(config) == 555
    for count in (1, 5, 13):
        audio = vocoder.decode(_frames(count))
        assert audio.dtype == np.float32 and audio.shape == (count * 1920 - 555,)
        assert np.isfinite(audio).all()


def test_streamed_windows_equal_one_whole_decode_where_their_context_covers_the_receptive_field(
    qwen3_speech: Harness,
) -> None:
    """200 frames (16 s): transformers' ``chunked_decode`` (300-frame chunks) is one whole decode
    here. Ours streams 4 frames, then 15 at a time, each window with one frame after it:

    - with 82 frames of left context (the tiny Code2Wav's one transformer layer reaches 71 frames
      back through its 72-frame sliding window; its causal convolutions about 9.4 more: kernel 7
      at 2 and 4 samples a frame, residual units of dilations 1, 3, 9 at 32 and 160, ...) every
      window equals the whole decode, later windows (whose context no longer reaches frame 0)
      included;
    - with the default 25 (as ``chunked_decode``) the windows whose context reaches frame 0 are
      equal; later ones differ by what their attention no longer sees: at most 1% of the peak on
      these random weights (0.4% measured); the stream has the whole decode's length either way;
    - ``chunked_decode`` itself with 15-frame chunks drops the 555-sample tail of every chunk.
    """
    adapter = qwen3_speech.engine.adapter
    vocoder, code2wav = adapter.vocoder(), adapter.loaded.code2wav
    frames = _frames(200, seed=1)
    codes = torch.tensor([frames]).transpose(1, 2)
    with torch.inference_mode():
        whole = code2wav(codes)[0, 0].numpy()
        hf_chunked = code2wav.chunked_decode(codes, chunk_size=300, left_context_size=25)[0, 0].numpy()
        hf_short = code2wav.chunked_decode(codes, chunk_size=15, left_context_size=25)[0, 0].numpy()
    peak = np.abs(whole).max()
    assert whole.shape == (200 * 1920 - 555,)
    np.testing.assert_array_equal(hf_chunked, whole)
    assert hf_short.shape == (200 * 1920 - 555 * math.ceil(200 / 15),)

    covered = 71 + 11
    pieces, cuts = _streamed(vocoder, frames, {**CODEC_WINDOWS, "left_context": covered})
    assert any(w.ctx_start > 0 for w in cuts)  # later windows really are cut short on the left
    streamed = np.concatenate(pieces)
    assert streamed.shape == whole.shape
    assert np.abs(streamed - whole).max() <= 1e-5 * peak

    pieces, cuts = _streamed(vocoder, frames, CODEC_WINDOWS)
    assert np.concatenate(pieces).shape == whole.shape
    for piece, window in zip(pieces, cuts, strict=True):
        span = whole[window.start * 1920 : window.start * 1920 + piece.size]
        error = np.abs(piece - span).max() / peak
        assert error <= (1e-5 if window.ctx_start == 0 else 1e-2), (window, error)


def test_rows_batched_in_the_talker_speak_what_they_speak_alone(qwen3_speech_engine: Harness) -> None:
    prompts = ["Tell me a short story.", "Hello, how are you today?", "What is in this image?"]

    def speech(prompt: str) -> GenerationRequest:
        # Sampled with a seed: the sampler draws per (seed, step), so a row's draws (talker and
        # code predictor) do not depend on the rows beside it.
        return request(prompt, max_tokens=10, want_audio=True, talker_tokens=30, temperature=1.0, seed=5)

    def audio(events) -> np.ndarray:
        assert finished(events).reason == "length"
        return np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])

    solo = [audio(qwen3_speech_engine.collect(speech(p))) for p in prompts]

    async def together() -> list[list[Any]]:
        async def one(p: str) -> list[Any]:
            return [e async for e in qwen3_speech_engine.engine.generate(speech(p))]

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    talker = qwen3_speech_engine.engine.stages.local.talker
    batched = [audio(events) for events in qwen3_speech_engine.run(together())]
    assert talker.max_running_batch >= 2  # the rows really shared talker steps
    for alone, shared in zip(solo, batched, strict=True):
        assert alone.shape == shared.shape and alone.size > 0
        assert np.abs(alone - shared).max() <= 1e-4 * np.abs(alone).max()


def test_the_talker_stage_loads_the_checkpoints_talker_and_code2wav(qwen3_speech: Harness, hf_model) -> None:
    """Every talker, code-predictor and Code2Wav weight as transformers loads it (the talker's
    per-expert weights stacked into its fused experts)."""
    loaded = qwen3_speech.engine.adapter.loaded
    for ours, theirs in ((loaded.talker, hf_model.talker), (loaded.code2wav, hf_model.code2wav)):
        mine, reference = ours.state_dict(), theirs.state_dict()
        assert mine.keys() == reference.keys()
        for name, tensor in reference.items():
            assert torch.equal(mine[name], tensor), name


def test_dummy_load_format_speaks_with_random_weights(qwen3_checkpoint: Path) -> None:
    harness = Harness(tiny_options(qwen3_checkpoint, load_format="dummy"))
    try:
        events = harness.collect(request("Hello there", max_tokens=5, want_audio=True, talker_tokens=12))
        audio = np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])
        assert audio.size > 0 and np.isfinite(audio).all()
        experts = [
            m for m in harness.engine.adapter.loaded.talker.modules() if type(m).__name__.endswith("Experts")
        ]
        assert experts and all(torch.isfinite(m.gate_up_proj).all() for m in experts)
    finally:
        harness.close()


def test_code2wav_forward_with_masks_built_beforehand_equals_transformers(qwen3_speech: Harness) -> None:
    """The graph-capturable forward (the transformer's masks built once per shape, outside a
    capture) gives transformers' ``Qwen3OmniMoeCode2Wav.forward`` exactly, batched and alone, and
    batched windows (the graph path's padding off the GPU) speak what each speaks alone."""
    vocoder = qwen3_speech.engine.adapter.vocoder()
    code2wav = qwen3_speech.engine.adapter.loaded.code2wav
    assert not vocoder.graphs.enabled  # CPU: every window eagerly
    for rows, length in ((1, 4), (3, 19), (2, 41)):
        frames = [_frames(length, seed=rows * 10 + r) for r in range(rows)]
        codes = torch.tensor(frames).transpose(1, 2)
        with torch.inference_mode():
            expected = code2wav(codes)
            mine = vocoder._forward(codes)
        torch.testing.assert_close(mine, expected, rtol=0, atol=0)
        assert (rows, length) in vocoder._masks
    streams = [_frames(60, seed=s) for s in range(3)]
    cuts = CodecSegmenter(family_config(CODEC_WINDOWS)).push(60, done=True)
    items = [
        {"codes": frames, "window": asdict(w), "voice": "", "seed": 0, "reusable": True}
        for w in cuts
        for frames in streams
    ]
    together = vocoder.synthesize_many(items)
    alone = [vocoder.synthesize_many([item])[0] for item in items]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * max(np.abs(b).max(), 1e-6))
