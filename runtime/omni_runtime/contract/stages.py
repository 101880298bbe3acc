"""The stage graph: stage names, pipeline variants, and who feeds whom (one definition).

The runtime wires its stages from this graph and the operator's planner derives each worker's
stages and edges from it, so a pod's ``--stages`` and the engine's stage set always agree.
Graph order (the order of ``Stage``) is the order stages are listed everywhere: pods' --stages,
annotations, --remote-stage flags.
"""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    preprocessing = "preprocessing"  # chat turns + media -> token ids and encoder inputs (CPU)
    audio_encoder = "audio_encoder"
    image_encoder = "image_encoder"  # images and video frames
    mm_aggregate = "mm_aggregate"  # media embeddings scattered into the token embeddings
    thinker = "thinker"  # the LLM: continuous batching over a slot KV cache
    decode = "decode"  # incremental detokenizer and stop strings
    talker = "talker"  # thinker reply vectors -> codec tokens
    segmenter = "segmenter"  # cuts the codec stream into vocoder windows (streaming speech)
    talker_stream = "talker_stream"  # the vocoder: codec windows -> audio


STAGES: tuple[Stage, ...] = tuple(Stage)

TEXT_STAGES: tuple[Stage, ...] = (
    Stage.preprocessing,
    Stage.audio_encoder,
    Stage.image_encoder,
    Stage.mm_aggregate,
    Stage.thinker,
    Stage.decode,
)
# The stages of each pipeline variant, in graph order. Duplex is streaming speech whose realtime
# sessions are full duplex by default (listen while speaking, barge-in, the thinker's
# listen/speak decision): the same graph, other session defaults.
_STREAMING = (*TEXT_STAGES, Stage.talker, Stage.segmenter, Stage.talker_stream)
VARIANTS: dict[str, tuple[Stage, ...]] = {
    "text": TEXT_STAGES,
    "speech": (*TEXT_STAGES, Stage.talker),
    "streaming-speech": _STREAMING,
    "duplex": _STREAMING,
}
# Variants that send each reply's audio as it is made (the segmenter's windows).
STREAMING_AUDIO: frozenset[str] = frozenset({"streaming-speech", "duplex"})

# Data flow, in graph order: preprocessing feeds the encoders and mm_aggregate (the token ids),
# the encoders feed mm_aggregate, the thinker feeds decode (tokens) and the talker (reply
# vectors); the segmenter cuts the talker's codec stream into windows talker_stream voices.
EDGES: tuple[tuple[Stage, Stage], ...] = (
    (Stage.preprocessing, Stage.audio_encoder),
    (Stage.preprocessing, Stage.image_encoder),
    (Stage.preprocessing, Stage.mm_aggregate),
    (Stage.audio_encoder, Stage.mm_aggregate),
    (Stage.image_encoder, Stage.mm_aggregate),
    (Stage.mm_aggregate, Stage.thinker),
    (Stage.thinker, Stage.decode),
    (Stage.thinker, Stage.talker),
    (Stage.talker, Stage.segmenter),
    (Stage.segmenter, Stage.talker_stream),
)

# Where each stage may run. The decode stage and the segmenter are cheap per-request logic and
# always run in the engine's own process (the worker's API process); every other stage can live in
# another process behind a stage link (``omni stage``), talker_stream (the vocoder) always in the
# process of the talker.
ENGINE_LOCAL: tuple[Stage, ...] = (Stage.decode, Stage.segmenter)
COLOCATED: dict[Stage, Stage] = {Stage.talker_stream: Stage.talker}
# Stages an engine may name in --remote-stage (a colocated stage follows its host).
REMOTABLE: tuple[Stage, ...] = tuple(s for s in STAGES if s not in ENGINE_LOCAL and s not in COLOCATED)
# Stages a stage process (``omni stage --stages``) may host.
HOSTABLE: tuple[Stage, ...] = tuple(s for s in STAGES if s not in ENGINE_LOCAL)


def with_colocated(stages: set[Stage] | frozenset[Stage]) -> frozenset[Stage]:
    """``stages`` plus the stages that run wherever one of them runs (talker <-> talker_stream)."""
    out = set(stages)
    for follower, host in COLOCATED.items():
        if host in out or follower in out:
            out |= {host, follower}
    return frozenset(out)


def edges_among(stages: tuple[Stage, ...] | frozenset[Stage] | set[Stage]) -> tuple[tuple[Stage, Stage], ...]:
    """The graph's edges whose two ends are both in ``stages``, in graph order."""
    present = set(stages)
    return tuple((a, b) for a, b in EDGES if a in present and b in present)
