"""The speech half of the plain-HF baseline: the family's ``ForConditionalGeneration.generate`` with audio.

transformers' monolithic ``generate`` runs thinker -> talker -> vocoder in one call and returns
all audio at the end, for both families: ``Qwen2_5OmniForConditionalGeneration`` (talker ->
token2wav's DiT + BigVGAN) and ``Qwen3OmniMoeForConditionalGeneration`` (MoE talker + code
predictor -> Code2Wav, decoded in 300-frame chunks).

**Qwen2.5-Omni.** On random ("dummy") weights it needs three things a trained checkpoint never
exercises; each is done the way the runtime does it, so both sides do the same work:

- **Codes the DiT's table lacks.** The talker samples from its whole codec vocabulary (8448 ids
  in the released 7B), but token2wav's ``DiTCodecEmbedding`` has only ``num_embeds + 1`` rows
  (8194). A trained talker only emits audio codes; a random one emits ids >= 8194 within a few
  dozen steps, which is an ``IndexError`` on a CPU and a device-side assert on a GPU, reported
  at the next launch: the ``F.pad`` of the reflect-padded convolutions in the DiT's ECAPA speaker
  encoder, which runs right after the code embedding. ``generate`` hands
  the codes straight to token2wav, so a forward pre-hook on ``model.token2wav`` (a PyTorch hook;
  transformers is not edited) maps every code >= ``num_embeds`` to 0, exactly what the runtime's
  vocoder does before its DiT (``QwenVocoder._batch``). The talker's sampling is left as it is
  (the whole vocabulary, codec BOS suppressed by ``generate`` itself), as the runtime's is.
- **``talker_eos_token_id``** from the talker config (codec PAD and codec END, the runtime's
  ``codec_eos_ids``) instead of ``generate``'s hard-coded ``[8292, 8294]``, which are only right
  for the released vocabulary.
- **Speaker entries whose ``bos_token`` is a thinker-vocabulary id.** ``generate`` embeds it with
  the thinker's embedding table (it is the speaker's text-side start token). With no
  ``spk_dict.pt`` the runtime's loader makes ``tts_text_start_token_id`` entries with random
  ``cond``/``ref_mel``; this module uses that same loader function, so the speaker inputs match.

**Qwen3-Omni-MoE** needs two: the prompt in the chat layout its ``generate`` reads (it finds the
user turn and the assistant's start by ``<|im_start|>`` + role id and feeds the talker from them:
:func:`chat_prompt`), and a seeded init of the talker's experts, which transformers 5.23 leaves as
``torch.empty`` left them (the runtime's dummy loader does the same, ``tiny.init_experts``). Its
talker already suppresses every id above the codebook but its end code, so no code guard.

Fixed output length, like ``omni bench`` (``ignore_eos``): ``thinker_min_new_tokens`` =
``thinker_max_new_tokens`` and ``talker_min_new_tokens`` = ``talker_max_new_tokens`` (the min
keeps both models from stopping early on random EOS draws). The thinker decodes greedily, the
talker samples with ``generate``'s defaults (top-k 40, top-p 0.8, temperature 0.9).

Concurrency N is one ``generate`` call with a batch of N prompts: ``generate`` batches the
thinker and the talker, then runs token2wav once per row, one after another. Every request's
audio arrives when the call returns, so time to first audio = time to first token = latency.
Its row carries the same listener numbers as ``omni bench`` (`SpeechRun.listener_fields`): each
stream is one chunk of all its audio at that moment, so it never stalls once it starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from omni_runtime.bench.playback import Chunk, summarize_speech

SAMPLE_RATE = 24000  # Qwen2.5-Omni's BigVGAN and Qwen3-Omni's Code2Wav output rate
QWEN3 = "qwen3_omni_moe"


@dataclass
class CodeGuard:
    """Forward pre-hook on token2wav: codes the DiT's embedding table lacks become 0 (as the runtime)."""

    num_embeds: int
    replaced: int = 0  # codes mapped to 0 so far (how often a random talker hit the missing rows)

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import torch

        code = args[0] if args else kwargs["code"]
        outside = code >= self.num_embeds
        # One host sync per request; generate itself syncs at every step, so it does not show.
        self.replaced += int(outside.sum().item())
        code = torch.where(outside, torch.zeros_like(code), code)
        if args:
            return (code, *args[1:]), kwargs
        return args, {**kwargs, "code": code}


def prepare(model: Any, *, speakers: dict[str, dict[str, Any]]) -> CodeGuard | None:
    """Install the runtime's speaker entries and the code guard on a built speech model (Qwen2.5);
    seed the talker's experts (Qwen3, which needs no guard)."""
    if model.config.model_type == QWEN3:
        import torch

        from omni_runtime.models.qwen3_omni_moe.tiny import init_experts

        init_experts(model.talker, generator=torch.Generator().manual_seed(0))
        return None
    model.speaker_map = dict(speakers)
    guard = CodeGuard(num_embeds=int(model.config.token2wav_config.dit_config.num_embeds))
    model.token2wav.register_forward_pre_hook(guard, with_kwargs=True)
    return guard


