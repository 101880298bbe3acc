"""GPU placement check: the plan per process role from the serve flags, roles from command lines,
and every departure of an observed placement from the plan."""

from __future__ import annotations

import pytest

from omni_runtime.contract.options import EngineOptions
from omni_runtime.entrypoints.gpu_placement import expected_gpus, problems, role_of

REFERENCE = EngineOptions(
    pipeline="streaming-speech",
    thinker_tp_size=4,
    thinker_gpus=(0, 1, 2, 3),
    talker_gpu=4,
    image_encoder_tp_size=2,
    image_encoder_gpus=(5, 6),
)
REFERENCE_PLAN = {
    "worker": {0, 4},
    "thinker rank 1": {1},
    "thinker rank 2": {2},
    "thinker rank 3": {3},
    "image_encoder rank 0": {5},
    "image_encoder rank 1": {6},
}


@pytest.mark.parametrize(
    ("options", "plan"),
    [
        (REFERENCE, REFERENCE_PLAN),
        (EngineOptions(), {"worker": {0}}),
        (EngineOptions(pipeline="speech", talker_gpu=1), {"worker": {0, 1}}),
        # A text worker has no talker: --talker-gpu places nothing.
        (EngineOptions(pipeline="text", talker_gpu=1), {"worker": {0}}),
        (EngineOptions(thinker_tp_size=2), {"worker": {0}, "thinker rank 1": {1}}),
        (
            EngineOptions(thinker_tp_size=2, thinker_gpus=(2, 3), image_encoder_tp_size=2),
            {"worker": {2}, "thinker rank 1": {3}, "image_encoder rank 0": {0}, "image_encoder rank 1": {1}},
        ),
    ],
)
def test_plan_from_the_serve_flags(options: EngineOptions, plan: dict[str, set[int]]) -> None:
    assert expected_gpus(options) == plan


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (["/usr/bin/python3", "-m", "omni_operator.cli", "serve", "--port", "8000"], "worker"),
        (["/venv/bin/omni", "serve", "--thinker-tp-size", "4"], "worker"),
        (["python3", "-m", "omni_runtime.entrypoints.tp_follower", "--rank", "3", "--world", "4", "--role", "thinker"],
         "thinker rank 3"),
        (["python3", "-m", "omni_runtime.entrypoints.tp_follower", "--rank", "1", "--role", "image_encoder"],
         "image_encoder rank 1"),
        (["python3", "-m", "omni_runtime.entrypoints.stage", "--stages", "image_encoder", "--port", "9"], "image_encoder rank 0"),
        (["/venv/bin/omni", "stage", "--stages=talker"], "stage talker"),
        (["/venv/bin/omni", "bench", "--url", "x"], None),
        (["python3", "train.py"], None),
        ([], None),
    ],
)  # fmt: skip
def test_role_from_the_command_line(argv: list[str], role: str | None) -> None:
    assert role_of(argv) == role


@pytest.mark.parametrize(
    ("observed", "found"),
    [
        (REFERENCE_PLAN, []),
        # The image-encoder stage also opened a context on GPU 0, the thinker's.
        (
            {**REFERENCE_PLAN, "image_encoder rank 0": {0, 5}},
            [
                "image_encoder rank 0: on GPU 0,5, but the plan puts it on GPU 5 only",
                "GPU 0: shared by image_encoder rank 0, worker, which the plan keeps apart",
            ],
        ),
        # A follower never started.
        (
            {k: v for k, v in REFERENCE_PLAN.items() if k != "thinker rank 3"},
            ["thinker rank 3: expected on GPU 3, but no such process holds GPU memory"],
        ),
        # The talker stayed on the thinker's GPU.
        ({**REFERENCE_PLAN, "worker": {0}}, ["worker: holds no memory on GPU 4, where the plan puts it"]),
        # Someone else's process on a GPU of the plan.
        (
            {**REFERENCE_PLAN, "pid 77 (not an omni process)": {6}},
            [
                "pid 77 (not an omni process): on GPU 6, but the plan has no such process",
                "GPU 6: shared by image_encoder rank 1, pid 77 (not an omni process), which the plan keeps apart",
            ],
        ),
    ],
)
def test_every_departure_from_the_plan_is_named(observed: dict[str, set[int]], found: list[str]) -> None:
    assert problems(REFERENCE_PLAN, observed) == found


def test_without_nvidia_smi_the_command_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from omni_runtime.entrypoints import gpu_placement

    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    flags = ["--", "--thinker-tp-size", "4", "--talker-gpu", "4", "--image-encoder-tp-size", "2"]
    assert gpu_placement.main(flags) == 2
    assert "gpu_placement: cannot query nvidia-smi" in capsys.readouterr().err


def test_expectations_role_by_role() -> None:
    from omni_runtime.entrypoints.gpu_placement import parse_expectations

    items = ["stage audio_encoder,mm_aggregate,thinker=0", "thinker rank 1=1", "worker=0,4", "worker=5"]
    assert parse_expectations(items) == {
        "stage audio_encoder,mm_aggregate,thinker": {0},
        "thinker rank 1": {1},
        "worker": {0, 4, 5},
    }
    for bad in ("worker", "=3", "worker=", "worker=x"):
        with pytest.raises(ValueError, match="expected ROLE=GPUS"):
            parse_expectations([bad])
