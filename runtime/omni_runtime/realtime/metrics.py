"""Prometheus metrics of the realtime endpoints: live sessions, limits, errors, barge-ins, latency.

The metrics live in a registry the caller passes (the worker's, so /metrics shows them next to the
API's), or a private one, so several servers can share a process in tests without duplicate-metric
errors. The configured limits are exported as one gauge, so dashboards can draw each live count
against its cap.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from omni_runtime.realtime.settings import RealtimeSettings

# End of user speech to first response output: from tens of milliseconds on a GPU to seconds on a CPU.
_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)

KINDS = ("realtime", "video", "streaming_input")


class RealtimeMetrics:
    def __init__(self, *, settings: RealtimeSettings, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.sessions = Gauge(
            "omni_realtime_sessions",
            "Live sessions by kind (realtime, video, streaming_input).",
            ["kind"],
            registry=reg,
        )
        self.sessions_started = Counter(
            "omni_realtime_sessions_started", "Sessions opened, by kind.", ["kind"], registry=reg
        )
        self.sessions_refused = Counter(
            "omni_realtime_sessions_refused",
            "Sessions refused because the worker was at its session limit, by kind.",
            ["kind"],
            registry=reg,
        )
        self.errors = Counter(
            "omni_realtime_errors",
            "Protocol errors answered to clients, by kind and code.",
            ["kind", "code"],
            registry=reg,
        )
        self.limit = Gauge(
            "omni_realtime_limit",
            "Configured limits of the realtime endpoints, by name.",
            ["name"],
            registry=reg,
        )
        self.responses = Counter(
            "omni_realtime_responses",
            "Realtime responses finished, by final status.",
            ["status"],
            registry=reg,
        )
        self.barge_ins = Counter(
            "omni_realtime_barge_ins", "Responses cancelled because the user started speaking.", registry=reg
        )
        self.backchannels = Counter(
            "omni_realtime_backchannels",
            "Short user speech during a response that did not cancel it (overlap policy).",
            registry=reg,
        )
        self.stale_dropped = Counter(
            "omni_realtime_stale_deltas_dropped",
            "Queued deltas of a cancelled response (an older epoch) dropped before sending.",
            registry=reg,
        )
        self.resumes = Counter(
            "omni_realtime_resumes", "Duplex sessions resumed by a reconnecting client.", registry=reg
        )
        self.first_output = Histogram(
            "omni_realtime_first_output_seconds",
            "End of user speech (commit or VAD stop) to the first response audio (or text) delta.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.duplex_decisions = Counter(
            "omni_realtime_duplex_decisions",
            "Listen/speak decisions of model-driven duplex sessions, by action and reason.",
            ["action", "reason"],
            registry=reg,
        )
        self.duplex_probes = Counter(
            "omni_realtime_duplex_probes",
            "One-token probes asking the thinker whether it takes the turn, by finish reason.",
            ["reason"],
            registry=reg,
        )
        self.video_frames = Counter(
            "omni_realtime_video_frames",
            "Video frames received, by outcome (kept, filtered, evicted).",
            ["outcome"],
            registry=reg,
        )
        self.streaming_input_bytes = Counter(
            "omni_realtime_streaming_input_bytes",
            "Decoded payload bytes accepted by streaming-input sessions.",
            registry=reg,
        )
        for kind in KINDS:
            self.sessions.labels(kind=kind).set(0)
        for name, value in settings.limits().items():
            self.limit.labels(name=name).set(value)
