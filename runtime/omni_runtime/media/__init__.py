"""Decoding and encoding of audio, images and video for the API (no torch here).

Inputs: `load_audio` (16 kHz mono float32), `load_image` (RGB uint8), `load_video` (sampled RGB
frames); outputs: `encode_wav` (header states the true rate) and `to_pcm16`. Client mistakes
raise `MediaError` with a stable code and the HTTP status to answer with.
"""

from omni_runtime.media.audio import ENCODER_SAMPLE_RATE, decode_audio, encode_wav, to_pcm16, wav_header
from omni_runtime.media.errors import MediaError
from omni_runtime.media.image import decode_image
from omni_runtime.media.limits import MediaLimits
from omni_runtime.media.loader import load_audio, load_image, load_video
from omni_runtime.media.resample import resample
from omni_runtime.media.video import DecodedVideo, VideoOptions, decode_video

__all__ = [
    "ENCODER_SAMPLE_RATE",
    "DecodedVideo",
    "MediaError",
    "MediaLimits",
    "VideoOptions",
    "decode_audio",
    "decode_image",
    "decode_video",
    "encode_wav",
    "load_audio",
    "load_image",
    "load_video",
    "resample",
    "to_pcm16",
    "wav_header",
]
