"""The value switches' formats, checked before a worker loads anything.

`omni_runtime.contract.switches` checks flags and choices. A value switch (``kind == "value"``) has
its format where it is used; this module runs each one's own parser over the environment, so
``omni serve`` and ``omni stage`` refuse a wrong value at once, in its parser's words, rather than
minutes later when the stage that reads it starts (or, for a CUDA stream priority, in a stage
thread)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from omni_runtime.contract import switches


def _parsers() -> dict[str, Callable[[str], object]]:
    from omni_runtime.models.qwen2_5_omni.placement import stream_priorities
    from omni_runtime.models.window_graphs import vocoder_buckets
    from omni_runtime.pipeline.deadlines import far_windows
    from omni_runtime.pipeline.segmenter import with_busy_streams

    return {
        "OMNI_BUSY_STREAMS": lambda value: with_busy_streams({"first_chunk_busy": 1}, value),
        "OMNI_VOCODER_BUCKETS": vocoder_buckets,
        "OMNI_VOCODER_FAR": far_windows,
        "OMNI_STREAM_PRIORITIES": stream_priorities,
    }


def value_problems(environ: Mapping[str, str]) -> list[str]:
    """Each set value switch whose parser refuses its value: the parser's message."""
    found = []
    for name, parse in _parsers().items():
        value = environ.get(name, "")
        if value:  # blank but not empty: the parser refuses it now rather than as its stage starts
            try:
                parse(value)
            except ValueError as exc:
                found.append(str(exc))
    return found


def all_problems(environ: Mapping[str, str]) -> list[str]:
    """`switches.problems` (flags, choices, names one letter off), then `value_problems`."""
    return switches.problems(environ) + value_problems(environ)


def value_switches() -> set[str]:
    """The value switches this module checks (a test holds it to the registry's)."""
    return set(_parsers())
