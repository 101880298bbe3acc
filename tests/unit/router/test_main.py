"""`omni router` flag errors: one line naming the flag, exit code 2, no traceback, no server."""

from __future__ import annotations

import json

import pytest

from omni_runtime.router.main import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [],
            "omni router: error: give --workers-file FILE, or --source kubernetes --namespace NS --deployment NAME",
        ),
        (
            ["--source", "kubernetes", "--namespace", "ml"],
            "omni router: error: --source kubernetes needs --namespace NS and --deployment NAME",
        ),
        (["--source", "file"], "omni router: error: --source file needs --workers-file FILE"),
        (
            ["--workers-file", "/nonexistent/w.json"],
            "omni router: error: /nonexistent/w.json: no such file (--workers-file)",
        ),
        (
            ["--workers-file", "W", "--max-sessions-per-worker", "-1"],
            "omni router: error: --max-sessions-per-worker must be 0 (no limit) or more",
        ),
    ],
)
def test_flag_errors(argv, message, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == message


@pytest.mark.parametrize("flag", ["--api-keys-file", "--admin-keys-file"])
def test_a_bad_keys_file_stops_before_serving(tmp_path, capsys, flag):
    workers = tmp_path / "w.json"
    workers.write_text(json.dumps({"workers": []}))
    keys = tmp_path / "keys"
    keys.write_text("\n")
    assert main(["--workers-file", str(workers), flag, str(keys)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"omni router: error: {flag} {keys}: no keys in the file; write one key per line"
    )


def test_kubernetes_source_without_a_cluster_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    assert main(["--source", "kubernetes", "--namespace", "ml", "--deployment", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "omni router: error: --source kubernetes: no in-cluster service account and no usable kubeconfig ("
    )


def test_processes_refuse_the_kubernetes_source(capsys):
    argv = ["--source", "kubernetes", "--namespace", "ml", "--deployment", "tiny", "--processes", "2"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "omni router: error: --processes works with --workers-file only; with --source kubernetes each "
        "router pod reports its live sessions on draining workers as one replica, so scale the router's "
        "pod replicas instead"
    )


def test_processes_on_a_port_in_use_is_a_clear_error(tmp_path, capsys):
    import socket

    workers = tmp_path / "w.json"
    workers.write_text(json.dumps({"workers": []}))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [
            "--workers-file",
            str(workers),
            "--processes",
            "2",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"omni router: error: --port {port}: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
