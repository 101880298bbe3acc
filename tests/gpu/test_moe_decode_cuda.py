"""The fused MoE decode kernels compiled on a GPU: equal to transformers' grouped_mm experts on the
released Qwen3-Omni-30B-A3B thinker's expert shapes (128 experts, hidden 2048, 768 per expert,
top-8), in eager mode and replayed from a CUDA graph.

Skipped without a CUDA GPU. Run on the GPU machine with ``pytest tests/gpu -q``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from transformers import Qwen3OmniMoeConfig  # noqa: E402
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf  # noqa: E402

from omni_runtime.executor import moe_decode  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def block():
    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.num_experts, text.hidden_size, text.moe_intermediate_size, text.num_experts_per_tok = (
        128,
        2048,
        768,
        8,
    )
    text._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    with torch.device("cuda"):
        module = hf.Qwen3OmniMoeThinkerTextSparseMoeBlock(text).to(torch.bfloat16)
        with torch.no_grad():
            for param in module.parameters():
                param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
    moe_decode.register()
    return module


def _both(block, x):
    with torch.no_grad():
        block.experts.config._experts_implementation = "grouped_mm"
        expected = block(x)
        block.experts.config._experts_implementation = moe_decode.NAME
        got = block(x)
    return got, expected


@pytest.mark.parametrize("rows", [1, 4, 16])
def test_fused_equals_grouped_mm(block, rows: int) -> None:
    x = torch.randn(1, rows, 2048, device="cuda", dtype=torch.bfloat16)
    got, expected = _both(block, x)
    scale = expected.float().abs().max().item()
    assert (got.float() - expected.float()).abs().max().item() <= 2e-2 * scale


def test_fused_replays_from_a_cuda_graph(block) -> None:
    static_x = torch.randn(1, 4, 2048, device="cuda", dtype=torch.bfloat16)
    block.experts.config._experts_implementation = moe_decode.NAME
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            block(static_x)  # compile and warm up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = block(static_x)
        fresh = torch.randn_like(static_x)
        static_x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        eager = block(fresh)
    torch.testing.assert_close(static_out, eager, rtol=0, atol=0)


def test_fused_qkv_thinker_equals_transformers_on_cuda() -> None:
    """models/qwen3_omni_moe/attention.py on the GPU, bf16: one projection for q, k and v gives the
    separate projections' hidden states (cuBLAS may pick other tiles for the wider GEMM)."""
    from omni_runtime.models.qwen3_omni_moe.attention import fuse_qkv

    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.hidden_size, text.num_hidden_layers, text.num_attention_heads = 2048, 2, 32
    text.num_key_value_heads, text.head_dim, text.vocab_size = 4, 128, 1024
    text.num_experts, text.moe_intermediate_size, text.num_experts_per_tok = 8, 256, 2
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = hf.Qwen3OmniMoeThinkerTextModel(text).to(torch.bfloat16).eval()
        for param in model.parameters():
            torch.nn.init.normal_(param, std=0.02)
        ids = torch.randint(0, 1024, (4, 1))
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state.float()
        assert fuse_qkv(model) == 2
        got = model(input_ids=ids).last_hidden_state.float()
    assert (got - want).abs().max().item() <= 2e-2 * max(want.abs().max().item(), 1.0)


def test_step_inputs_kernel_equals_the_rotary_module_bit_for_bit() -> None:
    """executor.decode_inputs on the released thinker's rotary embedding and final norm: built (its
    check passes), cos and sin of decode positions with mrope deltas bit-exact with transformers'
    module, write positions clamped and mask rows as slot_cache computed them, the norm within a
    bfloat16 step."""
    from transformers import Qwen2_5OmniThinkerConfig
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as q25

    from omni_runtime.executor import decode_inputs
    from omni_runtime.models.qwen3_omni_moe.config import released_30b_a3b_config

    text = released_30b_a3b_config().thinker_config.text_config
    device = torch.device("cuda")
    rotary = hf.Qwen3OmniMoeThinkerTextRotaryEmbedding(text).to(device)
    fast = decode_inputs.step_inputs(rotary, dtype=torch.bfloat16, device=device, max_len=4096)
    assert fast is not None
    lengths = torch.tensor([0, 17, 4095, 9000], device=device)  # the last a stale padding row
    delta = torch.tensor([0, -5, 300, 2], device=device)
    write, (cos, sin), mask = fast(lengths, delta, 512)
    expected_write = lengths.clamp(max=4095)
    hidden = torch.zeros(4, 1, 8, dtype=torch.bfloat16, device=device)
    expected = rotary(hidden, (expected_write + delta).view(1, 4, 1).expand(3, 4, 1))
    assert torch.equal(write, expected_write)
    assert torch.equal(cos, expected[0]) and torch.equal(sin, expected[1])
    assert torch.equal(
        mask, (torch.arange(512, device=device)[None, :] <= expected_write[:, None])[:, None, None, :]
    )

    norm = hf.Qwen3OmniMoeThinkerTextRMSNorm(text.hidden_size, eps=text.rms_norm_eps).to(
        device, torch.bfloat16
    )
    assert decode_inputs.final_norm(norm, dtype=torch.bfloat16, device=device) is not None

    # Qwen2.5-Omni's rotary (the same recomposition of mrope sections) takes it too; a rotary whose
    # values differ (here: scaled after the module's own) keeps its module.
    other_rotary = q25.Qwen2_5OmniRotaryEmbedding(Qwen2_5OmniThinkerConfig().text_config).to(device)
    assert (
        decode_inputs.step_inputs(other_rotary, dtype=torch.bfloat16, device=device, max_len=4096) is not None
    )

    class Scaled(torch.nn.Module):
        inv_freq, attention_scaling = rotary.inv_freq, 1.0

        def forward(self, x, positions):
            return tuple(2 * t for t in rotary(x, positions))

    assert decode_inputs.step_inputs(Scaled(), dtype=torch.bfloat16, device=device, max_len=4096) is None
