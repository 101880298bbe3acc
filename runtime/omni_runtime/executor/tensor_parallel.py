"""Megatron-style tensor parallelism for a transformers decoder stack, sharded in place.

transformers 5.x ships a TP mechanism (``tp_plan`` + ``transformers.distributed.tensor_parallel``),
but it is built around ``from_pretrained(tp_plan=...)``, DTensor parameters and forward hooks that
swap parameters on every call; our loader builds modules with ``_from_config`` and fills them from
its own safetensors reader, and the SlotDecoder captures decode steps as CUDA graphs. So we keep
the part of transformers' mechanism that encodes model knowledge — the config's
``base_model_tp_plan`` (which linear is ``colwise`` and which ``rowwise``) — and apply it with plain
tensors, as sglang and vLLM do:

- ``colwise`` linears (q/k/v, gate/up) keep a contiguous slice of their output features (bias
  too): each rank owns ``heads / tp`` attention heads and ``intermediate / tp`` MLP channels;
- ``rowwise`` linears (o_proj, down_proj) keep the matching slice of their input features and
  become ``RowParallelLinear``: the partial product is all-reduced, then the bias is added once;
- embeddings, norms, the rotary table and the LM head stay replicated on every rank;
- MoE experts (transformers' fused experts: ``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I];
  the plan's ``packed_colwise``, ``rowwise`` on a parameter and ``moe_tp_experts``): every rank
  keeps ``I / tp`` channels of every expert (its slice of the gate rows and of the up rows), the
  router stays replicated so every rank routes alike, and the experts' output is all-reduced.

Sharding happens on the HF modules right after loading, before any SlotDecoder is built, so a
runner that fuses q/k/v or gate/up later fuses the per-rank shards, which is still correct.
"""

from __future__ import annotations

import copy
import fnmatch
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omni_runtime.contract.engine import EngineError

# What Qwen2-style decoders use when a config carries no plan of its own.
DEFAULT_PLAN = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}


def valid_tp_sizes(text_config: Any) -> list[int]:
    """TP sizes that split attention heads, KV heads and MLP (and MoE expert) channels evenly."""
    common = math.gcd(
        int(text_config.num_attention_heads),
        int(text_config.num_key_value_heads),
        int(text_config.intermediate_size),
        int(getattr(text_config, "moe_intermediate_size", 0) or 0),
    )
    return [size for size in range(1, common + 1) if common % size == 0]


def one_of(sizes: list[int]) -> str:
    """'1, 2 or 4': the sizes a TP flag accepts, for its error message."""
    shown = [str(s) for s in sizes]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


def check_tp_size(
    text_config: Any, tp: int, *, flag: str = "--thinker-tp-size", what: str = "thinker"
) -> None:
    """EngineError naming the flag and the sizes that work, unless ``tp`` shards evenly."""
    sizes = valid_tp_sizes(text_config)
    if tp in sizes:
        return
    experts = getattr(text_config, "moe_intermediate_size", None)
    raise EngineError(
        f"{flag} {tp} does not divide the {what}'s {text_config.num_attention_heads} attention heads / "
        f"{text_config.num_key_value_heads} KV heads (MLP width {text_config.intermediate_size}"
        f"{f', expert width {experts}' if experts else ''}); use {one_of(sizes)}",
        param=flag.lstrip("-").replace("-", "_"),
    )


def sharded_text_config(text_config: Any, tp: int) -> Any:
    """A copy of the config with one rank's head counts (what cache sizing and runners read)."""
    head_dim = getattr(text_config, "head_dim", None) or (
        text_config.hidden_size // text_config.num_attention_heads
    )
    config = copy.deepcopy(text_config)
    config.head_dim = head_dim
    config.num_attention_heads = text_config.num_attention_heads // tp
    config.num_key_value_heads = text_config.num_key_value_heads // tp
    config.intermediate_size = text_config.intermediate_size // tp
    if getattr(text_config, "moe_intermediate_size", None):
        config.moe_intermediate_size = text_config.moe_intermediate_size // tp
    return config


def sharded_thinker_config(thinker_config: Any, tp: int) -> Any:
    """The thinker config with its text config replaced by one rank's view of it."""
    if tp == 1:
        return thinker_config
    config = copy.copy(thinker_config)
    config.text_config = sharded_text_config(thinker_config.text_config, tp)
    return config


_GROUPS: dict[int, Any] = {}  # custom-op argument -> process group (None: the default group)


@torch.library.custom_op("omni_tp::all_reduce", mutates_args=())
def tp_all_reduce(x: torch.Tensor, group_id: int) -> torch.Tensor:
    """Sum over the TP group, as an opaque op: ``torch.compile`` keeps it in one graph (no graph
    break, no functional-collective rewrite) and CUDA-graph capture records the NCCL kernel."""
    import torch.distributed as dist

    out = x.clone()
    dist.all_reduce(out, group=_GROUPS.get(group_id))
    return out


@tp_all_reduce.register_fake
def _(x: torch.Tensor, group_id: int) -> torch.Tensor:
    return torch.empty_like(x)


def register_group(group: Any) -> int:
    key = 0 if group is None else id(group)
    _GROUPS[key] = group
    return key


class RowParallelLinear(nn.Linear):
    """A rowwise shard: ``x_shard @ W_shard^T`` summed over the group, then the bias once.

    It stays an ``nn.Linear`` (``weight`` holds this rank's input-feature slice) so code that
    inspects linears keeps working; code that calls ``F.linear(x, m.weight)`` itself must add the
    all-reduce (``tp_all_reduce``).
    """

    tp_group_id: int = 0
    tp_world: int = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        if self.tp_world > 1:
            out = tp_all_reduce(out, self.tp_group_id)
        if self.bias is not None:
            out = out + self.bias
        return out


