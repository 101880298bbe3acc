"""torch's CPU thread pool per process: one thread when the stages run on a GPU, torch's own size on
the CPU, and an explicit --cpu-threads or OMP_NUM_THREADS always wins."""

from __future__ import annotations

import pytest
import torch

from omni_runtime.entrypoints.serve import parse_args
from omni_runtime.support.cpu_threads import GPU_THREADS, ThreadChoice, apply_cpu_threads, choose_threads


@pytest.mark.parametrize(
    ("device", "requested", "env", "gpu", "expected"),
    [
        ("cuda", None, {}, True, ThreadChoice(GPU_THREADS, "the stages run on a GPU")),
        ("auto", None, {}, True, ThreadChoice(GPU_THREADS, "the stages run on a GPU")),
        ("auto", None, {}, False, ThreadChoice(None, "the stages run on the CPU")),
        ("cpu", None, {}, True, ThreadChoice(None, "the stages run on the CPU")),
        ("cuda", 4, {}, True, ThreadChoice(4, "--cpu-threads")),
        ("cpu", 2, {"OMP_NUM_THREADS": "8"}, False, ThreadChoice(2, "--cpu-threads")),
        ("cuda", None, {"OMP_NUM_THREADS": "8"}, True, ThreadChoice(None, "OMP_NUM_THREADS is set")),
        ("cuda", None, {"OMP_NUM_THREADS": " "}, True, ThreadChoice(GPU_THREADS, "the stages run on a GPU")),
    ],
)
def test_choice(device, requested, env, gpu, expected):
    assert choose_threads(device=device, requested=requested, env=env, gpu_available=gpu) == expected


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_apply_sets_torch_and_the_environment_children_inherit(restore_threads):
    environ: dict[str, str] = {}
    choice = apply_cpu_threads(device="cuda", requested=None, environ=environ)
    assert choice.threads == 1
    assert torch.get_num_threads() == 1
    assert environ == {"OMP_NUM_THREADS": "1"}


def test_apply_leaves_a_cpu_process_alone(restore_threads):
    before = torch.get_num_threads()
    environ: dict[str, str] = {}
    choice = apply_cpu_threads(device="cpu", requested=None, environ=environ)
    assert choice.threads is None
    assert torch.get_num_threads() == before
    assert environ == {}


def test_serve_flag():
    assert parse_args(["--cpu-threads", "3"]).args.cpu_threads == 3
    assert parse_args([]).args.cpu_threads is None
    with pytest.raises(SystemExit) as exc:
        parse_args(["--cpu-threads", "0"])
    assert exc.value.code == 2
