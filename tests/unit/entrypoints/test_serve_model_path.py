"""`omni serve --model-path DIR` with no checkpoint in DIR: one line and exit 2 before it binds its
port or loads anything (it used to start the server, fail in its startup and exit 1)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from omni_runtime.entrypoints.serve import main


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_a_directory_without_a_checkpoint_exits_2_before_binding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    target = tmp_path / "checkpoint"
    if kind == "empty":
        target.mkdir()
    with socket.socket() as holder:  # the port stays held: serve must not get as far as binding it
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert main(["--model-path", str(target), "--host", "127.0.0.1", "--port", str(port)]) == 2
    assert capsys.readouterr().err == (
        f"omni serve: error: model path {target} has no config.json; point --model-path at a checkpoint "
        "directory (or omit it to serve the tiny checkpoint)\n"
    )
