"""The fused MoE decode layer's pure parts: the attention split plan, the bench's build names, what
the model side accepts, and the kernels lowered to Hopper code (PDL on and off) without a GPU.
Its numbers against transformers' layer run under Triton's interpreter
(triton_interpreted/test_moe_layer_kernels.py) and on a GPU (tests/gpu/test_moe_layer_cuda.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

from omni_runtime.bench.decode_moe import build_suffixes, decode_layer_mode
from omni_runtime.executor import moe_layer
from omni_runtime.executor.triton_support import hopper_or_later
from omni_runtime.models.qwen3_omni_moe.attention import fuse_qkv
from omni_runtime.models.qwen3_omni_moe.decode_layer import fused_decode_layers, layer_weights


@pytest.mark.parametrize(
    ("rows", "kv_heads", "view", "expected"),
    [
        (1, 4, 256, (4, 64)),  # 32 splits wanted, 16 at most, 64 keys at least
        (1, 4, 2048, (16, 128)),  # 16 splits at most a pair
        (1, 4, 4096, (16, 256)),
        (4, 4, 256, (4, 64)),  # 8 wanted, still 64 keys at least
        (4, 4, 2048, (8, 256)),
        (1, 4, 100, (2, 64)),  # the last split is short
        (2, 4, 1000, (16, 64)),  # 63 keys a split rounded up to a 32-key block
        (64, 4, 256, (1, 256)),  # more pairs than programs wanted: one split each
    ],
)
def test_split_plan_table(rows, kv_heads, view, expected) -> None:
    splits, per_split = moe_layer.split_plan(rows, kv_heads, view)
    assert (splits, per_split) == expected
    assert per_split % moe_layer.BLOCK_N == 0 and splits * per_split >= view > (splits - 1) * per_split


def test_experts_shape_is_the_layers_unless_a_sweep_sets_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """One gate-up shape for 1-4 rows: 4 units x 1024 columns on 4 warps."""
    assert moe_layer.experts_shape() == moe_layer.moe_decode.LaunchConfig(
        gate_rows=4, gate_cols=1024, down_rows=4, down_cols=256, warps=4
    )
    wide = moe_layer.moe_decode.LaunchConfig(
        gate_rows=16, gate_cols=1024, down_rows=4, down_cols=256, warps=8
    )
    monkeypatch.setattr(moe_layer, "EXPERTS", wide)
    assert moe_layer.experts_shape() == wide


@pytest.mark.parametrize(
    ("build", "experts", "suffixes", "mode"),
    [
        ("omni_fused", "omni_fused", set(), "off"),
        ("omni_fused+qkv", "omni_fused", {"qkv"}, "off"),
        ("omni_fused+qkv+layer", "omni_fused", {"qkv", "layer"}, "fused"),
        ("omni_fused+layer", "omni_fused", {"layer"}, "fused"),
        ("omni_fused+qkv+pdl", "omni_fused", {"qkv", "pdl"}, "pdl"),
        ("omni_fused+qkv+pdl+step", "omni_fused", {"qkv", "pdl", "step"}, "pdl"),
        ("grouped_mm", "grouped_mm", set(), "off"),
    ],
)
def test_bench_build_names(build, experts, suffixes, mode) -> None:
    assert build_suffixes(build) == (experts, suffixes)
    assert decode_layer_mode(build) == mode


def test_a_wrong_build_suffix_names_the_ones_there_are() -> None:
    with pytest.raises(
        ValueError, match=r"unknown suffix \+fast in 'omni_fused\+fast': use \+qkv, \+layer, \+pdl, \+step"
    ):
        build_suffixes("omni_fused+fast")


def _layers():
    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.hidden_size, text.num_attention_heads, text.num_key_value_heads, text.head_dim = 64, 4, 2, 16
    text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size = 4, 2, 16
    text._experts_implementation = "eager"
    layers = torch.nn.ModuleList([hf.Qwen3OmniMoeThinkerTextDecoderLayer(text, 0)])
    return layers


def test_the_fused_step_needs_the_fused_qkv_projection() -> None:
    layers = _layers()
    assert layer_weights(layers[0]) is None  # transformers' three projections
    assert fused_decode_layers(layers, list(layers), "fused") is None
    fuse_qkv(layers)
    weights = layer_weights(layers[0])
    assert weights is not None
    assert (weights.heads, weights.kv_heads, weights.head_dim, weights.top_k) == (4, 2, 16, 2)
    assert weights.qkv.data_ptr() == layers[0].self_attn.qkv_weight.data_ptr()  # a view, no copy
    fused = fused_decode_layers(layers, ["step"], "pdl")  # type: ignore[list-item]
    assert fused is not None and fused[0].pdl and fused[0].fallback == "step"


def test_off_and_a_wrong_mode() -> None:
    layers = _layers()
    fuse_qkv(layers)
    assert fused_decode_layers(layers, list(layers), "off") is None
    with pytest.raises(ValueError, match="OMNI_MOE_LAYER is 'fast'; use one of pdl, fused, off"):
        fused_decode_layers(layers, list(layers), "fast")


def test_weights_that_disagree_name_the_field() -> None:
    layers = _layers()
    fuse_qkv(layers)
    weights = layer_weights(layers[0])
    assert weights is not None
    from dataclasses import replace

    with pytest.raises(ValueError, match=r"qkv is \(128, 64\), expected \(96, 64\)"):
        replace(weights, heads=2).check()
    with pytest.raises(ValueError, match=r"gate_up is \(4, 32, 64\), expected \(4, 64, 64\)"):
        replace(weights, down=weights.down.new_zeros(4, 64, 32)).check()
    with pytest.raises(ValueError, match="gate_up and down must be contiguous in their last dimension"):
        replace(weights, down=weights.down.transpose(1, 2).contiguous().transpose(1, 2)).check()


def test_a_cpu_is_no_hopper() -> None:
    assert not hopper_or_later(torch.device("cpu"))


def _compile(kernel, pointers, ints, floats, constexprs, types):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: types.get(name, "*bf16") for name in pointers}
    signature |= {name: "i32" for name in ints} | {name: "fp32" for name in floats}
    if "TRACE" in kernel.arg_names:  # the phase marks' arguments, off as served unless given
        constexprs = {**constexprs, "trace_ptr": None, "TRACE": constexprs.get("TRACE", False)}
        if constexprs["TRACE"]:
            pointers = [*pointers, "trace_ptr"]
            types = types | {"trace_ptr": "*i64"}
            signature |= {"trace_ptr": "*i64"}
            constexprs = {name: value for name, value in constexprs.items() if name != "trace_ptr"}
    signature |= {name: "constexpr" for name in constexprs}
    # As a launch specializes them: 16-aligned pointers, strides that are multiples of 16.
    aligned = [*pointers, *(name for name in ints if name.startswith("stride"))]
    attrs = {(list(signature).index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = ASTSource(kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


@pytest.mark.parametrize("pdl", [False, True])
def test_layer_kernels_compile_for_hopper_without_a_gpu(pdl: bool) -> None:
    """The released thinker's shapes lower to sm_90 code; with PDL the kernels wait for the one
    before (griddepcontrol.wait) after their weight loads and let the next one launch."""
    kernels = moe_layer._kernels()
    gemv = _compile(
        kernels.gemv_kernel,
        ["x_ptr", "norm_ptr", "w_ptr", "res_ptr", "out_ptr"],
        ["rows", "stride_x", "stride_w", "stride_res", "stride_out"],
        ["eps"],
        {
            "K": 2048,
            "K_PAD": 2048,
            "N": 5120,
            "ROWS": 1,
            "BLOCK_N": 8,
            "HAS_NORM": True,
            "HAS_RES": False,
            "PDL": pdl,
        },
        {},
    )
    router = _compile(
        kernels.router_kernel,
        ["h_ptr", "norm_ptr", "w_ptr", "xn_ptr", "logits_ptr", "count_ptr", "weights_ptr", "index_ptr"],
        ["rows", "stride_h", "stride_xn"],
        ["eps"],
        {
            "HIDDEN": 2048, "K_PAD": 2048, "EXPERTS": 128, "E_PAD": 128, "ROWS": 4, "BLOCK_E": 8,
            "PROGRAMS": 16, "TOP_K": 8, "NORMALIZE": True, "PDL": pdl,
        },
        {"logits_ptr": "*fp32", "count_ptr": "*i32", "index_ptr": "*i64"},
    )  # fmt: skip
    experts = {"HIDDEN": 2048, "INTERMEDIATE": 768, "TOP_K": 8, "PDL": pdl}
    gate_up = _compile(
        kernels.gate_up_kernel,
        ["x_ptr", "index_ptr", "w_ptr", "act_ptr"],
        ["stride_x", "stride_we", "stride_wn"],
        [],
        experts | {"BLOCK_N": 4, "BLOCK_H": 1024},
        {"index_ptr": "*i64"},
    )
    down = _compile(
        kernels.experts_down_kernel,
        ["act_ptr", "index_ptr", "weight_ptr", "w_ptr", "res_ptr", "out_ptr"],
        ["stride_we", "stride_wh", "stride_res", "stride_out"],
        [],
        experts | {"I_PAD": 1024, "K_PAD": 8, "BLOCK_D": 4},
        {"index_ptr": "*i64"},
    )
    attention = _compile(
        kernels.attention_kernel,
        ["qkv_ptr", "qnorm_ptr", "knorm_ptr", "cos_ptr", "sin_ptr", "kc_ptr", "vc_ptr", "pos_ptr", "m_ptr",
         "l_ptr", "acc_ptr", "count_ptr", "out_ptr"],
        ["stride_qkv", "stride_cos", "stride_sin", "stride_cb", "stride_ch", "stride_cn", "stride_out", "splits",
         "per_split"],
        ["scale", "eps"],
        {"KV_HEADS": 4, "GROUPS": 8, "DIM": 128, "BLOCK_G": 16, "BLOCK_N": 32, "PDL": pdl,
         "OUTPUT": 0, "MERGE_CHUNK": 4},
        {"pos_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "count_ptr": "*i32"},
    )  # fmt: skip
    for compiled in (gemv, router, attention, gate_up, down):
        assert "globaltimer" not in compiled.asm["ptx"]  # the phase marks compile away as served
        ptx = compiled.asm["ptx"]
        assert compiled.asm["cubin"]
        assert ("griddepcontrol.wait" in ptx) == pdl
        assert ("griddepcontrol.launch_dependents" in ptx) == pdl
    for compiled in (gemv, gate_up, down):
        weight_loads = [line for line in compiled.asm["ptx"].splitlines() if "ld.global" in line]
        assert any("v4.b32" in line for line in weight_loads)  # 8 bfloat16 weights per load
    if pdl:  # weights, the down kernel's routing, the first cached keys: asked for before the wait
        for compiled in (gemv, down, attention):
            ptx = compiled.asm["ptx"]
            before = ptx[: ptx.index("griddepcontrol.wait")]
            assert before.count("ld.global.v4") >= 8


def test_unset_omni_moe_layer_means_pdl_and_every_mode_is_a_choice() -> None:
    """The runner reads the switch's default as a mode: it must be one (an unset switch once read
    the default's description and stopped every Qwen3 start)."""
    from omni_runtime.contract import switches
    from omni_runtime.models.qwen3_omni_moe.decode_layer import MODES

    assert switches.choice("OMNI_MOE_LAYER", environ={}) == "pdl"
    assert switches.choice("OMNI_MOE_LAYER", environ={"OMNI_MOE_LAYER": "off"}) == "off"
    assert set(MODES) == {"pdl", "fused", "off"}


@pytest.mark.parametrize("output", [0, 1])
def test_the_attention_kernel_marks_its_phases_when_traced(output) -> None:
    """tests/gpu/layer_phases.py's marks: the global timer read at entry, past the wait, after the
    new key's store, around the counter and at the end (6 reads), stored to the trace."""
    traced = _compile(
        moe_layer._kernels().attention_kernel,
        ["qkv_ptr", "qnorm_ptr", "knorm_ptr", "cos_ptr", "sin_ptr", "kc_ptr", "vc_ptr", "pos_ptr", "m_ptr",
         "l_ptr", "acc_ptr", "count_ptr", "out_ptr"],
        ["stride_qkv", "stride_cos", "stride_sin", "stride_cb", "stride_ch", "stride_cn", "stride_out", "splits",
         "per_split"],
        ["scale", "eps"],
        {"KV_HEADS": 4, "GROUPS": 8, "DIM": 128, "BLOCK_G": 16, "BLOCK_N": 32, "PDL": True, "TRACE": True,
         "OUTPUT": output, "MERGE_CHUNK": 1},
        {"pos_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "count_ptr": "*i32"},
    )  # fmt: skip
    assert traced.asm["ptx"].count("%globaltimer") == 6
