"""The Qwen3-Omni-30B-A3B thinker for the decode bench (``bench.decode --family qwen3_omni_moe``).

One random-weight thinker at the released shape on the GPU serves both sides, as for Qwen2.5:
transformers' own ``Qwen3OmniMoeThinkerForConditionalGeneration.generate`` with the experts
kernel transformers picks by default, and the runtime's ``Qwen3ThinkerRunner`` (slot KV cache, CUDA
graphs) over the same modules, one runner per experts kernel compared (the runtime's fused decode
kernels ``omni_fused`` and transformers' ``grouped_mm``): a captured graph keeps the kernel it was
captured with.

The bandwidth bound of an MoE step depends on the batch: every step reads the dense weights
(attention, norms, router, shared parts, LM head) and, per layer, each expert that at least one
row routes to. With top-k of E experts and routing spread evenly (random weights route close to
evenly), a batch of B rows touches E*(1 - (1 - k/E)^B) experts per layer in expectation: 8 of 128
at B=1, about 50 at B=8, about 114 at B=32.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any


def expected_experts(experts: int, top_k: int, batch: int) -> float:
    """Distinct experts per layer that a batch of ``batch`` rows reads, routing spread evenly."""
    return experts * (1.0 - (1.0 - top_k / experts) ** batch)


def moe_bytes(
    dense_bytes: int, expert_bytes: int, *, layers: int, experts: int, top_k: int
) -> Callable[[int], float]:
    """Bytes one decode step reads at batch B: the dense weights plus the experts routed to."""

    def per_step(batch: int) -> float:
        return dense_bytes + layers * expected_experts(experts, top_k, batch) * expert_bytes

    return per_step


def build(
    dtype_name: str, *, max_len: int, slots: int
) -> tuple[Any, Callable[[str], Any], int, Callable[[int], float], str]:
    """(HF thinker, a runtime runner per experts kernel, vocab, bytes per step by batch, HF's
    default experts kernel)."""
    import torch
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

    from omni_runtime.models.qwen3_omni_moe.config import released_30b_a3b_config
    from omni_runtime.models.qwen3_omni_moe.runners import Qwen3ThinkerRunner

    dtype = getattr(torch, dtype_name)
    device = torch.device("cuda", 0)
    config = released_30b_a3b_config()
    cfg = config.thinker_config
    with torch.device(device):
        thinker = Qwen3OmniMoeThinkerForConditionalGeneration._from_config(
            cfg, dtype=dtype, attn_implementation="sdpa"
        ).eval()
    text = thinker.model.language_model
    default_kernel = str(getattr(cfg.text_config, "_experts_implementation", None) or "eager")
    names = SimpleNamespace(
        text_config=cfg.text_config,
        audio_token_index=cfg.audio_token_id,
        image_token_index=cfg.image_token_id,
        video_token_index=cfg.video_token_id,
    )

    def make_runner(kernel: str) -> Any:
        set_experts(thinker, kernel)
        return Qwen3ThinkerRunner(
            text,
            thinker.lm_head,
            names,
            slots=slots,
            max_len=max_len,
            dtype=dtype,
            device=device,
            cuda_graphs=True,
            accept_layer=int(config.talker_config.accept_hidden_layer),
            decode_layer=decode_layer_mode(kernel),
            decode_step="step" in build_suffixes(kernel)[1],
        )

    expert_params = 0
    for name, param in text.layers.named_parameters():
        if ".experts." in name:
            expert_params += param.numel() * param.element_size()
    text_cfg = cfg.text_config
    layers, experts, top_k = text_cfg.num_hidden_layers, text_cfg.num_experts, text_cfg.num_experts_per_tok
    expert_total = expert_params // (layers * experts)
    dense = sum(
        p.numel() * p.element_size()
        for n, p in [
            *text.layers.named_parameters(),
            *text.norm.named_parameters(),
            *thinker.lm_head.named_parameters(),
        ]
        if ".experts." not in n
    )
    bytes_for = moe_bytes(dense, expert_total, layers=layers, experts=experts, top_k=top_k)
    return thinker, make_runner, int(text_cfg.vocab_size), bytes_for, default_kernel


SUFFIXES = ("qkv", "layer", "pdl", "step")


def build_suffixes(kernel: str) -> tuple[str, set[str]]:
    """A build's experts kernel and its suffixes: ``omni_fused+qkv`` (the fused q/k/v projection),
    ``+layer`` (the fused decode layer, executor.moe_layer: six kernels a layer at up to 4 rows; it
    implies +qkv), ``+pdl`` (the same as programmatic dependent launches) and ``+step`` (one-row
    steps with every layer in one kernel, executor.moe_step, beside +layer or +pdl)."""
    name, *extras = kernel.split("+")
    unknown = [extra for extra in extras if extra not in SUFFIXES]
    if unknown:
        raise ValueError(
            f"unknown suffix +{unknown[0]} in {kernel!r}: use {', '.join('+' + s for s in SUFFIXES)}"
        )
    return name, set(extras)


def decode_layer_mode(kernel: str) -> str:
    """The runner's OMNI_MOE_LAYER mode for a build name: off unless it says +layer or +pdl."""
    _, extras = build_suffixes(kernel)
    return "pdl" if "pdl" in extras else "fused" if "layer" in extras else "off"


def set_experts(thinker: Any, kernel: str) -> None:
    """Switch the experts kernel of every MoE block, and with a ``+qkv`` suffix (``omni_fused+qkv``)
    the attention's fused q/k/v projection; transformers reads both at each forward, and a captured
    graph keeps what it was captured with. ``+layer`` and ``+pdl`` (the serving default, the fused
    decode layer) need the fused projection too; the runner made for the build holds its layers."""
    from omni_runtime.models.qwen3_omni_moe.attention import fuse_qkv
    from omni_runtime.models.qwen3_omni_moe.loader import experts_implementation, use_experts

    name, extras = build_suffixes(kernel)
    text = thinker.model.language_model
    use_experts(text, experts_implementation(name))
    fuse_qkv(text, fused=bool(extras))
