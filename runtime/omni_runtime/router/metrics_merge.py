"""One /metrics for `omni router --processes N`: the replicas' exposition texts merged.

A scrape of the shared port reaches whichever replica the kernel gave the connection. That replica
fetches its siblings' own series over their private unix sockets (`/metrics?scope=replica`) and
answers with the sum, so a scraper sees one router whose counters only grow, whichever replica
answered. Counters, histograms and session gauges add up across replicas. A worker is in rotation
when any replica has it there (max). Series of one replica only, such as
`omni_router_replica_info{replica}`, pass through as they are.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

REPLICA_SCOPE = "replica"  # /metrics?scope=replica: this replica's own series, not merged
MAX_FAMILIES = frozenset({"omni_router_worker_in_rotation"})


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def merge_metrics(texts: Iterable[str]) -> bytes:
    """The Prometheus text of several replicas, merged series by series."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            series = values.setdefault(family.name, {})
            combine = max if family.name in MAX_FAMILIES else operator.add
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                series[key] = combine(series[key], sample.value) if key in series else sample.value
    registry = CollectorRegistry(auto_describe=False)
    out: list[Metric] = []
    for name, family in families.items():  # samples in first-seen order, once every text is read
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
        out.append(family)
    registry.register(_Merged(out))
    return generate_latest(registry)
