"""The staged pipeline computes what transformers' monolithic ``generate`` computes.

Greedy text with image, audio and video inputs must equal ``thinker.generate`` (checks the
embedding scatter, the 3D mrope positions and the runtime-managed cache); greedy codec tokens of
the talker must equal the transformers talker fed the way ``generate`` feeds it (checks how
thinker hidden states are handed to the talker, step by step).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_harness import (
    Harness,
    image,
    interleaved,
    request,
    tiny_options,
    token_ids,
    tone,
    video,
    video_with_soundtrack,
)

from omni_runtime.contract.engine import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoint: Path):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(
        str(tiny_checkpoint), dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def speech_whole(tiny_checkpoint: Path) -> Iterator[Harness]:
    harness = Harness(tiny_options(tiny_checkpoint, pipeline="speech"))
    yield harness
    harness.close()


def _hf_inputs(harness: Harness, req: GenerationRequest) -> dict:
    prompt = harness.engine.adapter.preprocess(req)
    ids = torch.tensor([prompt.input_ids])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for part in (prompt.audio, prompt.images, prompt.videos):
        inputs.update(part or {})
    return inputs


@pytest.mark.parametrize(
    "media",
    [(), (image(),), (tone(0.6),), (tone(1.7), tone(0.3)), (video(),), (tone(0.4), image(seed=3))],
    ids=["text", "image", "audio", "two-audios", "video", "audio-image"],
)
def test_greedy_text_equals_transformers_generate(speech_whole: Harness, hf_model, media) -> None:
    req = request("What is this?", max_tokens=10, media=media, ignore_eos=False)
    ours = token_ids(speech_whole.collect(req))
    inputs = _hf_inputs(speech_whole, req)
    with torch.inference_mode():
        out = hf_model.thinker.generate(**inputs, max_new_tokens=10, do_sample=False)
    theirs = out[0, inputs["input_ids"].shape[1] :].tolist()
    eos = set(speech_whole.engine.adapter.eos_token_ids)
    assert ours == [t for t in theirs if t not in eos]


@pytest.mark.parametrize(
    "media",
    # 4 s: Qwen2.5 interleaves per 2 s chunk (each chunk's frames, then its audio).
    [(video_with_soundtrack(seconds=4.0),), (tone(0.5), video_with_soundtrack(seconds=4.0, seed=2))],
    ids=["video-with-audio", "audio-then-video-with-audio"],
)
def test_audio_in_video_equals_transformers_generate(speech_whole: Harness, hf_model, media) -> None:
    """use_audio_in_video: the soundtrack's tokens interleaved with the frames' by time (in 2 s
    chunks), and get_rope_index told so, as ``generate(use_audio_in_video=True)`` does."""
    req = request("What is this?", max_tokens=10, media=media, ignore_eos=False)
    ours = token_ids(speech_whole.collect(req))
    prompt = speech_whole.engine.adapter.preprocess(req)
    assert prompt.audio_in_video and interleaved(speech_whole.engine.adapter, prompt.input_ids)
    inputs = _hf_inputs(speech_whole, req)
    with torch.inference_mode():
        out = hf_model.thinker.generate(**inputs, use_audio_in_video=True, max_new_tokens=10, do_sample=False)
    theirs = out[0, inputs["input_ids"].shape[1] :].tolist()
    eos = set(speech_whole.engine.adapter.eos_token_ids)
    assert ours == [t for t in theirs if t not in eos]


def _reference_talker_codes(
    hf_model, inputs: dict, *, thinker_tokens: int, steps: int, use_audio_in_video: bool = False
) -> tuple[list, list]:
    """Greedy thinker + talker, wired as ``Qwen2_5OmniForConditionalGeneration.generate`` wires them.

    The talker is stepped by hand: in transformers 5.23 ``generate`` drops the talker's attention
    mask, which skips the branch of ``Qwen2_5OmniTalkerForConditionalGeneration.forward`` that
    adds the codec PAD/BOS embeddings and computes the TMRoPE positions; passing the mask runs the
    model as designed (and as the released Qwen2.5-Omni code does).
    """
    from transformers import DynamicCache

    thinker, talker = hf_model.thinker, hf_model.talker
    ids = inputs["input_ids"]
    result = thinker.generate(
        **inputs, max_new_tokens=thinker_tokens, do_sample=False, output_hidden_states=True,
        return_dict_in_generate=True, use_audio_in_video=use_audio_in_video,
    )  # fmt: skip
    text = result.sequences[0, ids.shape[1] :].tolist()
    hidden = result.hidden_states
    embeds = [step[0] for step in hidden]
    last = [step[-1] for step in hidden]
    speaker = hf_model.speaker_map["Chelsie"]
    table = thinker.get_input_embeddings()

    def token_embed(token: int) -> torch.Tensor:
        return table(torch.tensor([[token]]))

    reply = torch.cat(last[1:], dim=1) + torch.cat(embeds[1:], dim=1)
    prompt = torch.cat([last[0] + embeds[0], token_embed(speaker["bos_token"]), reply[:, :1]], dim=1)
    reply = torch.cat(
        [reply[:, 1:], token_embed(talker.text_eos_token), token_embed(talker.text_pad_token)], dim=1
    )
    text_ids = torch.cat([ids, torch.tensor([[speaker["bos_token"], text[0]]])], dim=1)
    codec_ids = [talker.codec_mask_token] * ids.shape[1] + [talker.codec_pad_token, talker.codec_bos_token]
    ends = {talker.codec_pad_token, talker.codec_eos_token}
    talker.rope_deltas = None
    cache, codes, history = DynamicCache(config=talker.config), [], list(codec_ids)
    # The media geometry and use_audio_in_video, as generate hands them to the talker.
    media = {
        key: inputs[key]
        for key in ("image_grid_thw", "video_grid_thw", "video_second_per_grid")
        if key in inputs
    }
    if "feature_attention_mask" in inputs:
        media["audio_feature_lengths"] = inputs["feature_attention_mask"].sum(dim=1)
    out = talker(
        input_ids=torch.tensor([codec_ids]), inputs_embeds=prompt.clone(), attention_mask=torch.ones(1, len(codec_ids)),
        input_text_ids=text_ids, use_cache=True, past_key_values=cache, thinker_reply_part=reply,
        use_audio_in_video=use_audio_in_video, **media,
    )  # fmt: skip
    for step in range(steps):
        scores = out.logits[0, -1].clone()
        seen = torch.tensor(sorted(set(history)))
        scores[seen] = torch.where(scores[seen] < 0, scores[seen] * 1.05, scores[seen] / 1.05)
        scores[talker.codec_bos_token] = float("-inf")
        code = int(scores.argmax())
        if code in ends:
            break
        codes.append(code)
        history.append(code)
        if step + 1 == steps:
            break
        out = talker(
            input_ids=torch.tensor([[code]]), attention_mask=torch.ones(1, len(history)), use_cache=True,
            past_key_values=out.past_key_values, thinker_reply_part=out.thinker_reply_part,
        )  # fmt: skip
    return text, codes


@pytest.mark.parametrize(
    "media", [(), (video_with_soundtrack(seconds=4.0),)], ids=["text", "video-with-audio"]
)
def test_greedy_codec_tokens_equal_the_transformers_talker(speech_whole: Harness, hf_model, media) -> None:
    # With the video the tiny talker settles into repeating one code by step 12, and at step 27
    # another code wins by a hair (float summation order, ours vs transformers' cache): 24 steps.
    talker_steps = 24 if media else 30
    req = GenerationRequest(
        request_id=f"hf-talker-{len(media)}",
        turns=request("Say something.", media=media).turns,
        sampling=SamplingParams(max_tokens=12, temperature=0.0),
        want_audio=True,
        stage_params={"talker": {"max_tokens": talker_steps, "temperature": 0.0}},
    )
    local = speech_whole.engine.stages.local
    seen: list[list[int]] = []
    original = local.synthesize

    async def spy(item):
        seen.append(list(item["codes"]))
        return await original(item)

    local.synthesize = spy
    talker = local.talker
    rows_before, calls_before = talker.rows_stepped, talker.thread.calls
    try:
        ours_text = token_ids(speech_whole.collect(req))
    finally:
        local.synthesize = original
    # The speech pipeline vocodes once the talker has ended: every window sees all the codes.
    assert seen and all(codes_seen == seen[0] for codes_seen in seen)
    # Once the text is known the talker free-runs several steps per thread call (same codes).
    assert talker.rows_stepped - rows_before > talker.thread.calls - calls_before
    with torch.inference_mode():
        text, codes = _reference_talker_codes(
            hf_model, _hf_inputs(speech_whole, req), thinker_tokens=12, steps=talker_steps,
            use_audio_in_video=bool(media),
        )  # fmt: skip
    eos = set(speech_whole.engine.adapter.eos_token_ids)
    assert ours_text == [t for t in text if t not in eos]
    assert seen[0] == codes
