"""`omni up` reads its children's output by chunks: lines of any length, cut for display, and a
reader that fails stops its child (which then restarts) instead of leaving it blocked on a full pipe.

The reader tests run real child processes (`python -c ...`): the failure being guarded against is
a child blocked in write(2) on a pipe nobody drains.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from omni_operator.local.processes import ProcessSpec
from omni_operator.local.workers import LineSplitter, ManagedProcess

MB = 1024 * 1024


@pytest.mark.parametrize(
    ("chunks", "limit", "lines", "tail"),
    [
        ([b"a\nb\n"], 8, ["a", "b"], []),
        ([b"a", b"b\nc"], 8, ["ab"], ["c"]),
        ([b"abc\r\n"], 8, ["abc"], []),  # as before: trailing whitespace and \r go
        ([b"0123456789\n"], 4, ["0123 ...[6 more bytes]"], []),
        ([b"0123", b"4567", b"89\nx\n"], 4, ["0123 ...[6 more bytes]", "x"], []),
        ([b"0123456789"], 4, [], ["0123 ...[6 more bytes]"]),
        ([b"\n\n"], 4, ["", ""], []),
        ([b""], 4, [], []),
        ([b"\xc3\xa9t\xc3\xa9\n"], 64, ["été"], []),
        ([b"\xff\n"], 64, ["\ufffd"], []),
    ],
)
def test_line_splitter(chunks: list[bytes], limit: int, lines: list[str], tail: list[str]) -> None:
    splitter = LineSplitter(limit)
    got = [line for chunk in chunks for line in splitter.feed(chunk)]
    assert got == lines
    assert splitter.close() == tail


def _managed(code: str, emitted: list[tuple[str, str]], exits: list[int], **kwargs: object) -> ManagedProcess:
    def emit(prefix: str, color: str, line: str) -> None:
        emitted.append((prefix, line))

    return ManagedProcess(
        spec=ProcessSpec(name="child", worker=None, argv=(sys.executable, "-c", code)),
        color="",
        emit=emit,
        on_exit=lambda process, status: exits.append(status),
        **kwargs,  # type: ignore[arg-type]
    )


async def _until(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.timeout(120)
async def test_a_child_printing_a_1_mb_line_is_not_blocked() -> None:
    emitted: list[tuple[str, str]] = []
    exits: list[int] = []
    # One 1 MiB line, then a short one; the child exits only once both are written.
    process = _managed(
        "import sys; sys.stdout.write('x' * (1 << 20) + '\\n'); print('after', flush=True)", emitted, exits
    )
    await process.start()
    try:
        await _until(lambda: bool(exits), timeout=20, what="the child to exit")
    finally:
        await process.stop(grace=5)
    child = [line for prefix, line in emitted if prefix == "child"]
    assert child == ["x" * 8192 + f" ...[{MB - 8192} more bytes]", "after"]
    assert exits == [0]


@pytest.mark.timeout(120)
async def test_a_failing_reader_stops_the_child_loudly_and_it_restarts() -> None:
    emitted: list[tuple[str, str]] = []
    exits: list[int] = []

    def emit(prefix: str, color: str, line: str) -> None:
        if line == "boom":
            raise RuntimeError("the display broke")
        emitted.append((prefix, line))

    # Prints, then keeps writing: with nobody reading it would block on a full pipe for good.
    code = "import sys, time\nprint('boom', flush=True)\nwhile True:\n sys.stdout.write('y' * 4096 + '\\n')\n"
    process = ManagedProcess(
        spec=ProcessSpec(name="child", worker=None, argv=(sys.executable, "-c", code)),
        color="",
        emit=emit,
        on_exit=lambda process, status: exits.append(status),
        max_backoff=0.1,
    )
    await process.start()
    first = process.proc
    try:
        await _until(lambda: bool(exits), timeout=20, what="the child to be stopped")
        await _until(lambda: process.proc is not first, timeout=10, what="the child to restart")
    finally:
        await process.stop(grace=5)
    errors = [line for prefix, line in emitted if prefix == "omni up" and line.startswith("error: ")]
    assert errors[0] == (
        "error: reading the output of child failed (RuntimeError: the display broke); stopping it so it restarts"
    )
    assert exits[0] == -15  # SIGTERM
    assert process.restarts >= 1
