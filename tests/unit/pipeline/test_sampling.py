"""The batch sampler: exact results for greedy, filters and penalties; reproducible seeded draws."""

from __future__ import annotations

import math

import torch

from omni_runtime.executor.sampling import BatchSampler, RowSampling, hash_uniform


def _sampler(rows: list[RowSampling], vocab: int, history: list[list[int]] | None = None) -> BatchSampler:
    sampler = BatchSampler(slots=max(4, len(rows)), vocab_size=vocab, device=torch.device("cpu"))
    for i, params in enumerate(rows):
        sampler.set_row(i, params, history=(history or [[]] * len(rows))[i])
    return sampler


def _murmur_uniform(seed: int, step: int, idx: int) -> float:
    """Pure-Python reference of hash_uniform's formula."""
    m = 0xFFFFFFFF
    x = ((seed * 0x9E3779B1) & m) + ((step * 0x85EBCA77) & m)
    x = (x + ((idx * 0xC2B2AE3D) & m)) & m
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & m
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & m
    x ^= x >> 16
    return ((x >> 8) + 0.5) / (1 << 24)


def test_hash_uniform_matches_the_reference_formula() -> None:
    seeds = torch.tensor([0, 1, 123456789, 0x7FFFFFFF])
    steps = torch.tensor([0, 5, 77, 1_000_000])
    values = hash_uniform(seeds, steps, 6)
    for r in range(4):
        for i in range(6):
            assert abs(values[r, i].item() - _murmur_uniform(int(seeds[r]), int(steps[r]), i)) < 2**-24
    assert values.min().item() > 0.0 and values.max().item() < 1.0


def test_greedy_rows_take_the_argmax() -> None:
    sampler = _sampler([RowSampling(temperature=0.0), RowSampling(temperature=0.0)], 3)
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 0.0]])
    assert sampler.sample(logits).tolist() == [1, 0]


def test_top_k_one_and_tiny_top_p_and_high_min_p_leave_only_the_argmax() -> None:
    rows = [
        RowSampling(temperature=1.0, top_k=1, seed=1),
        RowSampling(temperature=1.0, top_p=0.01, seed=2),
        RowSampling(temperature=1.0, min_p=0.9, seed=3),
    ]
    sampler = _sampler(rows, 4)
    logits = torch.tensor([[0.0, 1.0, 2.0, 1.5]] * 3)
    for _ in range(20):
        assert sampler.sample(logits).tolist() == [2, 2, 2]


def test_top_p_keeps_the_nucleus_only() -> None:
    # probs 0.5, 0.3, 0.2: top_p 0.6 keeps {0, 1} (mass before token 2 is 0.8 > 0.6).
    sampler = _sampler([RowSampling(temperature=1.0, top_p=0.6, seed=9)], 3)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    seen = {int(sampler.sample(logits)[0]) for _ in range(200)}
    assert seen == {0, 1}


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    rows = [
        RowSampling(temperature=0.0, repetition_penalty=2.0),
        RowSampling(temperature=0.0, repetition_penalty=2.0),
    ]
    sampler = _sampler(rows, 2, history=[[0], [0]])
    logits = torch.tensor([[2.0, 1.9], [-1.0, -1.5]])
    # row 0: 2.0/2 = 1.0 < 1.9; row 1: -1.0*2 = -2.0 < -1.5
    assert sampler.sample(logits).tolist() == [1, 1]


def test_suppressed_tokens_are_never_sampled() -> None:
    sampler = _sampler([RowSampling(temperature=0.0, suppress_tokens=(2,))], 3)
    assert sampler.sample(torch.tensor([[0.0, 1.0, 9.0]])).tolist() == [1]


def test_seeded_draws_do_not_depend_on_the_batch_around_them() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    alone = _sampler([RowSampling(temperature=1.0, seed=42)], 50)
    together = _sampler([RowSampling(temperature=0.7, seed=5), RowSampling(temperature=1.0, seed=42)], 50)
    a = [int(alone.sample(logits)[0]) for _ in range(30)]
    b = [int(together.sample(torch.cat([logits, logits]))[1]) for _ in range(30)]
    assert a == b
    other = _sampler([RowSampling(temperature=1.0, seed=43)], 50)
    assert a != [int(other.sample(logits)[0]) for _ in range(30)]


