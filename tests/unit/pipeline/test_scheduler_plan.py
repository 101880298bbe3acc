"""Slot compaction and the stage graph: exact plans."""

from __future__ import annotations

import pytest

from omni_runtime.contract.engine import EngineError
from omni_runtime.contract.options import EngineOptions
from omni_runtime.pipeline.graph import local_stages, pipeline_variant
from omni_runtime.pipeline.scheduler import gather_wait, launches, plan_compaction, queue_ahead


def test_compaction_fills_holes_from_the_top() -> None:
    moves, table = plan_compaction(["a", "b", "c", "d", "e"], {"b", "d"})
    assert moves == [(4, 1)]
    assert table == ["a", "e", "c"]


def test_compaction_with_free_slots_and_nothing_to_move() -> None:
    assert plan_compaction(["a", "b", None], set()) == ([], ["a", "b"])
    assert plan_compaction(["a", "b"], {"b"}) == ([], ["a"])
    assert plan_compaction(["a", "b"], {"a", "b"}) == ([], [])


def test_compaction_of_the_first_slots() -> None:
    moves, table = plan_compaction([None, None, "c", "d"], set())
    assert moves == [(3, 0), (2, 1)]
    assert table == ["d", "c"]


def test_pipeline_variants_and_local_stages() -> None:
    assert pipeline_variant(EngineOptions(pipeline="speech", text_only=True)) == "text"
    split = EngineOptions(pipeline="speech", remote_stages={"thinker": "h:1", "talker": "h:2"})
    assert local_stages(split) == frozenset(
        {"preprocessing", "audio_encoder", "image_encoder", "mm_aggregate", "decode"}
    )


@pytest.mark.parametrize(
    ("options", "param"),
    [
        (EngineOptions(pipeline="chorus"), "pipeline"),
        (EngineOptions(pipeline="speech", remote_stages={"decode": "h:1"}), "remote_stages"),
        (EngineOptions(pipeline="text", remote_stages={"talker": "h:1"}), "remote_stages"),
    ],
)
def test_impossible_graphs_name_the_option(options: EngineOptions, param: str) -> None:
    with pytest.raises(EngineError) as err:
        local_stages(options)
    assert err.value.param == param


@pytest.mark.parametrize(
    ("running", "waiting", "incoming", "free", "waited_s", "gather_s", "hold"),
    [
        (0, 1, 15, 32, 0.000, 0.015, 0.015),  # a burst's first prompt: hold for the rest
        (0, 1, 15, 32, 0.010, 0.015, 0.005),  # counted from the oldest prompt's submit
        (0, 9, 7, 32, 0.020, 0.015, 0.0),  # the hold is over
        (0, 16, 0, 32, 0.001, 0.015, 0.0),  # nothing more coming: admit now
        (3, 1, 15, 29, 0.000, 0.015, 0.0),  # rows running: a decode step is due
        (0, 0, 4, 32, 0.000, 0.015, 0.0),  # nothing waiting
        (0, 4, 2, 4, 0.000, 0.015, 0.0),  # the waiting prompts fill the free slots
        (0, 1, 15, 32, 0.000, 0.0, 0.0),  # off (the default)
    ],
)
def test_gather_wait_table(running, waiting, incoming, free, waited_s, gather_s, hold) -> None:
    got = gather_wait(
        running=running, waiting=waiting, incoming=incoming, free=free, waited_s=waited_s, gather_s=gather_s
    )
    assert got == pytest.approx(hold)


STEADY = {"ended": False, "admissions_due": False, "held": False, "feeds_talker": False}


@pytest.mark.parametrize(
    ("lengths", "left", "max_len", "changes", "expected"),
    [
        # rows that each want two more tokens, with room for two more positions: queue ahead
        ([10, 20], [5, 2], 1024, {}, True),
        # a row whose next token is its last: the step after it is not needed by every row
        ([10, 20], [5, 1], 1024, {}, False),
        # the queued step writes position length + 1: the cache must hold length + 2
        ([10, 1022], [5, 5], 1024, {}, True),
        ([10, 1023], [5, 5], 1024, {}, False),
        # the batch is about to change: a row ended (EOS, stop string, cancel), an admission due, a hold
        ([10], [5], 1024, {"ended": True}, False),
        ([10], [5], 1024, {"admissions_due": True}, False),
        ([10], [5], 1024, {"held": True}, False),
        # a row whose reply vectors feed a talker (speech): its audio windows pause the thinker
        ([10, 20], [5, 5], 1024, {"feeds_talker": True}, False),
        # no rows
        ([], [], 1024, {}, False),
    ],
)  # fmt: skip
def test_a_step_is_queued_ahead_only_while_the_batch_stays_and_every_row_needs_it(
    lengths, left, max_len, changes, expected
) -> None:
    assert queue_ahead(lengths=lengths, left=left, max_len=max_len, **(STEADY | changes)) is expected


def test_only_a_runner_whose_class_launches_queues_ahead() -> None:
    """The thinker TP runner passes unknown attributes through to its rank-0 runner: its inner
    ``launch`` must not count (steps queued ahead across a TP group are not checked)."""

    class Launching:
        def launch(self, n: int, *, vector_slots: list[int], max_length: int) -> object: ...

    class PassingThrough:
        def __init__(self) -> None:
            self.runner = Launching()

        def __getattr__(self, name: str) -> object:
            return getattr(self.runner, name)

    assert launches(Launching())
    assert callable(PassingThrough().launch) and not launches(PassingThrough())
    assert not launches(object())
