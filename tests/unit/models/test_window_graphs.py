"""The vocoder graph helper's pure parts: batch buckets, and the eager path off the GPU."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from omni_runtime.models.window_graphs import EAGER_LOG_S, WindowGraphs, batch_bucket, vocoder_buckets


@pytest.mark.parametrize(
    ("windows", "bucket"),
    [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8), (9, 16), (16, 16), (17, 17)],
)
def test_batch_bucket(windows: int, bucket: int) -> None:
    assert batch_bucket(windows) == bucket


@pytest.mark.parametrize(
    ("windows", "bucket"),
    [(1, 1), (3, 4), (5, 6), (6, 6), (7, 8), (9, 10), (11, 12), (13, 14), (15, 16), (16, 16)],
)
def test_finer_buckets(windows: int, bucket: int) -> None:
    fine = vocoder_buckets("1,2,4,6,8,10,12,14,16")
    assert batch_bucket(windows, fine) == bucket
    assert (
        WindowGraphs(
            lambda **kw: kw, device=torch.device("cpu"), enabled=False, limit=1, buckets=fine
        ).bucket(windows)
        == bucket
    )


@pytest.mark.parametrize(
    ("setting", "buckets"),
    [
        (None, (1, 2, 4, 8, 16)),
        ("", (1, 2, 4, 8, 16)),
        ("1,2,4,6,8,12,16", (1, 2, 4, 6, 8, 12, 16)),
        ("1,16", (1, 16)),
    ],
)
def test_vocoder_buckets_setting(setting: str | None, buckets: tuple[int, ...]) -> None:
    assert vocoder_buckets(setting) == buckets


@pytest.mark.parametrize(
    "setting", ["2,4,16", "1,4,2,16", "1,2,2,16", "1,2,8", "1,2,32", "1,two,16", "1,,16"]
)
def test_vocoder_buckets_setting_names_its_format_when_wrong(setting: str) -> None:
    with pytest.raises(
        ValueError,
        match=r"^OMNI_VOCODER_BUCKETS is '.*', not batch sizes in increasing order from 1 to 16; use e.g.",
    ):
        vocoder_buckets(setting)


def test_off_the_gpu_every_call_runs_eagerly_and_is_counted() -> None:
    calls: list[str] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append("fn")
        return x * 2

    def eager(x: torch.Tensor) -> torch.Tensor:
        calls.append("eager")
        return x * 2

    graphs = WindowGraphs(fn, device=torch.device("cpu"), enabled=True, limit=4)
    assert not graphs.enabled  # graphs are a CUDA feature
    x = torch.arange(3.0)
    assert torch.equal(graphs.run({"x": x}), x * 2)
    assert torch.equal(graphs.run({"x": x}, eager=eager), x * 2)
    assert torch.equal(graphs.run({"x": x}, use_graph=False), x * 2)
    assert calls == ["fn", "eager", "fn"]
    assert graphs.eager_calls == 3 and len(graphs) == 0


def test_a_slow_eager_call_is_logged_only_where_graphs_are_the_norm(caplog: pytest.LogCaptureFixture) -> None:
    """On the CPU every window runs eagerly and takes its time: nothing to report there."""

    def slow(x: torch.Tensor) -> torch.Tensor:
        time.sleep(2 * EAGER_LOG_S)
        return x

    graphs = WindowGraphs(slow, device=torch.device("cpu"), enabled=True, limit=4)
    with caplog.at_level(logging.INFO, logger="omni_runtime.models.window_graphs"):
        graphs.run({"x": torch.zeros(2)})
    assert graphs.eager_calls == 1 and caplog.records == []
