"""A live local rollout: re-running `omni up -f` with an edited file rolls two tiny workers to a new
revision while long streamed sessions and steady HTTP load run through the router. The workers
serve a checkpoint directory on this machine (a hostPath source, as a user's own checkpoint).

Expected: zero failed requests or sessions, every session on one revision from its first chunk
to its last, never more than workers + maxSurge workers and never fewer than workers -
maxUnavailable ready ones in the worker table, the steps in the strategy's order. Then a spec
whose workers never get ready stops at progressDeadlineSeconds, and re-applying the good spec
repairs it. The run's numbers are printed (run with -s to see them).
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from up_harness import OmniUp, text_spec, wait_until, write_tiny_checkpoint
from up_load import Load

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

READY_S = 300.0
ROLLOUT_S = 900.0


class TableWatch:
    """Samples the worker table while a rollout runs: most rows, fewest ready rows, every state seen."""

    def __init__(self, up: OmniUp) -> None:
        self.up = up
        self.most_rows = 0
        self.fewest_ready = 10**6
        self.fewest_in_rotation = 10**6
        self.states: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                table = self.up.table()
            except (OSError, ValueError):
                continue  # replaced between stat and read: take the next sample
            rows = " ".join(f"{w}:{row['state']}" for w, row in sorted(table.items()))
            if not self.states or self.states[-1] != rows:
                self.states.append(rows)
            self.most_rows = max(self.most_rows, len(table))
            self.fewest_ready = min(self.fewest_ready, sum(row["state"] == "ready" for row in table.values()))
            try:
                rotation = sum(w["in_rotation"] for w in self.up.router_workers().values())
                self.fewest_in_rotation = min(self.fewest_in_rotation, rotation)
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            self._stop.wait(0.05)

    def __enter__(self) -> TableWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def chat_status(up: OmniUp) -> int:
    response = httpx.post(
        f"{up.url}/v1/chat/completions",
        json={"model": "tiny-omni", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=60,
        trust_env=False,
    )
    return response.status_code


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny")


def test_live_rollout_keeps_every_session_on_its_revision(
    make_up: Callable[[], OmniUp], tmp_path: Path, checkpoint: Path
) -> None:
    up = make_up()
    spec_a = write(
        tmp_path / "a.yaml", text_spec(rollout="    drainTimeoutSeconds: 300", checkpoint=checkpoint)
    )
    up.start(spec_a)
    up.wait_line(r"^ready: ", timeout=READY_S)
    (rev_a,) = {row["revision"] for row in up.table().values()}
    # The workers loaded the hostPath directory itself (no container here to mount it at model.path).
    (card,) = httpx.get(f"{up.url}/v1/models", timeout=30, trust_env=False).json()["data"]
    assert card["root"] == str(checkpoint), card

    # Six long sessions over the two (then three) workers: the router keeps about two on each, so
    # a worker drained with none live is rare (with three 400-token sessions, about half a second
    # each, both drains once found none).
    load = Load(up.url, sessions=6, requesters=1, session_tokens=1200)
    load.start()
    wait_until(lambda: len(load.snapshot()) >= 5, timeout=120, what="load running", tail=up.tail)

    spec_b = write(
        tmp_path / "b.yaml",
        text_spec(
            extra_args='["--default-max-tokens", "24"]',
            rollout="    drainTimeoutSeconds: 300",
            checkpoint=checkpoint,
        ),
    )
    started = time.monotonic()
    with TableWatch(up) as watch:
        rerun = up.rerun(spec_b, timeout=ROLLOUT_S)
    rollout_s = time.monotonic() - started
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    time.sleep(3)  # a little load on the new revision only
    load.stop()
    ended = time.monotonic()

    # The rollout followed surge 1 / unavailable 0, step by step.
    steps = [line.removeprefix("omni up: ") for line in rerun.stdout.splitlines()]
    actions = [s for s in steps if re.match(r"^(start|drain|stop) ", s)]
    assert [a.split(" (")[0] for a in actions] == [
        "start up-test-w2",
        "drain up-test-w0",
        "stop up-test-w0",
        "start up-test-w3",
        "drain up-test-w1",
        "stop up-test-w1",
    ], rerun.stdout
    assert all(a.endswith("(idle)") for a in actions if a.startswith("stop ")), actions
    # The old workers were drained while they held live sessions, and stopped only once idle.
    live_at_drain = [
        int(re.search(r", (\d+) live sessions\)$", a).group(1)) for a in actions if a.startswith("drain ")
    ]
    assert sum(live_at_drain) >= 1, actions
    rev_b = re.search(rf"rolling workers from revision {rev_a} to (\w+): 2 workers, maxSurge 1", rerun.stdout)
    assert rev_b is not None, rerun.stdout
    assert steps[-1].startswith(
        f"rollout complete: revision {rev_a} -> {rev_b.group(1)}: 2 workers on revision"
    )
    assert watch.most_rows <= 3, watch.states
    assert watch.fewest_ready >= 2, watch.states
    table = up.table()
    assert sorted(table) == ["up-test-w2", "up-test-w3"]
    assert {(row["revision"], row["state"]) for row in table.values()} == {(rev_b.group(1), "ready")}

    # Zero failures; every session and request on one revision; both revisions served.
    outcomes = load.snapshot()
    failed = [o for o in outcomes if not o.ok]
    assert failed == [], failed[:5]
    assert all(len(o.revisions) == 1 for o in outcomes), [o for o in outcomes if len(o.revisions) != 1][:5]
    sessions = [o for o in outcomes if o.kind == "session"]
    requests = [o for o in outcomes if o.kind == "request"]
    seen = {o.revisions[0] for o in outcomes}
    assert seen == {rev_a, rev_b.group(1)}
    # Sessions live while the first old worker drained (some of them on it): all finished above.
    drain_at = up.line_time(r"^drain up-test-w0 ")
    assert drain_at is not None
    across = [o for o in sessions if o.started < drain_at < o.ended]

    summary = {
        "rollout_seconds": round(rollout_s, 1),
        "load_seconds": round(ended - min(o.started for o in outcomes), 1),
        "sessions": len(sessions),
        "sessions_old_revision": sum(o.revisions == (rev_a,) for o in sessions),
        "sessions_new_revision": sum(o.revisions == (rev_b.group(1),) for o in sessions),
        "sessions_live_across_first_drain": len(across),
        "their_revisions": sorted({o.revisions[0] for o in across}),
        "session_chunks": sum(o.chunks for o in sessions),
        "requests": len(requests),
        "failures": len(failed),
        "most_workers": watch.most_rows,
        "fewest_ready_in_table": watch.fewest_ready,
        "fewest_in_rotation_at_router": watch.fewest_in_rotation,
        "drain_lines": [a for a in actions if a.startswith("drain ")],
    }
    print("\nlocal rollout run:", json.dumps(summary))

    # A spec whose workers never get ready stops at the progress deadline; the old ones serve on.
    spec_c = write(
        tmp_path / "c.yaml",
        text_spec(
            extra_args='["--no-such-flag"]', rollout="    progressDeadlineSeconds: 10", checkpoint=checkpoint
        ),
    )
    stalled = up.rerun(spec_c, timeout=300)
    assert stalled.returncode == 1, stalled.stdout + stalled.stderr
    assert re.search(
        r"rollout deadline exceeded: up-test-w4 \(revision \w+\) was not ready within "
        r"progressDeadlineSeconds \(10s\): no more workers are replaced and 2 old workers keep serving",
        stalled.stdout,
    ), stalled.stdout
    assert {w: row["state"] for w, row in up.table().items()} == {
        "up-test-w2": "ready",
        "up-test-w3": "ready",
        "up-test-w4": "starting",
    }
    assert chat_status(up) == 200

    # Re-applying the good spec repairs it: the never-ready worker is drained and stopped.
    repaired = up.rerun(spec_b, timeout=300)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "stop up-test-w4 (idle)" in repaired.stdout
    assert sorted(up.table()) == ["up-test-w2", "up-test-w3"]

    assert up.stop(signal.SIGINT) == 0
