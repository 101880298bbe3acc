"""Stage payloads as stage-link frames: a JSON payload plus named tensors.

Each stage call that can cross a process boundary has one pack/unpack pair here, used by the
client side (remote.py) and the server side (stage_server.py), so both agree by construction.
Tensors stay tensors (numpy arrays or CPU torch tensors); everything else goes in the JSON.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from omni_runtime.contract.adapter import Prompt, RowSampling, TalkerAdmission, ThinkerPrompt
from omni_runtime.contract.engine import (
    ChatTurn,
    GenerationRequest,
    GpuMemory,
    MediaInput,
    ProcessStats,
    SamplingParams,
    StageLoad,
    TimeHistogram,
)

Frame = tuple[dict[str, Any], dict[str, Any]]


def pack_request(request: GenerationRequest) -> Frame:
    tensors: dict[str, Any] = {}
    turns = []
    for t, turn in enumerate(request.turns):
        media = []
        for m, item in enumerate(turn.media):
            name = f"media.{t}.{m}"
            tensors[name] = np.ascontiguousarray(item.data)
            if item.soundtrack is not None:
                tensors[f"{name}.soundtrack"] = np.ascontiguousarray(item.soundtrack)
            media.append(
                {"kind": item.kind, "tensor": name, "sample_rate": item.sample_rate, "fps": item.fps}
            )
        turns.append({"role": turn.role, "text": turn.text, "media": media})
    sampling = asdict(request.sampling)
    sampling["stop"] = list(request.sampling.stop)
    payload = {
        "request_id": request.request_id,
        "turns": turns,
        "sampling": sampling,
        "want_audio": request.want_audio,
        "voice": request.voice,
        "stream_audio": request.stream_audio,
        "stage_params": request.stage_params,
    }
    return payload, tensors


def unpack_request(payload: dict[str, Any], tensors: dict[str, Any]) -> GenerationRequest:
    turns = tuple(
        ChatTurn(
            role=turn["role"],
            text=turn["text"],
            media=tuple(
                MediaInput(
                    kind=m["kind"],
                    data=np.asarray(tensors[m["tensor"]]),
                    sample_rate=m["sample_rate"],
                    fps=m["fps"],
                    soundtrack=(
                        np.asarray(tensors[f"{m['tensor']}.soundtrack"])
                        if f"{m['tensor']}.soundtrack" in tensors
                        else None
                    ),
                )
                for m in turn["media"]
            ),
        )
        for turn in payload["turns"]
    )
    sampling = dict(payload["sampling"])
    sampling["stop"] = tuple(sampling.get("stop", ()))
    return GenerationRequest(
        request_id=payload["request_id"],
        turns=turns,
        sampling=SamplingParams(**sampling),
        want_audio=payload["want_audio"],
        voice=payload["voice"],
        stream_audio=payload["stream_audio"],
        stage_params=payload["stage_params"],
    )


def _prefixed(prefix: str, values: dict[str, Any] | None) -> dict[str, Any]:
    return {f"{prefix}.{k}": v for k, v in (values or {}).items() if v is not None}


def _strip(prefix: str, tensors: dict[str, Any]) -> dict[str, Any] | None:
    found = {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
    return found or None


def pack_prompt(prompt: Prompt) -> Frame:
    tensors = {
        **_prefixed("audio", prompt.audio),
        **_prefixed("images", prompt.images),
        **_prefixed("videos", prompt.videos),
    }
    return {"input_ids": prompt.input_ids, "audio_in_video": prompt.audio_in_video}, tensors


def unpack_prompt(payload: dict[str, Any], tensors: dict[str, Any]) -> Prompt:
    return Prompt(
        input_ids=list(payload["input_ids"]),
        audio=_strip("audio", tensors),
        images=_strip("images", tensors),
        videos=_strip("videos", tensors),
        audio_in_video=bool(payload.get("audio_in_video", False)),
    )


def pack_thinker_prompt(prompt: ThinkerPrompt) -> Frame:
    tensors = {
        "embeds": prompt.embeds,
        "positions": prompt.positions,
        **_prefixed("ctx", prompt.talker_context),
    }
    return {"input_ids": prompt.input_ids, "rope_delta": prompt.rope_delta}, tensors


def unpack_thinker_prompt(payload: dict[str, Any], tensors: dict[str, Any]) -> ThinkerPrompt:
    return ThinkerPrompt(
        input_ids=list(payload["input_ids"]),
        embeds=tensors["embeds"],
        positions=tensors["positions"],
        rope_delta=int(payload["rope_delta"]),
        talker_context=_strip("ctx", tensors) or {},
    )


def pack_sampling(sampling: RowSampling) -> dict[str, Any]:
    data = asdict(sampling)
    data["suppress_tokens"] = list(sampling.suppress_tokens)
    return data


def unpack_sampling(data: dict[str, Any]) -> RowSampling:
    return RowSampling(**{**data, "suppress_tokens": tuple(data.get("suppress_tokens", ()))})


def pack_talker_admission(adm: TalkerAdmission) -> Frame:
    payload = {
        "input_ids": adm.input_ids,
        "first_token": adm.first_token,
        "voice": adm.voice,
        "sampling": pack_sampling(adm.sampling),
        "ignore_eos": adm.ignore_eos,
    }
    tensors = {
        "prompt_vectors": adm.prompt_vectors,
        "first_vector": adm.first_vector,
        **_prefixed("ctx", adm.talker_context),
    }
    return payload, tensors


def unpack_talker_admission(payload: dict[str, Any], tensors: dict[str, Any]) -> TalkerAdmission:
    return TalkerAdmission(
        slot=-1,
        input_ids=list(payload["input_ids"]),
        talker_context=_strip("ctx", tensors) or {},
        prompt_vectors=tensors["prompt_vectors"],
        first_token=int(payload["first_token"]),
        first_vector=tensors["first_vector"],
        voice=payload["voice"],
        sampling=unpack_sampling(payload["sampling"]),
        ignore_eos=bool(payload.get("ignore_eos", False)),
    )


def pack_process_stats(stats: ProcessStats) -> dict[str, Any]:
    """A stage process's counters as the ``stats.get`` reply's JSON (no tensors)."""
    return asdict(stats)


def unpack_process_stats(payload: dict[str, Any]) -> ProcessStats:
    stages = tuple(
        StageLoad(
            **{
                **load,
                "waits": tuple(
                    TimeHistogram(w["kind"], tuple(w["counts"]), w["sum_s"]) for w in load["waits"]
                ),
            }
        )
        for load in payload["stages"]
    )
    return ProcessStats(
        process=str(payload["process"]),
        queue_depth=int(payload["queue_depth"]),
        running_batch=int(payload.get("running_batch", 0)),
        max_running_batch=int(payload.get("max_running_batch", 0)),
        thinker_steps=int(payload.get("thinker_steps", 0)),
        thinker_steps_ahead=int(payload.get("thinker_steps_ahead", 0)),
        stages=stages,
        gpus=tuple(GpuMemory(**gpu) for gpu in payload["gpus"]),
        session_kv={str(k): int(v) for k, v in payload["session_kv"].items()},
        talker_kv={str(k): int(v) for k, v in payload["talker_kv"].items()},
    )
