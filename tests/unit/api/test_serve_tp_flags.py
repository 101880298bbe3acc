"""`omni serve` thinker TP flags: the implicit thinker GPUs (0..tp-1) never collide with the talker's."""

from __future__ import annotations

import pytest

from omni_runtime.entrypoints.serve import main, parse_args


def test_talker_on_an_implicit_thinker_rank_gpu_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--thinker-tp-size", "2", "--talker-gpu", "1"])
    assert caught.value.code == 2
    assert (
        "--talker-gpu 1 is thinker TP rank 1's GPU (without --thinker-gpus the 2 ranks use GPUs 0-1); "
        "pick another GPU or list --thinker-gpus"
    ) in capsys.readouterr().err


def test_talker_after_the_implicit_thinker_gpus_is_accepted() -> None:
    options = parse_args(["--thinker-tp-size", "2", "--talker-gpu", "2"]).options
    assert (options.thinker_tp_size, options.thinker_gpus, options.talker_gpu) == (2, (), 2)
    listed = parse_args(["--thinker-tp-size", "2", "--thinker-gpus", "2,3", "--talker-gpu", "0"]).options
    assert (listed.thinker_gpus, listed.talker_gpu) == ((2, 3), 0)
