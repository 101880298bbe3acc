"""Tensor parallelism for the Qwen2.5-Omni vision tower (--image-encoder-tp-size).

Each vision block is sharded Megatron-style with the thinker's primitives (tensor_parallel):

- attention ``q``, ``k``, ``v`` keep a contiguous slice of their output features, so each rank owns
  ``heads / tp`` whole heads (transformers 5.23 builds three Linears; a fused ``qkv`` Linear, as
  other Qwen vision towers use, is split section by section so q, k and v stay aligned);
- attention ``proj`` becomes a RowParallelLinear (partial product all-reduced, bias added once);
- MLP ``gate_proj``/``up_proj`` column-parallel, ``down_proj`` row-parallel;
- the patch embedding, the rotary table, the norms and the merger stay replicated.

The group is the default torch.distributed group of a process that hosts only the image encoder
(``omni stage --stages image_encoder``): a process has one default group, and a worker with thinker
TP already uses its own. A worker or stage process that hosts the image encoder next to other
stages starts that dedicated process itself (vision_stage.VisionStageChild) and reaches it over a
stage link. Rank 0 of the vision group runs the stage; ranks 1..N-1 are tp_follower processes
(``--role image_encoder``) that replay every forward: the op header (patch rows, pixel width, image
count) goes down their stdin pipe, the pixels and grids follow by ``dist.broadcast``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from omni_runtime.contract.engine import EngineError
from omni_runtime.executor.tensor_parallel import one_of, shard_linears, slice_features
from omni_runtime.executor.tp_group import OP_STOP, OP_VISION, TPLeader, read_message
from omni_runtime.support.gc_pauses import freeze_heap

log = logging.getLogger(__name__)

FLAG = "--image-encoder-tp-size"
VISION_PLAN = {
    "blocks.*.attn.q": "colwise",
    "blocks.*.attn.k": "colwise",
    "blocks.*.attn.v": "colwise",
    "blocks.*.attn.qkv": "colwise_qkv",
    "blocks.*.attn.proj": "rowwise",
    "blocks.*.mlp.gate_proj": "colwise",
    "blocks.*.mlp.up_proj": "colwise",
    "blocks.*.mlp.down_proj": "rowwise",
}


def valid_vision_tp_sizes(vision_config: Any) -> list[int]:
    """TP sizes that split the vision heads and the MLP width evenly."""
    common = math.gcd(int(vision_config.num_heads), int(vision_config.intermediate_size))
    return [size for size in range(1, common + 1) if common % size == 0]


def check_vision_tp_size(vision_config: Any, tp: int) -> None:
    """EngineError naming the flag and the sizes that work, unless ``tp`` shards the tower evenly."""
    sizes = valid_vision_tp_sizes(vision_config)
    if tp in sizes:
        return
    raise EngineError(
        f"{FLAG} {tp} does not divide the vision tower's {vision_config.num_heads} heads "
        f"(MLP width {vision_config.intermediate_size}); use {one_of(sizes)}",
        param="image_encoder_tp_size",
    )


@torch.no_grad()
def colwise_qkv_shard(linear: nn.Linear, rank: int, world: int) -> None:
    """A fused q|k|v Linear: this rank's heads of each of the three sections, kept in order."""

    def split(tensor: torch.Tensor) -> torch.Tensor:
        sections = tensor.reshape(3, tensor.shape[0] // 3, *tensor.shape[1:])
        return slice_features(sections, 1, rank, world).reshape(-1, *tensor.shape[1:])

    linear.weight = nn.Parameter(split(linear.weight), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(split(linear.bias), requires_grad=False)
    linear.out_features = linear.weight.shape[0]


def shard_vision_tower(visual: nn.Module, vision_config: Any, *, rank: int, world: int, group: Any) -> int:
    """Shard every vision block in place for ``rank`` of ``world``; returns the linears sharded."""
    if world == 1:
        return 0
    check_vision_tp_size(vision_config, world)
    count = shard_linears(
        visual,
        VISION_PLAN,
        rank=rank,
        world=world,
        group=group,
        column_styles={"colwise_qkv": colwise_qkv_shard},
    )
    modules = dict(visual.named_modules())
    attentions = [m for n, m in modules.items() if n.endswith(".attn") and hasattr(m, "num_heads")]
    if not count or not attentions:
        raise EngineError(
            "the vision tower's layout is not the one image-encoder TP shards (blocks.*.attn.q/k/v/proj, "
            "blocks.*.mlp.*); use --image-encoder-tp-size 1",
            param="image_encoder_tp_size",
        )
    for attn in attentions:
        # The attention reshapes with num_heads (head_dim is -1): each rank runs its own heads.
        attn.num_heads = int(attn.num_heads) // world
    return count


class LeaderVision:
    """Rank 0's vision tower: announces each forward to the followers, then runs its own shard.

    Attribute reads (``dtype``, ``spatial_merge_size``) fall through to the sharded module, so the
    adapter's ``encode_vision`` is the same code with or without TP.
    """

    def __init__(self, inner: nn.Module, leader: TPLeader) -> None:
        self._inner = inner
        self._leader = leader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __call__(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor) -> Any:
        inner: Any = self._inner
        grid_cpu = grid_thw.to("cpu", torch.int64)
        patches = int(grid_cpu.prod(-1).sum())
        # Checked before the header goes out: a forward that fails after it would leave the
        # followers waiting in a collective rank 0 never joins.
        if hidden_states.dim() != 2 or hidden_states.shape[0] != patches:
            raise EngineError(
                f"vision input has {tuple(hidden_states.shape)} pixel rows for grids totalling {patches} patches",
                status=500,
            )
        device = inner.device
        pixels = hidden_states.to(device, inner.dtype).contiguous()
        grid = grid_cpu.to(device).contiguous()
        self._leader.send(OP_VISION, pixels.shape[0], pixels.shape[1], grid.shape[0])
        self._leader.broadcast(pixels)
        self._leader.broadcast(grid)
        return inner(pixels, grid_thw=grid)

    def close(self) -> None:
        self._leader.close()


def serve_vision_ops(visual: Any, device: torch.device, leader_fd: int) -> int:
    """A vision follower's loop: replay rank 0's forwards until STOP or EOF; returns the exit code."""
    import torch.distributed as dist

    freeze_heap(f"image-encoder TP rank {dist.get_rank()}")  # loaded: keep full collections short
    while True:
        message = read_message(leader_fd)
        if message is None:
            log.info("the image-encoder stage closed the op pipe; exiting")
            return 0
        op, args = message[0], message[1:]
        if op == OP_VISION:
            rows, width, images = args
            with torch.inference_mode():
                pixels = torch.empty(rows, width, dtype=visual.dtype, device=device)
                grid = torch.empty(images, 3, dtype=torch.int64, device=device)
                dist.broadcast(pixels, src=0)
                dist.broadcast(grid, src=0)
                visual(pixels, grid_thw=grid)  # the output is rank 0's to use
        elif op == OP_STOP:
            log.info("stopping")
            return 0
        else:
            log.error("unknown op %d from image-encoder rank 0", op)
            return 3
