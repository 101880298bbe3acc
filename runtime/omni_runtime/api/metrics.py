"""Prometheus metrics of one worker, in a registry of its own (one per app, so tests can run many).

Request counts by endpoint and status come from a small ASGI middleware; latencies and token
counts from the chat serving; queue depth and batch sizes are read from the engine at scrape
time, so they are never stale. Stages that run in their own processes (a thinker or talker pod
behind a stage link) report through the worker's scrape too (``Engine.refresh_stats``): their
stage series by stage name, their GPUs with a ``process`` label naming the stages they host.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omni_runtime.contract.engine import WAIT_BUCKETS, EngineStats, TimeHistogram
from omni_runtime.support.gc_pauses import GcPauses
from omni_runtime.support.loop_lag import INTERVAL_S, LAG_BUCKETS, METRIC

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
_RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def _buckets(histogram: TimeHistogram) -> list[tuple[str, float]]:
    """A TimeHistogram's cumulative buckets, as Prometheus exposes them (``le`` bounds, then +Inf)."""
    bounds = [*(str(b) for b in WAIT_BUCKETS), "+Inf"]
    return list(zip(bounds, itertools.accumulate(histogram.counts), strict=True))


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats], in_flight: Callable[[], int]) -> None:
        self._stats = stats
        self._in_flight = in_flight

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        stats = self._stats()
        busy = CounterMetricFamily(
            "omni_stage_busy_seconds",
            "Wall time each stage thread spent in calls (GPU waits included); its rate is the stage's utilisation.",
            labels=["stage"],
        )
        calls = CounterMetricFamily(
            "omni_stage_calls", "Calls (steps, batches) run by each stage thread.", labels=["stage"]
        )
        items = CounterMetricFamily(
            "omni_stage_items",
            "Rows stepped or items batched by each stage thread; items/calls is its mean batch.",
            labels=["stage"],
        )
        cancelled = CounterMetricFamily(
            "omni_stage_cancelled",
            "Rows finished by a cancel (thinker, talker) or queued items dropped unrun because their "
            "request was cancelled (vocoder, encoders).",
            labels=["stage"],
        )
        after_cancel = CounterMetricFamily(
            "omni_stage_busy_after_cancel_seconds",
            "Busy time each stage thread spent after a request of its running call was cancelled: "
            "the work a cancel could not stop (at most the rest of one call).",
            labels=["stage"],
        )
        working = GaugeMetricFamily(
            "omni_stage_working",
            "1 while a stage thread runs a call or has one waiting (busy seconds move only when a call ends).",
            labels=["stage"],
        )
        waits = HistogramMetricFamily(
            "omni_stage_wait_seconds",
            "How long work waited before a stage's call took it, by kind: admission (a request, "
            "submitted until taken into a thinker or talker step), first and later (a stream's first "
            "vocoder window and the rest), all (encoder requests).",
            labels=["stage", "kind"],
        )
        for load in stats.stages:
            for wait in load.waits:
                waits.add_metric([load.stage, wait.kind], _buckets(wait), wait.sum_s)
            working.add_metric([load.stage], 1.0 if load.working else 0.0)
            busy.add_metric([load.stage], load.busy_s)
            calls.add_metric([load.stage], load.calls)
            items.add_metric([load.stage], load.items)
            cancelled.add_metric([load.stage], load.cancelled)
            after_cancel.add_metric([load.stage], load.after_cancel_s)
        yield busy
        yield calls
        yield items
        yield cancelled
        yield after_cancel
        yield working
        yield waits
        phases = HistogramMetricFamily(
            "omni_first_audio_phase_seconds",
            "Where a streaming speech reply's time to first audio went, by phase, in order: prompt "
            "(preprocessing, media encoders), first_token (thinker admission and prefill), "
            "talker_first_code, first_window_codes (the first window's codes, at the thinker's pace), "
            "first_window (the vocoder's line and synthesis).",
            labels=["phase"],
        )
        for phase in stats.first_audio_phases:
            phases.add_metric([phase.kind], _buckets(phase), phase.sum_s)
        yield phases
        yield GaugeMetricFamily(
            "omni_queue_depth", "Requests waiting for a thinker slot.", value=stats.queue_depth
        )
        yield GaugeMetricFamily(
            "omni_running_batch_size",
            "Requests in the thinker's running batch now.",
            value=stats.running_batch,
        )
        yield GaugeMetricFamily(
            "omni_max_running_batch_size",
            "Largest thinker batch seen since the worker started.",
            value=stats.max_running_batch,
        )
        yield CounterMetricFamily(
            "omni_thinker_steps", "Thinker decode steps since the worker started.", value=stats.thinker_steps
        )
        yield CounterMetricFamily(
            "omni_thinker_steps_ahead",
            "Thinker decode steps queued before the previous step's tokens were read (OMNI_THINKER_AHEAD).",
            value=stats.thinker_steps_ahead,
        )
        yield GaugeMetricFamily(
            "omni_speech_replies",
            "Streaming speech replies in flight now (from their acceptance to their end): the load "
            "OMNI_BUSY_STREAMS compares with when a reply's first window is cut.",
            value=stats.speech_replies,
        )
        yield CounterMetricFamily(
            "omni_busy_first_windows",
            "Streaming speech replies whose first window was the longer one cut under load "
            "(OMNI_BUSY_STREAMS).",
            value=stats.busy_first_windows,
        )
        yield CounterMetricFamily(
            "omni_lingered_first_windows",
            "Streaming speech replies whose first window waited for other replies' first windows, "
            "a few codes from ready, to share one vocoder call.",
            value=stats.lingered_first_windows,
        )
        yield CounterMetricFamily(
            "omni_first_window_linger_seconds",
            "Seconds first windows waited for other replies' (omni_lingered_first_windows), in all.",
            value=stats.first_window_linger_seconds,
        )
        yield GaugeMetricFamily(
            "omni_engine_active_requests",
            "Requests the engine holds (queued or running).",
            value=stats.active_requests,
        )
        yield GaugeMetricFamily(
            "omni_active_sessions", "Client requests and sessions open on the API.", value=self._in_flight()
        )
        for name, help_text, value in (
            (
                "omni_encoder_cache_hits",
                "Encoder units served from the encoder cache.",
                stats.encoder_cache_hits,
            ),
            ("omni_encoder_cache_misses", "Encoder units sent to an encoder.", stats.encoder_cache_misses),
            (
                "omni_encoder_cache_evictions",
                "Encoder cache entries dropped for room.",
                stats.encoder_cache_evictions,
            ),
            (
                "omni_media_prefetch_submitted",
                "Media submitted for encoding ahead of its request.",
                stats.prefetch_submitted,
            ),
            ("omni_media_prefetch_done", "Media encoded ahead of its request.", stats.prefetch_done),
            (
                "omni_media_prefetch_failed",
                "Media refused while encoded ahead of its request.",
                stats.prefetch_failed,
            ),
        ):
            yield CounterMetricFamily(name, help_text, value=value)
        yield GaugeMetricFamily(
            "omni_encoder_cache_bytes", "Bytes of encoder outputs kept.", value=stats.encoder_cache_bytes
        )
        yield from _session_kv_metrics(stats)
        yield from _talker_kv_metrics(stats)
        yield from _gpu_metrics(stats)
        yield CounterMetricFamily(
            "omni_stage_stats_failures",
            "Scrapes in which a stage process behind a stage link did not report its counters in time "
            "(its series are missing from that scrape).",
            value=stats.remote_stats_failures,
        )


