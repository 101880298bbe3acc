"""The one-kernel decode step (executor.moe_step) on a GPU, at the released Qwen3-Omni-30B-A3B
thinker's layer shape (hidden 2048, 32 query and 4 key/value heads of 128, 128 experts of 768,
top-8), three layers with random weights, bfloat16: equal to transformers' layers run one after
another (SDPA, grouped_mm experts) and to the fused layer kernels, the cache written as they
write it, a second launch bit-exact with the first (the tags carry over), and replayed from a
CUDA graph exactly as run eagerly.

Skipped without a CUDA GPU. Run on the GPU machine with ``pytest tests/gpu -q``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf  # noqa: E402

from omni_runtime.executor.slot_cache import SlotKVCache  # noqa: E402
from omni_runtime.models.qwen3_omni_moe.attention import fuse_qkv  # noqa: E402
from omni_runtime.models.qwen3_omni_moe.config import released_30b_a3b_config  # noqa: E402
from omni_runtime.models.qwen3_omni_moe.decode_layer import fused_decode_layers, fused_decode_stack  # noqa: E402

pytestmark = pytest.mark.gpu
MAX_LEN = 4096
LAYERS = 3


@pytest.fixture(scope="module")
def stack():
    return build_stack()


def build_stack():
    """(text config, transformers' layers, rotary embedding, fused layers, the step kernel)."""
    text = released_30b_a3b_config().thinker_config.text_config
    text._experts_implementation = "grouped_mm"
    text._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        layers = torch.nn.ModuleList(
            [hf.Qwen3OmniMoeThinkerTextDecoderLayer(text, i) for i in range(LAYERS)]
        ).to(torch.bfloat16)
        with torch.no_grad():
            for name, param in layers.named_parameters():
                if "norm" in name:
                    param.copy_(1 + 0.1 * torch.randn_like(param))
                else:
                    param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
        rotary = hf.Qwen3OmniMoeThinkerTextRotaryEmbedding(text)
    fuse_qkv(layers)
    fused = fused_decode_layers(layers, list(layers), "pdl")
    assert fused is not None
    step = fused_decode_stack(fused, pdl=True)
    assert step is not None, "an H100/H200 takes the one-kernel step at this shape"
    return text, layers, rotary, fused, step


def _cache(text, write: int, layers: int = LAYERS) -> SlotKVCache:
    cache = SlotKVCache(
        layers=layers, slots=2, kv_heads=text.num_key_value_heads, max_len=MAX_LEN, head_dim=text.head_dim,
        dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    generator = torch.Generator(device="cuda").manual_seed(1)
    for i in range(layers):
        cache.keys[i].copy_(torch.randn(cache.keys[i].shape, generator=generator, device="cuda"))
        cache.values[i].copy_(torch.randn(cache.values[i].shape, generator=generator, device="cuda"))
    cache.write_pos = torch.tensor([write], device="cuda")
    cache.view_len = MAX_LEN
    cache.prefill_slots = None
    return cache


def _inputs(text, rotary, write: int):
    hidden = torch.randn(1, 1, text.hidden_size, device="cuda", dtype=torch.bfloat16)
    positions = torch.tensor([write + 2], device="cuda").view(1, 1, 1).expand(3, 1, 1)
    cos_sin = rotary(hidden, positions)
    mask = (torch.arange(MAX_LEN, device="cuda")[None, :] <= write)[:, None, None, :]
    return hidden, cos_sin, mask


def _layers(callables, hidden, cos_sin, mask, cache):
    with torch.no_grad():
        for i, layer in enumerate(callables):
            cache.layer_keys, cache.layer_values = cache.keys[i], cache.values[i]
            hidden = layer(hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=cache)
            if isinstance(hidden, tuple):
                hidden = hidden[0]
    cache.layer_keys = cache.layer_values = None
    return hidden


def _worst(got, expected) -> float:
    return (got.float() - expected.float()).abs().max().item() / expected.float().abs().max().item()


@pytest.mark.parametrize("write", [0, 1, 100, 700, 3000])
@pytest.mark.parametrize("depth", [1, LAYERS])
def test_step_kernel_equals_the_layers(stack, write, depth) -> None:
    text, layers, rotary, fused, whole = stack
    step = whole if depth == LAYERS else fused_decode_stack(fused[:depth], pdl=True)
    hidden, cos_sin, mask = _inputs(text, rotary, write)
    hf_cache, fused_cache, step_cache = (_cache(text, write, depth) for _ in range(3))
    expected = _layers(layers[:depth], hidden, cos_sin, mask, hf_cache)
    layered = _layers(fused[:depth], hidden, cos_sin, mask, fused_cache)
    with torch.no_grad():
        got = step(hidden, cos_sin, step_cache)
    torch.cuda.synchronize()
    assert got is not None and got.shape == hidden.shape
    # Relative to the largest value: against transformers, and against the layer kernels, which
    # round where this kernel rounds (their own distance from transformers beside it).
    against_hf, against_layers, layers_hf = (
        _worst(got, expected),
        _worst(got, layered),
        _worst(layered, expected),
    )
    print(
        f"write {write} depth {depth}: step-hf {against_hf:.4f} step-layers {against_layers:.4f} layers-hf {layers_hf:.4f}"
    )
    assert against_layers <= 2e-2
    assert against_hf <= max(3e-2, 1.5 * layers_hf)
    for i in range(depth):
        for name in ("keys", "values"):
            mine, theirs = getattr(step_cache, name)[i], getattr(hf_cache, name)[i]
            assert _worst(mine[0, :, write], theirs[0, :, write]) <= 3e-2
            assert torch.equal(mine[0, :, :write], theirs[0, :, :write])  # the cached keys before stay
    at = step.plan.counts_at
    assert not step.workspace[:, at : at + step.plan.kv_heads].any()  # reset by each head's merging split
    for i in range(depth):
        experts = step.workspace[i, at + 32 : at + 32 + step.plan.top_k].tolist()
        assert len(set(experts)) == step.plan.top_k and all(0 <= e < step.plan.experts for e in experts)
    again_cache = _cache(text, write, depth)
    with torch.no_grad():
        again = step(hidden, cos_sin, again_cache)
    torch.cuda.synchronize()
    torch.testing.assert_close(again, got, rtol=0, atol=0)


def test_step_kernel_declines_what_it_does_not_take(stack) -> None:
    text, _, rotary, _, step = stack
    hidden, cos_sin, _mask = _inputs(text, rotary, 10)
    two = torch.cat([hidden, hidden])
    assert step(two, cos_sin, _cache(text, 10)) is None  # two rows: the layers run one by one
    cache = _cache(text, 10)
    cache.prefill_slots = torch.tensor([0], device="cuda")
    assert step(hidden, cos_sin, cache) is None  # a prefill


def test_step_kernel_replays_from_a_cuda_graph(stack) -> None:
    text, _, rotary, _, step = stack
    hidden, cos_sin, _mask = _inputs(text, rotary, 517)
    cache = _cache(text, 517)
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step(hidden, cos_sin, cache)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = step(hidden, cos_sin, cache)
        fresh = torch.randn_like(hidden)
        hidden.copy_(fresh)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        eager = step(fresh, cos_sin, cache)
    torch.testing.assert_close(static_out, eager, rtol=0, atol=0)
