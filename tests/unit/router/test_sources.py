"""The worker file: exact parse errors naming the field, and changes picked up without a restart."""

from __future__ import annotations

import json
import os

import pytest

from omni_runtime.router.sources import FileSource, WorkerTableError, parse_workers_text
from omni_runtime.router.table import WorkerSpec, WorkerState

GOOD = {
    "workers": [
        {"id": "tiny-w0", "url": "http://127.0.0.1:8101", "revision": "abc123", "state": "ready"},
        {
            "id": "tiny-w1",
            "url": "http://127.0.0.1:8102/",
            "revision": "abc123",
            "state": "starting",
            "pid": 7,
        },
        {"id": "tiny-w2", "url": "https://w2.example:8000", "revision": "def456"},
    ]
}


def test_parses_the_local_mode_format():
    assert parse_workers_text(json.dumps(GOOD), origin="w.json") == [
        WorkerSpec(id="tiny-w0", url="http://127.0.0.1:8101", revision="abc123", state=WorkerState.ready),
        WorkerSpec(id="tiny-w1", url="http://127.0.0.1:8102", revision="abc123", state=WorkerState.starting),
        WorkerSpec(id="tiny-w2", url="https://w2.example:8000", revision="def456", state=WorkerState.ready),
    ]


def test_an_empty_worker_list_is_valid():
    assert parse_workers_text('{"workers": []}', origin="w.json") == []


W = {"id": "w0", "url": "http://127.0.0.1:8101", "revision": "r1", "state": "ready"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"workers": [', "w.json: not valid JSON at line 1 column 14: Expecting value"),
        ("[]", 'w.json: expected an object {"workers": [...]}'),
        ('{"worker": []}', 'w.json: expected an object {"workers": [...]}'),
        ('{"workers": {}}', "w.json: workers: expected a list of worker objects"),
        ('{"workers": ["w0"]}', "w.json: workers[0]: expected an object with id, url, revision, state"),
        (json.dumps({"workers": [{**W, "id": ""}]}), "w.json: workers[0].id: required, a non-empty string"),
        (
            json.dumps({"workers": [{k: v for k, v in W.items() if k != "url"}]}),
            "w.json: workers[0].url: required, a non-empty string",
        ),
        (
            json.dumps({"workers": [{k: v for k, v in W.items() if k != "revision"}]}),
            "w.json: workers[0].revision: required, a non-empty string",
        ),
        (
            json.dumps({"workers": [{**W, "id": "W_0"}]}),
            "w.json: workers[0].id: 'W_0' is not a DNS label (lower-case letters, digits and '-', at most 63 "
            "characters); session ids embed it",
        ),
        (
            json.dumps({"workers": [{**W, "url": "127.0.0.1:8101"}]}),
            "w.json: workers[0].url: '127.0.0.1:8101' is not an http:// or https:// URL with a host",
        ),
        (
            json.dumps({"workers": [{**W, "url": "http://h:1/v1"}]}),
            "w.json: workers[0].url: 'http://h:1/v1' must be a base URL without a path, e.g. http://host:8000",
        ),
        (
            json.dumps({"workers": [{**W, "state": "up"}]}),
            "w.json: workers[0].state: 'up' is not one of starting, ready, draining, gone",
        ),
        (json.dumps({"workers": [W, W]}), "w.json: workers[1].id: 'w0' appears twice; ids must be unique"),
    ],
)
def test_parse_errors_name_the_field(text, message):
    with pytest.raises(WorkerTableError) as caught:
        parse_workers_text(text, origin="w.json")
    assert str(caught.value) == message


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(WorkerTableError) as caught:
        FileSource(tmp_path / "nope.json").load()
    assert str(caught.value) == f"{tmp_path / 'nope.json'}: no such file (--workers-file)"


def write(path, document, *, mtime_ns: int) -> None:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    os.utime(path, ns=(mtime_ns, mtime_ns))  # explicit times: coarse clocks cannot hide a change


def test_file_changes_apply_and_bad_edits_keep_the_last_table(tmp_path):
    path = tmp_path / "workers.json"
    write(path, {"workers": [W]}, mtime_ns=1_000_000_000)
    source = FileSource(path)
    assert [spec.id for spec in source.load()] == ["w0"]
    assert source.changed() is None  # untouched

    write(path, {"workers": [W, {**W, "id": "w1", "url": "http://127.0.0.1:8102"}]}, mtime_ns=2_000_000_000)
    assert [spec.id for spec in source.changed()] == ["w0", "w1"]
    assert source.changed() is None

    write(path, '{"workers": [', mtime_ns=3_000_000_000)  # a half-written file
    assert source.changed() is None
    write(path, {"workers": [{**W, "state": "draining"}]}, mtime_ns=3_000_000_000)  # same mtime, new size
    assert source.changed() == [WorkerSpec(id="w0", url=W["url"], revision="r1", state=WorkerState.draining)]
