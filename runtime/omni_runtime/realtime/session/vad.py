"""Silero VAD behind the `SpeechScorer` protocol: the one realtime module that imports torch.

The model (about 2 MB, shipped inside the silero-vad package) is loaded once per process and shared
by every session; each stream keeps its own recurrent state and 64-sample context and calls the
inner 16 kHz network directly, so sessions never disturb each other's state. Inference runs on one
dedicated thread: it keeps the event loop free and bounds VAD's CPU use to one core however many
sessions listen (a 32 ms frame costs well under a millisecond).

Importing silero_vad calls ``torch.set_num_threads(1)`` for the whole process; we restore the
previous value so the engine's CPU kernels keep their threads.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from omni_runtime.realtime.session.turn_detection import FRAME_SAMPLES

_CONTEXT = 64  # samples of the previous frame the 16 kHz network sees
_lock = threading.Lock()
_model: Any = None
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="silero-vad")


def _load() -> Any:
    global _model
    with _lock:
        if _model is None:
            threads = torch.get_num_threads()
            try:
                from silero_vad import load_silero_vad

                full = load_silero_vad()
            finally:
                torch.set_num_threads(threads)
            full.eval()
            _model = full._model  # the 16 kHz network: forward(x [B, 64+512], state [2, B, 128])
    return _model


class SileroScorer:
    """Speech probabilities for one audio stream (one session)."""

    def __init__(self) -> None:
        self._net = _load()
        self.reset()

    def reset(self) -> None:
        self._state = torch.zeros((2, 1, 128), dtype=torch.float32)
        self._context = torch.zeros((1, _CONTEXT), dtype=torch.float32)

    def _score_sync(self, frames: np.ndarray) -> np.ndarray:
        probs = np.empty(frames.shape[0], dtype=np.float32)
        with torch.inference_mode():
            for i, frame in enumerate(frames):
                x = torch.from_numpy(np.ascontiguousarray(frame, dtype=np.float32)).reshape(1, FRAME_SAMPLES)
                x = torch.cat([self._context, x], dim=1)
                out, self._state = self._net(x, self._state)
                self._context = x[:, -_CONTEXT:]
                probs[i] = float(out.reshape(-1)[0])
        return probs

    async def score(self, frames: np.ndarray) -> np.ndarray:
        if frames.size == 0:
            return np.zeros(0, dtype=np.float32)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_executor, self._score_sync, frames)


def silero_scorer() -> SileroScorer:
    """Factory handed to sessions (they import nothing from torch themselves)."""
    return SileroScorer()


async def preload() -> None:
    """Load the model off the event loop (call at start-up so the first session does not wait)."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(_executor, _load)
