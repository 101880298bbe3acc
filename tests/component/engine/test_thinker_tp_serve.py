"""`omni serve --thinker-tp-size 2` on the CPU: the real command, the real HTTP API, the official client.

Greedy text must equal the single-process worker's; SIGTERM stops the worker and its follower;
a follower that dies takes the worker down with a clear line instead of hanging it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import openai
import pytest
from served_worker import alive, cache_env, free_port, serve, serve_command, wait_gone

pytestmark = pytest.mark.slow
FOLLOWER = re.compile(r"thinker TP rank 1/2: follower pid (\d+)")


def _greedy_text(url: str) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell me about tensor parallelism."}],
        max_tokens=12,
        temperature=0,
    )
    text = completion.choices[0].message.content
    assert text
    return text


def test_tp2_answers_like_tp1_and_stops_its_follower(tiny_checkpoint: Path, tmp_path: Path) -> None:
    with serve(tiny_checkpoint, tmp_path) as single:
        expected = _greedy_text(single.url)
    with serve(tiny_checkpoint, tmp_path, "--thinker-tp-size", "2") as split:
        match = FOLLOWER.search(split.output())
        assert match, split.output()
        follower = int(match.group(1))
        assert alive(follower)
        assert _greedy_text(split.url) == expected
        split.process.send_signal(signal.SIGTERM)
        assert split.process.wait(timeout=60) == 0, split.output()
    assert not alive(follower), "the TP follower outlived its worker"
    assert "thinker TP followers stopped" in split.output()


def test_a_dead_follower_stops_the_worker_loudly(tiny_checkpoint: Path, tmp_path: Path) -> None:
    with serve(tiny_checkpoint, tmp_path, "--thinker-tp-size", "2") as split:
        match = FOLLOWER.search(split.output())
        assert match, split.output()
        os.kill(int(match.group(1)), signal.SIGKILL)
        assert split.process.wait(timeout=30) == 1, split.output()
    assert re.search(r"thinker TP rank 1 \(pid \d+\) exited with code -9", split.output()), split.output()


def test_bad_tp_size_fails_the_worker_with_the_flag_named(tiny_checkpoint: Path) -> None:
    command = serve_command(free_port(), "--thinker-tp-size", "3")
    done = subprocess.run(
        command, env=cache_env(tiny_checkpoint), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1
    assert "--thinker-tp-size 3 does not divide the thinker's 8 attention heads / 4 KV heads" in done.stderr
    assert "use 1, 2 or 4" in done.stderr
    assert "follower pid" not in done.stderr  # refused before any follower started


def test_followers_die_with_their_worker(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """A worker killed outright (no shutdown code runs) leaves no follower holding its GPU."""
    with serve(tiny_checkpoint, tmp_path, "--thinker-tp-size", "2") as split:
        match = FOLLOWER.search(split.output())
        assert match, split.output()
        follower = int(match.group(1))
        split.process.kill()
        split.process.wait(timeout=30)
    assert wait_gone([follower], timeout=15) == [], "the TP follower outlived its killed worker"
