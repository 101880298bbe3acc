"""Worker states: one vocabulary for the worker table the control plane writes and the router reads.

The operator publishes each worker's state (OmniDeployment status, the worker Service's
annotation, `omni up`'s workers.json); the router admits sessions only to ``ready`` workers and
lets ``draining`` ones finish theirs.

It also names the speech capacity signal a worker gives and the router reads: a worker at its
``--max-speech-streams`` limit refuses a new speech request or session with the header
``x-omni-capacity: speech`` (on the 429, or on the WebSocket handshake before its 1013 close), and the
router then tries another worker (omni_runtime.realtime.capacity, omni_runtime.router.http_proxy).
"""

from __future__ import annotations

from enum import StrEnum


class WorkerState(StrEnum):
    starting = "starting"  # created, not yet ready and warmed up
    ready = "ready"  # complete, ready and admitted: takes new sessions
    draining = "draining"  # takes no new sessions; live ones finish (or the drain deadline passes)
    gone = "gone"  # removed


CAPACITY_HEADER = "x-omni-capacity"
CAPACITY_SPEECH = "speech"  # the header's value on a refusal at the speech stream limit
DEFAULT_MAX_SPEECH_STREAMS = 16  # `omni serve --max-speech-streams`, OmniDeployment maxSpeechStreams
