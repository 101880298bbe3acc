"""A decode step's grouped-query attention without per-head copies of the cache
(executor/decode_attention.py): the same numbers as repeating each key/value head, eager and under
torch.compile, where transformers' own SDPA function repeats them."""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen2_5OmniThinkerConfig
from transformers.integrations import sdpa_attention
from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as hf

from omni_runtime.executor.decode_attention import (
    NAME,
    packed_decode_attention,
    split_kernel_fits,
    split_plan,
    use_packed_decode,
)

HEADS, KV_HEADS, DIM = 8, 2, 16


class Module(nn.Module):
    num_key_value_groups = HEADS // KV_HEADS


def tensors(rows: int, q_len: int, kv_len: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, HEADS, q_len, DIM, generator=g)
    key = torch.randn(rows, KV_HEADS, kv_len, DIM, generator=g)
    value = torch.randn(rows, KV_HEADS, kv_len, DIM, generator=g)
    return query, key, value


def lengths_mask(lengths: list[int], kv_len: int) -> torch.Tensor:
    """The slot decoder's decode mask: [rows, 1, 1, kv] true up to each row's length."""
    return (torch.arange(kv_len)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


def repeated(query, key, value, mask, scaling):  # the reference: every query head its own copy
    groups = HEADS // KV_HEADS
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling).transpose(1, 2)


@pytest.mark.parametrize("masked", [True, False], ids=["row lengths", "no mask"])
def test_a_one_token_query_equals_repeating_each_key_value_head(masked: bool) -> None:
    query, key, value = tensors(3, 1, 40)
    mask = lengths_mask([40, 17, 1], 40) if masked else None
    got, weights = packed_decode_attention(Module(), query, key, value, mask, scaling=0.3)
    assert weights is None and got.shape == (3, 1, HEADS, DIM)
    torch.testing.assert_close(got, repeated(query, key, value, mask, 0.3), rtol=1e-5, atol=1e-5)


def test_under_compile_it_reads_each_key_value_head_once_where_transformers_repeats() -> None:
    query, key, value = tensors(4, 1, 32, seed=1)
    mask = lengths_mask([32, 9, 20, 3], 32)
    want = repeated(query, key, value, mask, 0.25)

    copies: list[tuple[int, ...]] = []  # the cache views repeat_kv copied, while tracing
    original = sdpa_attention.repeat_kv

    def counted(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
        copies.append(tuple(hidden.shape))
        return original(hidden, n_rep)

    ours = torch.compile(packed_decode_attention, backend="eager", dynamic=True, fullgraph=True)
    theirs = torch.compile(
        sdpa_attention.sdpa_attention_forward, backend="eager", dynamic=True, fullgraph=True
    )
    with mock.patch.object(sdpa_attention, "repeat_kv", counted):
        got, _ = ours(Module(), query, key, value, mask, scaling=0.25)
        assert copies == []
        theirs_out, _ = theirs(Module(), query, key, value, mask, scaling=0.25)
        assert len(copies) == 2  # why this module exists: keys and values, each layer and step
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs_out, want, rtol=1e-5, atol=1e-5)


def test_prefill_and_per_head_masks_go_to_transformers_sdpa_unchanged() -> None:
    query, key, value = tensors(2, 5, 5, seed=2)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(2, 1, 5, 5)
    want, _ = sdpa_attention.sdpa_attention_forward(Module(), query, key, value, causal, scaling=0.2)
    got, _ = packed_decode_attention(Module(), query, key, value, causal, scaling=0.2)
    assert torch.equal(got, want)
    q1, k1, v1 = tensors(2, 1, 6, seed=3)
    per_head = torch.rand(2, HEADS, 1, 6, generator=torch.Generator().manual_seed(4)) > 0.3
    per_head[..., 0] = True
    want, _ = sdpa_attention.sdpa_attention_forward(Module(), q1, k1, v1, per_head, scaling=0.2)
    got, _ = packed_decode_attention(Module(), q1, k1, v1, per_head, scaling=0.2)
    assert torch.equal(got, want)


def test_a_qwen2_5_decoder_layer_decodes_the_same_with_it() -> None:
    """transformers' own Qwen2.5-Omni thinker layers, one config switched: a prefill then a
    one-token step with a cache gives the outputs of the unswitched layers."""
    config = Qwen2_5OmniThinkerConfig().text_config
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = (
        HEADS * 128,
        256,
        2,
    )  # mrope: 128 a head
    config.num_attention_heads, config.num_key_value_heads, config.vocab_size = HEADS, KV_HEADS, 100
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = hf.Qwen2_5OmniThinkerTextModel(config).eval()
    ids = torch.randint(0, 100, (2, 7))

    def run() -> torch.Tensor:
        with torch.no_grad():
            out = model(input_ids=ids[:, :6], use_cache=True)
            step = model(input_ids=ids[:, 6:], past_key_values=out.past_key_values, use_cache=True)
        return torch.cat([out.last_hidden_state, step.last_hidden_state], dim=1)

    want = run()
    assert use_packed_decode(model.layers) == 1  # the stack's one config
    assert model.layers[0].self_attn.config._attn_implementation == NAME
    assert use_packed_decode(model.layers) == 0  # switched already
    torch.testing.assert_close(run(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("rows", "kv_heads", "length", "want"),
    [
        (16, 2, 512, (8, 64)),  # the 7B talker at 16 streams: 32 (row, head) pairs, 8 splits
        (16, 4, 256, (4, 64)),  # the 7B thinker at 16 streams
        (1, 4, 256, (8, 32)),  # one row: a split per key block, no more
        (32, 4, 1024, (2, 512)),
        (1, 1, 5, (1, 32)),  # fewer keys than a block
        (64, 8, 4096, (1, 4096)),  # pairs enough to fill the GPU: no split
    ],
)
def test_split_plan(rows: int, kv_heads: int, length: int, want: tuple[int, int]) -> None:
    assert split_plan(rows, kv_heads, length) == want


def test_cpu_tensors_without_the_interpreter_take_pytorch_sdpa(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    query, key, value = tensors(2, 1, 64)
    packed = query.reshape(2, KV_HEADS, HEADS // KV_HEADS, DIM)
    assert not split_kernel_fits(packed, key, value, lengths_mask([64, 3], 64))


def test_the_split_kernel_is_opt_in() -> None:
    from omni_runtime.executor import decode_attention

    assert decode_attention.KERNEL == "sdpa" or os.environ.get("OMNI_DECODE_KERNEL") == "split"
