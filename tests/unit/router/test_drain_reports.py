"""The router's session reports on draining workers: what it writes, when, and that the operator
reads it as meant."""

from __future__ import annotations

import json

from omni_operator.reconcile.workers import LIVE_SESSIONS_PREFIX, live_sessions
from omni_runtime.router import drain_reports
from omni_runtime.router.drain_reports import (
    DrainRow,
    Report,
    ReportPatch,
    report_key,
    reports_to_publish,
    still_draining,
)
from omni_runtime.router.k8s_source import drain_rows

KEY = "live-sessions.omni.dev/router-a"
D1 = "2026-01-01T00:05:00Z"
D2 = "2026-01-01T00:09:00Z"


def service(name: str, *, state: str | None = None, drain: str | None = None, **extra: str) -> dict:
    annotations = {**extra}
    if state:
        annotations["omni.dev/worker-state"] = state
    if drain:
        annotations["omni.dev/drain-started"] = drain
    return {
        "metadata": {
            "name": name,
            "labels": {"omni.dev/deployment": "tiny", "omni.dev/worker": name},
            "annotations": annotations,
        }
    }


def test_the_report_value_is_the_json_the_operator_parses() -> None:
    assert drain_reports.LIVE_SESSIONS_PREFIX == LIVE_SESSIONS_PREFIX
    assert Report(drain=D1, sessions=0).value() == '{"drain": "2026-01-01T00:05:00Z", "sessions": 0}'
    annotations = {KEY: Report(drain=D1, sessions=0).value()}
    assert live_sessions(annotations, drain=D1, routers=1) == 0
    assert live_sessions(annotations, drain=D2, routers=1) is None  # another drain: no report
    assert live_sessions({KEY: Report(drain=D1, sessions=3).value()}, drain=D1, routers=1) == 3
    patch = ReportPatch(service="tiny-w0", key=KEY, report=Report(drain=D1, sessions=2))
    assert patch.body() == {
        "metadata": {"annotations": {KEY: '{"drain": "2026-01-01T00:05:00Z", "sessions": 2}'}}
    }


def test_parse_reads_reports_and_rejects_the_rest() -> None:
    assert Report.parse(json.dumps({"drain": D1, "sessions": 4})) == Report(drain=D1, sessions=4)
    assert Report.parse(None) is None
    assert Report.parse("") is None
    assert Report.parse("not json") is None
    assert Report.parse("[1, 2]") is None
    assert Report.parse(json.dumps({"drain": D1})) is None
    assert Report.parse(json.dumps({"drain": D1, "sessions": "0"})) is None
    assert Report.parse(json.dumps({"drain": D1, "sessions": True})) is None
    assert Report.parse(json.dumps({"drain": 5, "sessions": 0})) is None


def test_report_key_is_the_pod_name_or_a_short_unique_stand_in() -> None:
    assert report_key("tiny-omni-7c9d8f-x2k4q") == "live-sessions.omni.dev/tiny-omni-7c9d8f-x2k4q"
    long_a, long_b = "r" * 70 + "-a", "r" * 70 + "-b"
    key_a, key_b = report_key(long_a), report_key(long_b)
    assert key_a != key_b
    for key in (key_a, key_b):
        name = key.removeprefix(LIVE_SESSIONS_PREFIX)
        assert len(name) == 63 and name.startswith("r" * 52 + "-")
    assert report_key("Router_1.local") == "live-sessions.omni.dev/Router_1.local"
    odd = report_key("router:1")
    assert odd.startswith("live-sessions.omni.dev/router-1-") and len(odd) == len(LIVE_SESSIONS_PREFIX) + 19


def test_drain_rows_take_only_draining_workers_with_a_drain_value() -> None:
    services = [
        service("tiny-w2", state="draining", drain=D1, **{KEY: "old"}),
        service("tiny-w0", state="ready"),
        service("tiny-w1", state="draining"),  # the operator stamps drain-started next round
        service("tiny-w3", state="starting", drain=D1),  # a leftover value, not a drain
        {"metadata": {"name": "tiny", "labels": {"omni.dev/deployment": "tiny"}, "annotations": {}}},
        service("tiny-w4", state="draining", drain=D2),
    ]
    assert drain_rows(services, key=KEY) == [
        DrainRow(service="tiny-w2", worker="tiny-w2", drain=D1, observed="old"),
        DrainRow(service="tiny-w4", worker="tiny-w4", drain=D2, observed=None),
    ]


def test_first_sight_of_a_drain_reports_the_live_count() -> None:
    rows = [DrainRow("tiny-w0", "tiny-w0", D1), DrainRow("tiny-w1", "tiny-w1", D2)]
    patches = reports_to_publish(rows, sessions={"tiny-w0": 2, "tiny-w5": 9}, published={}, key=KEY)
    assert patches == [
        ReportPatch(service="tiny-w0", key=KEY, report=Report(drain=D1, sessions=2)),
        ReportPatch(service="tiny-w1", key=KEY, report=Report(drain=D2, sessions=0)),  # unknown: 0
    ]


def test_nothing_is_rewritten_until_the_count_or_the_drain_changes() -> None:
    rows = [DrainRow("tiny-w0", "tiny-w0", D1)]
    published = {"tiny-w0": Report(drain=D1, sessions=2)}
    assert reports_to_publish(rows, sessions={"tiny-w0": 2}, published=published, key=KEY) == []
    assert reports_to_publish(rows, sessions={"tiny-w0": 0}, published=published, key=KEY) == [
        ReportPatch(service="tiny-w0", key=KEY, report=Report(drain=D1, sessions=0))
    ]
    redrain = [DrainRow("tiny-w0", "tiny-w0", D2)]
    assert reports_to_publish(redrain, sessions={"tiny-w0": 2}, published=published, key=KEY) == [
        ReportPatch(service="tiny-w0", key=KEY, report=Report(drain=D2, sessions=2))
    ]


def test_a_report_already_on_the_service_is_not_written_again() -> None:
    """A restarted replica (nothing published yet) finds its own report and leaves it."""
    on_service = Report(drain=D1, sessions=0).value()
    rows = [DrainRow("tiny-w0", "tiny-w0", D1, observed=on_service)]
    assert reports_to_publish(rows, sessions={}, published={}, key=KEY) == []
    stale = [DrainRow("tiny-w0", "tiny-w0", D2, observed=on_service)]
    assert reports_to_publish(stale, sessions={}, published={}, key=KEY) == [
        ReportPatch(service="tiny-w0", key=KEY, report=Report(drain=D2, sessions=0))
    ]
    garbage = [DrainRow("tiny-w0", "tiny-w0", D1, observed="{")]
    assert reports_to_publish(garbage, sessions={"tiny-w0": 1}, published={}, key=KEY) == [
        ReportPatch(service="tiny-w0", key=KEY, report=Report(drain=D1, sessions=1))
    ]


def test_finished_drains_are_forgotten() -> None:
    published = {
        "tiny-w0": Report(drain=D1, sessions=0),
        "tiny-w1": Report(drain=D1, sessions=1),
        "tiny-w2": Report(drain=D1, sessions=0),
    }
    rows = [DrainRow("tiny-w1", "tiny-w1", D1), DrainRow("tiny-w2", "tiny-w2", D2)]
    assert still_draining(published, rows) == {"tiny-w1": Report(drain=D1, sessions=1)}