def _session_kv_metrics(stats: EngineStats) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Conversation KV (pipeline/conversation_kv.py): thinker KV kept between a session's turns."""
    for name, help_text, value in (
        ("omni_session_kv_hits", "Session turns admitted after a kept KV prefix.", stats.session_kv_hits),
        ("omni_session_kv_misses", "Session turns prefilled in full.", stats.session_kv_misses),
        (
            "omni_session_kv_reused_tokens",
            "Prompt tokens served from kept session KV instead of a prefill.",
            stats.session_kv_reused_tokens,
        ),
        (
            "omni_session_kv_prefilled_tokens",
            "Prompt tokens of session turns that were prefilled.",
            stats.session_kv_prefilled_tokens,
        ),
        ("omni_session_kv_evictions", "Kept session KV dropped for room.", stats.session_kv_evictions),
        (
            "omni_shared_prefix_hits",
            "Requests admitted after a shared prompt prefix's KV (OMNI_SHARED_PREFIX).",
            stats.session_kv_shared_hits,
        ),
        (
            "omni_shared_prefix_reused_tokens",
            "Prompt tokens served from shared prefixes' KV instead of a prefill.",
            stats.session_kv_shared_tokens,
        ),
    ):
        yield CounterMetricFamily(name, help_text, value=value)
    for name, help_text, value in (
        ("omni_session_kv_sessions", "Sessions with kept thinker KV.", stats.session_kv_entries),
        (
            "omni_shared_prefix_entries",
            "Shared prompt prefixes with kept thinker KV.",
            stats.session_kv_shared_entries,
        ),
        ("omni_session_kv_bytes", "Bytes of kept session KV and shared prefixes.", stats.session_kv_bytes),
        (
            "omni_session_kv_capacity_bytes",
            "Budget for kept session KV (--session-kv-mb).",
            stats.session_kv_capacity_bytes,
        ),
    ):
        yield GaugeMetricFamily(name, help_text, value=value)


