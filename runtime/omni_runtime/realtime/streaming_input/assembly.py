"""The user turn of a streaming-input session, built chunk by chunk, with its early encoder work.

Chunks come here in sequence order. Each is decoded as it comes (text, PCM16 resampled to the
model rate, images and video frames decoded); once the session's start policy has fired, media
whose encoding does not depend on what comes later is also handed to the engine to preprocess and
encode ahead of the request (`Engine.prefetch_media`): each image, and each pair of video frames
(the vision tower's temporal patch). The request built at the end of input carries the same media,
so its encoder stages find those outputs in the engine's encoder cache and only the rest is new.

Audio is not encoded early: the session's audio chunks are one audio input, and its log-mel
features are normalised by the whole clip's peak, so no prefix of it encodes exactly as the
whole does. Incremental audio encoding and prefill belong to issue 20 (session KV).
"""

from __future__ import annotations

from functools import partial

import anyio.to_thread
import numpy as np

from omni_runtime.contract.engine import Engine, MediaInput
from omni_runtime.media.image import decode_image
from omni_runtime.media.limits import MediaLimits
from omni_runtime.realtime.audio import MODEL_RATE, StreamingResampler, pcm16_to_float
from omni_runtime.realtime.streaming_input.models import Modality

FRAMES_PER_GROUP = 2  # the vision tower's temporal patch: frames encoded together


class Assembly:
    """The user turn being built, in sequence order, and the media sent ahead for encoding."""

    def __init__(self, *, audio_rate: int, video_fps: float, limits: MediaLimits) -> None:
        self.text: list[str] = []
        self.order: list[Modality] = []
        self.resampler = StreamingResampler(orig_sr=audio_rate, target_sr=MODEL_RATE)
        self.audio: list[np.ndarray] = []
        self.images: list[np.ndarray] = []
        self.frames: list[np.ndarray] = []
        self.video_fps = video_fps
        self.limits = limits
        self.prefetched = 0  # media submissions the engine accepted
        self._sent_images = 0
        self._sent_frames = 0

    async def add(self, modality: Modality, raw: bytes) -> None:
        """Decode one in-order chunk into the turn (MediaError for undecodable media)."""
        if modality not in self.order:
            self.order.append(modality)
        if modality == "text":
            self.text.append(raw.decode("utf-8"))
        elif modality == "audio":
            self.audio.append(self.resampler.push(pcm16_to_float(raw, param="payload")))
        else:
            image = await anyio.to_thread.run_sync(partial(decode_image, raw, limits=self.limits))
            if modality == "image":
                self.images.append(image)
            else:
                self.frames.append(_fit(image, self.frames[0]) if self.frames else image)

    def prefetch(self, engine: Engine) -> None:
        """Send the media that can be encoded ahead and was not sent yet (images, whole frame pairs)."""
        for image in self.images[self._sent_images :]:
            self.prefetched += engine.prefetch_media([MediaInput(kind="image", data=image)])
        self._sent_images = len(self.images)
        while self._sent_frames + FRAMES_PER_GROUP <= len(self.frames):
            group = np.stack(self.frames[self._sent_frames : self._sent_frames + FRAMES_PER_GROUP])
            self.prefetched += engine.prefetch_media(
                [MediaInput(kind="video", data=group, fps=self.video_fps)]
            )
            self._sent_frames += FRAMES_PER_GROUP

    def media(self) -> list[MediaInput]:
        """The turn's media in first-arrival order of their kinds: one audio, the images, one video."""
        media: list[MediaInput] = []
        for modality in self.order:
            if modality == "audio":
                pcm = np.concatenate([*self.audio, self.resampler.flush()])
                self.audio = [pcm]
                media.append(MediaInput(kind="audio", data=pcm, sample_rate=MODEL_RATE))
            elif modality == "image":
                media.extend(MediaInput(kind="image", data=image) for image in self.images)
            elif modality == "video":
                if not self.frames:
                    raise ValueError("no video frames")
                media.append(MediaInput(kind="video", data=np.stack(self.frames), fps=self.video_fps))
        return media


def _fit(frame: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Frames of one video share a size: a stream that changed resolution is scaled to its first."""
    height, width = first.shape[:2]
    if frame.shape[:2] == (height, width):
        return frame
    from PIL import Image

    return np.asarray(Image.fromarray(frame).resize((width, height)), dtype=np.uint8)