def chat_prompt(ids: Any, config: Any) -> Any:
    """Qwen3: random ordinary ids laid out as one user turn and the assistant's start, in place.

    ``<|im_start|>user x ... x<|im_end|> x<|im_start|>assistant x`` where each ``x`` stays an
    ordinary id (the newlines of the real template are ordinary tokens too); needs 8 columns.
    """
    if ids.shape[1] < 8:
        raise ValueError(f"a Qwen3 chat prompt needs at least 8 tokens, got {ids.shape[1]}")
    ids[:, 0] = int(config.im_start_token_id)
    ids[:, 1] = int(config.user_token_id)
    ids[:, -5] = int(config.im_end_token_id)
    ids[:, -3] = int(config.im_start_token_id)
    ids[:, -2] = int(config.assistant_token_id)
    return ids


def generate_kwargs(config: Any, *, text_tokens: int, talker_tokens: int) -> dict[str, Any]:
    """The keyword arguments of every timed ``generate`` call (see the module docstring)."""
    talker = config.talker_config
    if config.model_type == QWEN3:
        return {
            "speaker": "Ethan",
            "return_audio": True,
            "thinker_max_new_tokens": text_tokens,
            "thinker_min_new_tokens": text_tokens,
            "thinker_do_sample": False,
            # The talker's last drawn code gets no frame: one more step makes talker_tokens frames,
            # what the runtime's talker max_tokens makes.
            "talker_max_new_tokens": talker_tokens + 1,
            "talker_min_new_tokens": talker_tokens + 1,
        }
    return {
        "speaker": "Chelsie",
        "thinker_max_new_tokens": text_tokens,
        "thinker_min_new_tokens": text_tokens,
        "thinker_do_sample": False,
        "talker_max_new_tokens": talker_tokens,
        "talker_min_new_tokens": talker_tokens,
        "talker_eos_token_id": [int(talker.tts_codec_pad_token_id), int(talker.tts_codec_end_token_id)],
    }


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class SpeechRun:
    concurrency: int
    latency_s: float
    samples: list[int]  # audio samples per request, at SAMPLE_RATE
    codes_replaced: int

    def listener_fields(self) -> dict[str, Any]:
        """TTFA percentiles, stall, RTF, real-time streams, audio s/s: ``omni bench``'s speech fields."""
        timelines = [[Chunk(self.latency_s, n / SAMPLE_RATE)] for n in self.samples]
        return summarize_speech(timelines, wall_s=self.latency_s).row_fields()

    def extras(self, *, text_tokens: int, talker_tokens: int) -> dict[str, Any]:
        """What ``omni bench``'s row format has no field for: audio amounts and rates."""
        audio_s = sum(self.samples) / SAMPLE_RATE
        return {
            "label": "hf-generate-speech",
            "concurrency": self.concurrency,
            "requests": self.concurrency,
            "text_tokens": text_tokens,
            "talker_tokens": talker_tokens,
            "sample_rate": SAMPLE_RATE,
            "samples_per_request": self.samples,
            "audio_s": audio_s,
            "audio_s_per_wall_s": audio_s / self.latency_s,
            "time_to_first_audio_s": self.latency_s,  # all audio arrives when generate returns
            "latency_s": self.latency_s,
            "codes_replaced": self.codes_replaced,
        }


def time_speech(
    model: Any,
    guard: CodeGuard | None,
    ids: Any,
    *,
    text_tokens: int,
    talker_tokens: int,
    warmup: bool = True,
) -> SpeechRun:
    """One warm-up call with a few tokens at the same batch, then the timed call."""
    import torch

    mask = torch.ones_like(ids)
    if warmup:
        short = generate_kwargs(model.config, text_tokens=2, talker_tokens=4)
        model.generate(input_ids=ids, attention_mask=mask, **short)
    kwargs = generate_kwargs(model.config, text_tokens=text_tokens, talker_tokens=talker_tokens)
    before = guard.replaced if guard else 0
    synchronize(ids.device)
    start = time.perf_counter()
    _, audio = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    synchronize(ids.device)
    latency = time.perf_counter() - start
    waves = [audio] if torch.is_tensor(audio) else list(audio)  # batch 1 returns one tensor
    return SpeechRun(
        concurrency=int(ids.shape[0]),
        latency_s=latency,
        samples=[int(w.numel()) for w in waves],
        codes_replaced=guard.replaced - before if guard else 0,
    )
