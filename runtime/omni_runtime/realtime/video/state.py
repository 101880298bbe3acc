"""State of one /v1/video/chat/stream session: configuration, frame buffer, audio buffer.

Frames arrive as JPEG/PNG and are decoded, scaled to the worker's video pixel budget and to the
size of the session's first frame (the model takes a video as one T x H x W array), and filtered:
a frame whose similarity to the last kept frame reaches ``frame_filter_threshold`` is a near
duplicate and is dropped (a higher threshold keeps more frames). Past ``max_frames`` the oldest
frame is evicted; past the byte cap a frame is refused with an error event. Audio (PCM16 16 kHz)
accumulates until a query takes it (each query answers the audio sent since the previous one, as
in vLLM-Omni); a chunk that would pass the cap is an error that clears the buffered audio, so the
client knows exactly what the next query will hear (nothing older than the error).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from PIL import Image
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from omni_runtime.contract.engine import ChatTurn, MediaInput
from omni_runtime.media.image import decode_image
from omni_runtime.media.limits import MediaLimits
from omni_runtime.media.video import plan_frame_size
from omni_runtime.realtime.audio import MODEL_RATE
from omni_runtime.realtime.errors import AUDIO_BUFFER_FULL, VIDEO_BUFFER_FULL, ProtocolError
from omni_runtime.realtime.request_types import Flag, Int, Number, Text

_SIGNATURE_SIDE = 64  # frames are compared as 64 x 64 grayscale thumbnails


class VideoConfig(BaseModel):
    """The ``session.config`` body, strictly typed; legacy names are accepted as aliases.

    ``sampling_params_list`` / ``stage_params`` are checked by `sampling.resolve_sampling`, which
    names the stage and key of a bad value.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model: Text | None = None
    modalities: list[Literal["text", "audio"]] | None = None  # None: audio too when the worker speaks
    num_frames: Int = Field(
        default=4, ge=1, le=128, validation_alias=AliasChoices("num_frames", "num_sample_frames")
    )
    max_frames: Int = Field(default=50, ge=1, le=256)
    system_prompt: Text | None = None
    use_audio_in_video: Flag = True
    sampling_params_list: Any = None
    stage_params: Any = None
    enable_frame_filter: Flag = Field(
        True, validation_alias=AliasChoices("enable_frame_filter", "evs_enabled")
    )
    frame_filter_threshold: Number = Field(
        default=0.95, ge=0.0, le=1.0, validation_alias=AliasChoices("frame_filter_threshold", "evs_threshold")
    )
    video_fps: Number = Field(default=2.0, gt=0, le=60)  # the rate the sampled frames are presented at
    voice: Text | None = None


def signature(frame: np.ndarray) -> np.ndarray:
    image = (
        Image.fromarray(frame).convert("L").resize((_SIGNATURE_SIDE, _SIGNATURE_SIDE), Image.Resampling.BOX)
    )
    return np.asarray(image, dtype=np.float32) / 255.0


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """1 - mean absolute difference of two signatures: 1.0 for identical frames."""
    return float(1.0 - np.abs(a - b).mean())


FrameOutcome = Literal["kept", "filtered"]


@dataclass
class FrameResult:
    outcome: FrameOutcome
    evicted: int
    similarity: float | None