def _talker_kv_metrics(stats: EngineStats) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The talker's own kept KV of session prompts (pipeline/talker.py), beside the thinker's."""
    counted = {
        "hits": "Talker rows admitted after a kept KV prefix.",
        "misses": "Talker rows of a session turn prefilled in full.",
        "reused_tokens": "Talker prompt positions served from kept KV instead of a prefill.",
        "prefilled_tokens": "Talker prompt positions of session turns that were prefilled.",
        "evictions": "Kept talker KV dropped for room.",
    }
    for suffix, help_text in counted.items():
        yield CounterMetricFamily(
            f"omni_talker_kv_{suffix}", help_text, value=getattr(stats, f"talker_kv_{suffix}")
        )
    yield GaugeMetricFamily(
        "omni_talker_kv_sessions", "Sessions with kept talker KV.", value=stats.talker_kv_entries
    )
    yield GaugeMetricFamily("omni_talker_kv_bytes", "Bytes of kept talker KV.", value=stats.talker_kv_bytes)


def _gpu_metrics(stats: EngineStats) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Each GPU's caching allocator: what it holds, and the retries that stall the whole GPU. The
    ``process`` label is empty for the worker's own GPUs and names a stage process's stages for its
    (each process numbers the GPUs it sees from 0)."""
    labels = ["gpu", "process"]
    allocated = GaugeMetricFamily(
        "omni_gpu_memory_allocated_bytes", "Bytes of live tensors on each GPU.", labels=labels
    )
    reserved = GaugeMetricFamily(
        "omni_gpu_memory_reserved_bytes",
        "Bytes the caching allocator holds on each GPU (live tensors and cached free blocks).",
        labels=labels,
    )
    retries = CounterMetricFamily(
        "omni_gpu_alloc_retries",
        "Allocations served only after every cached block was freed (each waits for the whole GPU).",
        labels=labels,
    )
    ooms = CounterMetricFamily(
        "omni_gpu_ooms", "Allocations that failed with out-of-memory on each GPU.", labels=labels
    )
    for gpu in stats.gpus:
        label = [str(gpu.gpu), gpu.process]
        allocated.add_metric(label, gpu.allocated_bytes)
        reserved.add_metric(label, gpu.reserved_bytes)
        retries.add_metric(label, gpu.alloc_retries)
        ooms.add_metric(label, gpu.ooms)
    yield from (allocated, reserved, retries, ooms)


class ApiMetrics:
    def __init__(self, *, stats: Callable[[], EngineStats], in_flight: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "omni_requests",
            "HTTP requests by endpoint and status.",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "omni_time_to_first_token_seconds",
            "From request arrival to the first text token.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttfa = Histogram(
            "omni_time_to_first_audio_seconds",
            "From request arrival to the first audio chunk.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "omni_request_duration_seconds",
            "From request arrival to the last event of a generation.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.loop_lag = Histogram(
            METRIC,
            f"How late the worker's event loop woke a task due every {INTERVAL_S * 1000:.0f} ms: what "
            "accepting and parsing requests, handing streams their tokens and writing SSE chunks "
            "waited for.",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self.tokens_per_second = Histogram(
            "omni_output_tokens_per_second",
            "Per request: completion tokens over the time after the first token.",
            buckets=_RATE_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter("omni_prompt_tokens", "Prompt tokens processed.", registry=self.registry)
        self.output_tokens = Counter(
            "omni_output_tokens", "Completion tokens generated.", registry=self.registry
        )
        self.audio_seconds = Counter(
            "omni_output_audio_seconds", "Seconds of speech generated.", registry=self.registry
        )
        self.registry.register(_EngineCollector(stats, in_flight))
        self.registry.register(GcPauses("omni"))  # the process's collections, timed once the app starts

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestCounter:
    """ASGI middleware counting responses per endpoint and status (streaming-safe: no body buffering)."""

    def __init__(self, app: ASGIApp, *, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}  # an exception before any response is a 500 the server sends

        async def send_counting(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(endpoint=endpoint, status=str(status["code"])).inc()