def slice_features(tensor: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    size = tensor.shape[dim]
    if size % world:
        raise ValueError(f"cannot split {size} features over {world} ranks")
    part = size // world
    return tensor.narrow(dim, rank * part, part).clone()  # a copy: the full tensor can be freed


@torch.no_grad()
def colwise_shard(linear: nn.Linear, rank: int, world: int) -> None:
    linear.weight = nn.Parameter(slice_features(linear.weight, 0, rank, world), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(slice_features(linear.bias, 0, rank, world), requires_grad=False)
    linear.out_features = linear.weight.shape[0]


@torch.no_grad()
def rowwise_shard(linear: nn.Linear, rank: int, world: int, group: Any) -> RowParallelLinear:
    weight = slice_features(linear.weight, 1, rank, world)
    with torch.device("meta"):
        shard = RowParallelLinear(weight.shape[1], weight.shape[0], bias=linear.bias is not None)
    shard.weight = nn.Parameter(weight, requires_grad=False)
    if linear.bias is not None:
        shard.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    shard.tp_group_id, shard.tp_world = register_group(group), world
    return shard.eval()


ColumnShard = Callable[[nn.Linear, int, int], None]


def shard_linears(
    root: nn.Module,
    plan: dict[str, str],
    *,
    rank: int,
    world: int,
    group: Any,
    column_styles: dict[str, ColumnShard] | None = None,
) -> int:
    """Shard in place every ``nn.Linear`` under ``root`` whose name matches a ``plan`` pattern.

    ``colwise`` keeps this rank's output features; ``rowwise`` keeps its input features and
    becomes a ``RowParallelLinear`` (all-reduce, bias once); other styles name a column shard in
    ``column_styles`` (the vision tower's fused ``qkv``). Returns the number of linears sharded.
    """
    styles: dict[str, ColumnShard] = {"colwise": colwise_shard, **(column_styles or {})}
    modules = dict(root.named_modules())
    count = 0
    for name, module in list(modules.items()):
        style = next((s for pattern, s in plan.items() if fnmatch.fnmatchcase(name, pattern)), None)
        if style is None or not isinstance(module, nn.Linear):
            continue
        if style == "rowwise":
            parent_name, _, attr = name.rpartition(".")
            setattr(modules[parent_name], attr, rowwise_shard(module, rank, world, group))
        else:
            styles[style](module, rank, world)
        count += 1
    return count


@torch.no_grad()
def shard_experts(root: nn.Module, plan: dict[str, str], *, rank: int, world: int, group: Any) -> int:
    """Shard in place every fused experts module under ``root`` the plan names ``moe_tp_experts``:
    this rank's ``I / world`` channels of each expert (``packed_colwise`` gate_up_proj: its slice of
    the gate half and of the up half; ``rowwise`` down_proj: the matching input channels), and an
    all-reduce of the module's output. Returns the number of experts modules sharded."""
    count = 0
    for name, module in root.named_modules():
        if not any(fnmatch.fnmatchcase(name, p) for p, s in plan.items() if s == "moe_tp_experts"):
            continue
        experts: Any = module
        gate, up = experts.gate_up_proj.chunk(2, dim=1)
        experts.gate_up_proj = nn.Parameter(
            torch.cat([slice_features(gate, 1, rank, world), slice_features(up, 1, rank, world)], dim=1),
            requires_grad=False,
        )
        experts.down_proj = nn.Parameter(
            slice_features(experts.down_proj, 2, rank, world), requires_grad=False
        )
        if hasattr(experts, "intermediate_dim"):
            experts.intermediate_dim = experts.down_proj.shape[-1]
        group_id = register_group(group)
        experts.register_forward_hook(lambda _m, _args, out, gid=group_id: tp_all_reduce(out, gid))
        count += 1
    return count


# The plan's styles for a fused experts module and its parameters (handled by shard_experts).
_EXPERT_STYLES = ("packed_colwise", "moe_tp_experts")


def _plan(text_config: Any) -> dict[str, str]:
    plan = getattr(text_config, "base_model_tp_plan", None) or DEFAULT_PLAN
    known = ("colwise", "rowwise", *_EXPERT_STYLES)
    unknown = sorted({style for style in plan.values() if style not in known})
    if unknown:  # a new model family brings styles this runtime does not implement yet
        raise EngineError(
            f"the model's tensor-parallel plan uses {', '.join(unknown)}, which the builtin runtime does not "
            "implement; use --thinker-tp-size 1",
            param="thinker_tp_size",
        )
    return dict(plan)


def shard_text_model(text_model: nn.Module, text_config: Any, *, rank: int, world: int, group: Any) -> int:
    """Shard a decoder stack (``text_model.layers``) in place for ``rank`` of ``world``.

    Returns the number of linears sharded. Attention modules get this rank's head counts.
    """
    if world == 1:
        return 0
    check_tp_size(text_config, world)
    plan = _plan(text_config)
    # The experts' weights are parameters, not linears: shard_experts takes them with their module.
    linears = {pattern: style for pattern, style in plan.items() if style in ("colwise", "rowwise")}
    count = shard_linears(text_model, linears, rank=rank, world=world, group=group)
    count += shard_experts(text_model, plan, rank=rank, world=world, group=group)
    if not count:
        raise EngineError("the thinker's tensor-parallel plan matched no layer", param="thinker_tp_size")
    for module in text_model.modules():
        # HF attention reshapes with -1 heads; keep the bookkeeping attributes honest anyway.
        # num_key_value_groups (heads per KV head) is unchanged by an even split.
        attn: Any = module
        if hasattr(attn, "num_key_value_groups") and hasattr(attn, "num_heads"):
            attn.num_heads = int(attn.num_heads) // world
            attn.num_key_value_heads = int(attn.num_key_value_heads) // world
    return count