class VideoBuffer:
    def __init__(self, *, limits: MediaLimits, max_bytes: int, max_audio_seconds: float) -> None:
        self.limits = limits
        self.max_bytes = max_bytes
        self.max_audio = int(max_audio_seconds * MODEL_RATE)
        self.frames: deque[np.ndarray] = deque()
        self.frame_bytes = 0
        self.size: tuple[int, int] | None = None  # (width, height) every frame is scaled to
        self._last_signature: np.ndarray | None = None
        self.audio = np.zeros(0, dtype=np.float32)
        self.received = self.kept = self.filtered = self.evicted = 0
        self.audio_dropped_s = 0.0

    def stats(self) -> dict[str, Any]:
        return {
            "frames_received": self.received,
            "frames_kept": self.kept,
            "frames_filtered": self.filtered,
            "frames_evicted": self.evicted,
            "frames_buffered": len(self.frames),
            "audio_buffered_s": round(self.audio.size / MODEL_RATE, 3),
        }

    def _fit(self, frame: np.ndarray) -> np.ndarray:
        height, width = frame.shape[:2]
        if self.size is None:
            self.size = plan_frame_size(
                width=width, height=height, min_pixels=None, max_pixels=self.limits.default_video_max_pixels
            )
        if (width, height) == self.size:
            return frame
        return np.asarray(Image.fromarray(frame).resize(self.size, Image.Resampling.BICUBIC), dtype=np.uint8)

    def add_frame(self, data: bytes, *, config: VideoConfig) -> FrameResult:
        """Decode, filter and buffer one frame (CPU work: call it off the event loop)."""
        frame = self._fit(decode_image(data, limits=self.limits))
        self.received += 1
        sig = signature(frame)
        score = None if self._last_signature is None else similarity(sig, self._last_signature)
        if config.enable_frame_filter and score is not None and score >= config.frame_filter_threshold:
            self.filtered += 1
            return FrameResult(outcome="filtered", evicted=0, similarity=score)
        if self.frame_bytes + frame.nbytes > self.max_bytes:
            raise ProtocolError(
                f"the frame buffer holds {self.frame_bytes} bytes of decoded frames; this frame would pass the "
                f"limit of {self.max_bytes} (lower max_frames or send smaller frames)",
                code=VIDEO_BUFFER_FULL,
                param="data",
            )
        self.frames.append(frame)
        self.frame_bytes += frame.nbytes
        self._last_signature = sig
        self.kept += 1
        evicted = 0
        while len(self.frames) > config.max_frames:
            self.frame_bytes -= self.frames.popleft().nbytes
            evicted += 1
        self.evicted += evicted
        return FrameResult(outcome="kept", evicted=evicted, similarity=score)

    def trim_frames(self, max_frames: int) -> int:
        evicted = 0
        while len(self.frames) > max_frames:
            self.frame_bytes -= self.frames.popleft().nbytes
            evicted += 1
        self.evicted += evicted
        return evicted

    def add_audio(self, pcm: np.ndarray, *, param: str = "data") -> None:
        """Append 16 kHz audio; past the cap the buffered audio is cleared and an error raised."""
        if self.audio.size + pcm.size > self.max_audio:
            dropped = self.audio.size + pcm.size
            self.audio_dropped_s += dropped / MODEL_RATE
            self.audio = np.zeros(0, dtype=np.float32)
            raise ProtocolError(
                f"audio buffer overflow: {dropped / MODEL_RATE:.1f} s of audio would pass the limit of "
                f"{self.max_audio / MODEL_RATE:.1f} s; the buffered audio and this chunk were dropped "
                "(send a video.query sooner: each query takes the audio sent before it)",
                code=AUDIO_BUFFER_FULL,
                param=param,
            )
        self.audio = np.concatenate([self.audio, pcm.astype(np.float32)])

    def take_audio(self) -> np.ndarray:
        audio, self.audio = self.audio, np.zeros(0, dtype=np.float32)
        return audio

    def sample_frames(self, count: int) -> np.ndarray | None:
        """``count`` frames spread evenly over the buffer (an even number when 2 or more)."""
        total = len(self.frames)
        if total == 0:
            return None
        count = min(count, total)
        if count >= 2:
            count -= count % 2
        picks = np.linspace(0, total - 1, count).round().astype(int)
        frames = list(self.frames)
        return np.stack([frames[i] for i in picks])

    def query_turn(self, text: str, *, config: VideoConfig) -> ChatTurn:
        """The user turn of a query: frames sampled now, and the audio buffered so far (taken)."""
        media: list[MediaInput] = []
        video = self.sample_frames(config.num_frames)
        if video is not None:
            media.append(MediaInput(kind="video", data=video, fps=config.video_fps))
        audio = self.take_audio()
        if config.use_audio_in_video and audio.size:
            media.append(MediaInput(kind="audio", data=audio, sample_rate=MODEL_RATE))
        return ChatTurn(role="user", text=text, media=tuple(media))