def test_sampling_frequencies_follow_the_distribution() -> None:
    probs = [0.6, 0.3, 0.1]
    sampler = _sampler([RowSampling(temperature=1.0, seed=7)], 3)
    logits = torch.log(torch.tensor([probs]))
    draws = [int(sampler.sample(logits)[0]) for _ in range(3000)]
    for token, p in enumerate(probs):
        freq = draws.count(token) / len(draws)
        assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / len(draws))


def test_a_held_row_draws_the_same_numbers_when_it_resumes() -> None:
    sampler = _sampler([RowSampling(temperature=1.0, seed=11)], 20)
    logits = torch.zeros(1, 20)
    first = int(sampler.sample(logits, ready=torch.tensor([False]))[0])
    assert int(sampler.sample(logits)[0]) == first  # the held step did not advance the counter


def test_move_carries_a_row_to_another_slot() -> None:
    sampler = _sampler([RowSampling(temperature=1.0, seed=3), RowSampling(temperature=1.0, seed=99)], 30)
    logits = torch.zeros(2, 30)
    reference = _sampler([RowSampling(temperature=1.0, seed=99)], 30)
    sampler.sample(logits)
    reference.sample(logits[:1])
    sampler.move(1, 0)
    assert int(sampler.sample(logits[:1])[0]) == int(reference.sample(logits[:1])[0])


def test_sampling_rows_by_slot_index() -> None:
    sampler = _sampler([RowSampling(temperature=0.0), RowSampling(temperature=0.0, suppress_tokens=(1,))], 3)
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    assert sampler.sample(logits, rows=[1]).tolist() == [2]
    assert sampler.sample(logits, rows=[0]).tolist() == [1]


def test_the_dense_path_draws_what_sample_draws_and_advances_ready_rows_only() -> None:
    """``sample_dense`` (the host-free path a CUDA graph holds) against ``sample``, row for row:
    greedy and filtered seeded rows, a suppressed id, a penalised history; held rows keep their
    step counters and draw the same numbers when they resume."""
    rows = [
        RowSampling(temperature=0.0, top_k=50, top_p=0.8),
        RowSampling(temperature=1.0, top_k=50, top_p=0.8, seed=3),
        RowSampling(temperature=0.7, top_k=5, seed=11, repetition_penalty=1.3, suppress_tokens=(2,)),
        RowSampling(temperature=1.3, min_p=0.05, seed=29),
    ]
    history = [[], [], [4, 7], []]
    reference, dense = _sampler(rows, 64, history), _sampler(rows, 64, history)
    generator = torch.Generator().manual_seed(0)
    for step in range(12):
        logits = torch.randn(4, 64, generator=generator) * 3
        ready = torch.tensor([True, step % 2 == 0, True, step % 3 != 0])
        expected = reference.sample(logits, ready=ready)
        assert dense.sample_dense(logits, ready=ready).tolist() == expected.tolist(), step
        assert dense.step.tolist() == reference.step.tolist()
    assert dense.step[:4].tolist() == [12, 6, 12, 8]
    assert torch.equal(dense._seen_table(), reference._seen_table())


def test_a_top_k_past_the_vocabulary_keeps_every_token_and_installs() -> None:
    """Past the table's int64 (a request the API refuses first) or just past the vocabulary: the
    same draws as no top-k, never an overflow that would fail the step of every row batched with it."""
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(1))
    for top_k in (50, 51, 10**20):
        plain = _sampler([RowSampling(temperature=1.0, seed=9)], 50)
        wide = _sampler([RowSampling(temperature=1.0, seed=9, top_k=top_k)], 50)
        assert int(wide.top_k[0]) == 0
        assert [int(wide.sample(logits)[0]) for _ in range(20)] == [
            int(plain.sample(logits)[0]) for _ in range(20)
        ]
