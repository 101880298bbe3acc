"""Options that build an engine: the `omni serve` / `omni stage` flags as one dataclass (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

# On by default: on an H100 (Qwen2.5-Omni-7B shape, 4-turn realtime conversations) 1024 MiB lowered
# the 8-session median wait for first audio by 20-50 ms against re-prefilling every turn, with the
# same tail, and a turn's prefill no longer grows with the conversation (docs/benchmarks.md).
DEFAULT_SESSION_KV_MB = 1024


@dataclass(frozen=True)
class EngineOptions:
    model_path: str | None = None  # None: the tiny checkpoint in the cache directory (created once)
    # Which family's tiny checkpoint model_path None serves (a real checkpoint's config.json decides).
    tiny_family: str = "qwen2_5_omni"
    model_name: str | None = None  # served name; defaults to the checkpoint directory name
    pipeline: str = "speech"  # text | speech | streaming-speech | duplex
    text_only: bool = False  # same as pipeline=text
    load_format: str = "auto"  # auto | dummy
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16
    thinker_tp_size: int = 1
    thinker_gpus: tuple[int, ...] = ()
    talker_gpu: int | None = None
    image_encoder_tp_size: int = 1
    image_encoder_gpus: tuple[int, ...] = ()
    mem_fraction_static: float | None = None
    max_batch_size: int = 32  # thinker continuous-batching slots
    max_model_len: int = 8192
    # Encoder outputs kept by content (media encoded ahead of a request, repeated media); 0: off.
    encoder_cache_mb: int = 256
    # Thinker KV kept between a session's turns (conversation KV), in MiB (as much again for the
    # talker's); 0: off. See --session-kv-mb.
    session_kv_mb: int = DEFAULT_SESSION_KV_MB
    # Stages served by another process: stage name -> "host:port" of its stage link.
    remote_stages: dict[str, str] = field(default_factory=dict)
    worker_id: str = "worker-0"
    revision: str = "dev"
