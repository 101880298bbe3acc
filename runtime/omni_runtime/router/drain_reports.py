"""Which session reports this router replica writes on draining workers' Services.

The operator drains a worker by annotating its Service `omni.dev/worker-state: draining` and
`omni.dev/drain-started: <value>`. It waits for the worker's sessions to end, up to the drain
timeout, and ends the drain early once every router replica reports zero live sessions on that
worker. Each replica reports under its own key on the worker's Service:

    live-sessions.omni.dev/<replica>: '{"drain": "<the drain-started value it saw>", "sessions": N}'

(operator/omni_operator/reconcile/workers.py parses it; the strings are repeated here by value
because the data plane never imports the control plane). The drain value ties a report to one drain,
so a report left from an earlier drain never ends a later one and no clocks need to agree.

This module is pure: from the draining rows the source sees, the live session counts the router
tracks (open WebSockets plus in-flight requests per worker) and what was last published, it decides
which merge patches to send. A report is sent when the replica first sees a drain and whenever the
count changes; nothing is sent when the Service already carries exactly the wanted report (a
restarted replica does not rewrite it).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

LIVE_SESSIONS_PREFIX = "live-sessions.omni.dev/"  # omni_operator.reconcile.workers.LIVE_SESSIONS_PREFIX
MAX_NAME_PART = 63  # an annotation key's name part (after the "/") is at most 63 characters
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Report:
    """One replica's report on one drain: the drain it saw and its live sessions on the worker."""

    drain: str
    sessions: int

    def value(self) -> str:
        """The annotation value, in the exact shape the operator parses."""
        return json.dumps({"drain": self.drain, "sessions": self.sessions})

    @staticmethod
    def parse(value: str | None) -> Report | None:
        """A report read back from a Service; None when absent or not a report."""
        if not value:
            return None
        try:
            body = json.loads(value)
            drain, sessions = body["drain"], body["sessions"]
        except (ValueError, TypeError, KeyError):
            return None
        if not isinstance(drain, str) or not isinstance(sessions, int) or isinstance(sessions, bool):
            return None
        return Report(drain=drain, sessions=sessions)


@dataclass(frozen=True)
class DrainRow:
    """A worker Service that says draining and carries a drain-started value."""

    service: str  # the Service's name: what the patch addresses
    worker: str  # the worker id (label omni.dev/worker): what the router counts sessions by
    drain: str  # the omni.dev/drain-started value
    observed: str | None = None  # this replica's report annotation as last seen on the Service


@dataclass(frozen=True)
class ReportPatch:
    """A merge patch of one Service's annotations: {key: report value}."""

    service: str
    key: str
    report: Report

    def body(self) -> dict[str, dict[str, dict[str, str]]]:
        return {"metadata": {"annotations": {self.key: self.report.value()}}}


def report_key(replica: str) -> str:
    """This replica's annotation key. Pod names fit an annotation name part (63 characters) in
    practice; a longer or odd name is shortened with a hash, so every replica keeps its own key."""
    if len(replica) <= MAX_NAME_PART and _NAME_PART.match(replica):
        return LIVE_SESSIONS_PREFIX + replica
    digest = hashlib.sha256(replica.encode()).hexdigest()[:10]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", replica).strip("-_.")[: MAX_NAME_PART - 11].rstrip("-_.")
    return LIVE_SESSIONS_PREFIX + (f"{cleaned}-{digest}" if cleaned else digest)


def reports_to_publish(
    rows: Iterable[DrainRow],
    *,
    sessions: Mapping[str, int],
    published: Mapping[str, Report],
    key: str,
) -> list[ReportPatch]:
    """The patches to send now, sorted by Service name.

    `sessions`: live sessions by worker id (a worker the router does not know has none).
    `published`: the report this replica last wrote successfully, by Service name. A report is
    due when it differs from both the last one written and the one seen on the Service: the first
    sight of a drain, a new drain value, or a changed count.
    """
    out: list[ReportPatch] = []
    for row in rows:
        wanted = Report(drain=row.drain, sessions=max(0, sessions.get(row.worker, 0)))
        if published.get(row.service) == wanted or Report.parse(row.observed) == wanted:
            continue
        out.append(ReportPatch(service=row.service, key=key, report=wanted))
    return sorted(out, key=lambda patch: patch.service)


def still_draining(published: Mapping[str, Report], rows: Iterable[DrainRow]) -> dict[str, Report]:
    """`published` without the Services that no longer drain (or the drain value changed), so a
    later drain of the same worker is reported afresh."""
    current = {row.service: row.drain for row in rows}
    return {name: report for name, report in published.items() if current.get(name) == report.drain}
