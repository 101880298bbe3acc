"""Stage payloads survive the trip through a stage-link frame unchanged."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from omni_runtime.contract.adapter import Prompt, RowSampling, TalkerAdmission, ThinkerPrompt
from omni_runtime.contract.engine import ChatTurn, GenerationRequest, MediaInput, SamplingParams
from omni_runtime.pipeline import wire
from omni_runtime.pipeline.link.frames import (
    FrameType,
    decode_tensors,
    encode_tensors,
    read_frame,
    write_frame,
)


def _over_the_wire(tensors: dict) -> dict:
    specs, views = encode_tensors(tensors)
    return decode_tensors(specs, bytearray(b"".join(bytes(v) for v in views)))


def test_generation_request_round_trip() -> None:
    audio = MediaInput(kind="audio", data=np.arange(8, dtype=np.float32), sample_rate=16000)
    request = GenerationRequest(
        request_id="r1",
        turns=(ChatTurn(role="system", text="be brief"), ChatTurn(role="user", text="hi", media=(audio,))),
        sampling=SamplingParams(max_tokens=5, temperature=0.5, stop=("x", "y"), seed=3),
        want_audio=True,
        voice="Ethan",
        stage_params={"talker": {"max_tokens": 9}},
    )
    payload, tensors = wire.pack_request(request)
    back = wire.unpack_request(payload, _over_the_wire(tensors))
    assert back.sampling == request.sampling
    assert back.turns[0] == request.turns[0]
    np.testing.assert_array_equal(back.turns[1].media[0].data, audio.data)
    assert (back.voice, back.want_audio, back.stage_params) == ("Ethan", True, {"talker": {"max_tokens": 9}})


def test_a_videos_soundtrack_and_the_audio_in_video_flag_cross_the_wire() -> None:
    from omni_runtime.models.common import audio_in_video, rope_context

    track = np.linspace(-1, 1, 32, dtype=np.float32)
    video = MediaInput(kind="video", data=np.zeros((2, 4, 4, 3), np.uint8), fps=2.0, soundtrack=track)
    request = GenerationRequest(request_id="r2", turns=(ChatTurn(role="user", text="hi", media=(video,)),))
    back = wire.unpack_request(*_unpack(wire.pack_request(request)))
    np.testing.assert_array_equal(back.turns[0].media[0].soundtrack, track)
    plain = wire.unpack_request(
        *_unpack(
            wire.pack_request(GenerationRequest(request_id="r3", turns=(ChatTurn(role="user", text="hi"),)))
        )
    )
    assert plain.turns[0].media == ()
    prompt = Prompt(input_ids=[1], audio_in_video=True)
    assert wire.unpack_prompt(*_unpack(wire.pack_prompt(prompt))).audio_in_video is True
    assert wire.unpack_prompt(*_unpack(wire.pack_prompt(Prompt(input_ids=[1])))).audio_in_video is False
    tp = ThinkerPrompt(
        input_ids=[1],
        embeds=torch.zeros(1, 2),
        positions=torch.zeros(3, 1, dtype=torch.long),
        rope_delta=0,
        talker_context=rope_context(prompt),
    )
    assert audio_in_video(wire.unpack_thinker_prompt(*_unpack(wire.pack_thinker_prompt(tp))).talker_context)
    assert not audio_in_video(rope_context(Prompt(input_ids=[1])))


def test_prompt_and_thinker_prompt_round_trip() -> None:
    prompt = Prompt(
        input_ids=[1, 2, 3],
        images={"pixel_values": torch.ones(4, 6), "image_grid_thw": torch.tensor([[1, 2, 2]])},
    )
    back = wire.unpack_prompt(*_unpack(wire.pack_prompt(prompt)))
    assert back.input_ids == [1, 2, 3] and back.audio is None and back.videos is None
    assert torch.equal(back.images["image_grid_thw"], prompt.images["image_grid_thw"])
    tp = ThinkerPrompt(
        input_ids=[5, 6],
        embeds=torch.randn(2, 4).bfloat16(),
        positions=torch.zeros(3, 2, dtype=torch.long),
        rope_delta=-3,
        talker_context={"image_grid_thw": torch.tensor([[1, 2, 2]])},
    )
    back2 = wire.unpack_thinker_prompt(*_unpack(wire.pack_thinker_prompt(tp)))
    assert back2.rope_delta == -3 and back2.embeds.dtype == torch.bfloat16
    assert torch.equal(back2.embeds, tp.embeds)
    assert torch.equal(back2.talker_context["image_grid_thw"], tp.talker_context["image_grid_thw"])


def test_talker_admission_round_trip() -> None:
    adm = TalkerAdmission(
        slot=-1,
        input_ids=[1, 2],
        talker_context={},
        prompt_vectors=torch.randn(2, 4),
        first_token=7,
        first_vector=torch.randn(4),
        voice="Chelsie",
        sampling=RowSampling(temperature=0.9, top_k=40, seed=1),
        ignore_eos=True,
    )
    back = wire.unpack_talker_admission(*_unpack(wire.pack_talker_admission(adm)))
    assert back.sampling == adm.sampling and back.first_token == 7 and back.voice == "Chelsie"
    assert back.ignore_eos is True  # a remote talker speaks its whole budget too
    assert torch.equal(back.prompt_vectors, adm.prompt_vectors)


def _unpack(frame: tuple[dict, dict]) -> tuple[dict, dict]:
    payload, tensors = frame
    return payload, _over_the_wire(tensors)


class _Bytes(bytearray):
    """What write_frame needs of a StreamWriter: write()."""

    def write(self, data: bytes | memoryview) -> None:
        self.extend(data)


def _through_a_frame(payload: dict, tensors: dict) -> tuple[dict, dict]:
    sent = _Bytes()
    write_frame(sent, FrameType.REQUEST, 1, payload, tensors)  # type: ignore[arg-type]

    async def read() -> tuple[dict, dict]:
        reader = asyncio.StreamReader()
        reader.feed_data(bytes(sent))
        reader.feed_eof()
        frame = await read_frame(reader)
        assert frame is not None
        return frame.meta, frame.tensors

    return asyncio.run(read())


@pytest.mark.parametrize("seed", [0, 2**31, 2**64 + 5, 2**70, -(2**65)])
def test_any_seed_the_api_takes_crosses_a_frame(seed: int) -> None:
    """The API takes any integer seed (the sampler keeps its low 31 bits); a stage-link frame
    (written and read by link.frames) carries integers past 64 bits unchanged."""
    request = GenerationRequest(
        request_id="r", turns=(ChatTurn(role="user", text="hi"),), sampling=SamplingParams(seed=seed)
    )
    back = wire.unpack_request(*_through_a_frame(*wire.pack_request(request)))
    assert back.sampling.seed == seed
