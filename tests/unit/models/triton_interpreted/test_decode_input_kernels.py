"""executor.decode_inputs' kernels run by Triton's interpreter on CPU tensors, against
transformers' own Qwen3-Omni thinker rotary embedding and RMSNorm (on a GPU the rotary must match
bit for bit, which decode_inputs checks when it builds them and tests/gpu/test_moe_decode_cuda.py
asserts). Collected only under TRITON_INTERPRET=1 (tests/unit/models/test_moe_decode.py starts
that pytest)."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

from omni_runtime.executor.decode_inputs import FinalNorm, StepInputs

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1 (see the docstring)"


def _text_config():
    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.head_dim, text.hidden_size = 128, 256
    return text


@pytest.mark.parametrize(
    ("lengths", "delta", "max_len", "view"),
    [
        ([0], [0], 64, 64),
        ([5, 63, 70, 2], [0, -3, 12, 1000], 64, 64),  # a stale padding row past max_len is clamped
        ([1500, 4000], [-900, 0], 8192, 2048),  # a view of two mask rounds
    ],
)
def test_step_inputs_equal_the_modules(lengths, delta, max_len, view) -> None:
    """The write positions, cos and sin of each row's rotary position (transformers' rotary of the
    same position in all three mrope sections), and the mask rows, as slot_cache computed them."""
    rotary = hf.Qwen3OmniMoeThinkerTextRotaryEmbedding(_text_config())
    lengths_t, delta_t = torch.tensor(lengths), torch.tensor(delta)
    fast = StepInputs(rotary.inv_freq, rotary.attention_scaling, torch.bfloat16, max_len)
    write, (cos, sin), mask = fast(lengths_t, delta_t, view)
    expected_write = lengths_t.clamp(max=max_len - 1)
    rows = len(lengths)
    hidden = torch.zeros(rows, 1, 8, dtype=torch.bfloat16)
    expected_cos, expected_sin = rotary(
        hidden, (expected_write + delta_t).view(1, rows, 1).expand(3, rows, 1)
    )
    assert torch.equal(write, expected_write)
    assert cos.shape == expected_cos.shape == (rows, 1, 128) and cos.dtype == expected_cos.dtype
    # numpy's cos and sin under the interpreter: within a bfloat16 step (the GPU's are bit-exact)
    torch.testing.assert_close(cos, expected_cos, rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(sin, expected_sin, rtol=8e-3, atol=8e-3)
    expected_mask = (torch.arange(view)[None, :] <= expected_write[:, None])[:, None, None, :]
    assert torch.equal(mask, expected_mask)


def test_final_norm_equals_the_module() -> None:
    text = _text_config()
    norm = hf.Qwen3OmniMoeThinkerTextRMSNorm(text.hidden_size, eps=text.rms_norm_eps).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(text.hidden_size, generator=torch.Generator().manual_seed(0)))
    x = (4 * torch.randn(3, text.hidden_size, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16)
    got = FinalNorm(norm.weight, norm.variance_epsilon)(x)
    with torch.no_grad():
        expected = norm(x)
    # Within two bfloat16 steps: the interpreter's rounding to bfloat16 is not the GPU's (on a GPU
    # decode_inputs.final_norm checks one step at the largest value before it is used).
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_a_slot_decoder_with_the_kernels_decodes_as_with_the_modules() -> None:
    """The tiny Qwen2.5-Omni thinker's slot decoder stepping with the two kernels (set here: on a
    CPU the decoder keeps its modules) against the same decoder with its modules: the same greedy
    tokens and logits within float32 noise over steps that write, mask and rotate at several
    positions (two rows of different lengths)."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    from omni_runtime.contract.adapter import RowSampling, ThinkerAdmission, ThinkerPrompt
    from omni_runtime.models.qwen2_5_omni.runners import QwenThinkerRunner
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(str(ensure_tiny_checkpoint(progress=False)))
    thinker = model.thinker.eval().float()
    lengths = [7, 12]

    def decode(kernels: bool) -> tuple[list[list[int]], list[torch.Tensor]]:
        lm = thinker.model.language_model
        runner = QwenThinkerRunner(
            lm, thinker.lm_head, thinker.config, slots=4, max_len=512, dtype=torch.float32,
            device=torch.device("cpu"), cuda_graphs=False,
        )  # fmt: skip
        assert runner.decoder.step_inputs is None and runner.decoder.final_norm is None  # a CPU keeps them
        if kernels:
            rotary = lm.rotary_emb
            runner.decoder.step_inputs = StepInputs(
                rotary.inv_freq, rotary.attention_scaling, torch.float32, 512
            )
            runner.decoder.final_norm = FinalNorm(lm.norm.weight, lm.norm.variance_epsilon)
        rows = []
        for slot, n in enumerate(lengths):
            ids = list(range(10 + slot, 10 + slot + n))
            prompt = ThinkerPrompt(
                input_ids=ids, embeds=runner.embed(torch.tensor(ids)),
                positions=torch.arange(n).view(1, -1).expand(3, -1), rope_delta=0,
            )  # fmt: skip
            rows.append(
                ThinkerAdmission(
                    slot=slot, prompt=prompt, sampling=RowSampling(temperature=0.0), want_vectors=False
                )
            )
        runner.admit(rows)
        tokens, logits = [], []
        for i in range(4):
            step = runner.step(len(lengths), vector_slots=[], max_length=max(lengths) + 1 + i)
            tokens.append(list(step.tokens))
            logits.append(runner.decoder.out_logits[: len(lengths)].clone())
        return tokens, logits

    with torch.no_grad():
        want_tokens, want_logits = decode(kernels=False)
        got_tokens, got_logits = decode(kernels=True)
    assert got_tokens == want_tokens
    for got, want in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
