"""The thinker's decode step: compiled layers compute what eager layers compute, and sampling never
leaves the tokenizer's vocabulary.

On CUDA the runtime sends decode steps through ``torch.compile`` (see executor/slot_cache.py); the
same compiled path runs here on the CPU (inductor's C++ backend) against the tiny checkpoint, so
a change that breaks the cache update under compilation, or makes every layer compile anew, fails
in CI and not first on a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_runtime.contract.adapter import RowSampling, ThinkerAdmission, ThinkerPrompt
from omni_runtime.executor.slot_cache import _compiled
from omni_runtime.models.qwen2_5_omni.runners import QwenThinkerRunner


@pytest.fixture(scope="module")
def thinker(tiny_checkpoint: Path):
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    return model.thinker.eval()


def _runner(thinker, *, decodable_vocab: int | None = None) -> QwenThinkerRunner:
    return QwenThinkerRunner(
        thinker.model.language_model,
        thinker.lm_head,
        thinker.config,
        slots=4,
        max_len=512,
        dtype=torch.float32,
        device=torch.device("cpu"),
        cuda_graphs=False,
        decodable_vocab=decodable_vocab,
    )


def _admit(runner: QwenThinkerRunner, lengths: list[int], *, temperature: float) -> list[int]:
    rows = []
    for slot, n in enumerate(lengths):
        ids = list(range(10 + slot, 10 + slot + n))
        prompt = ThinkerPrompt(
            input_ids=ids,
            embeds=runner.embed(torch.tensor(ids)),
            positions=torch.arange(n).view(1, -1).expand(3, -1),
            rope_delta=0,
        )
        sampling = RowSampling(temperature=temperature, seed=slot)
        rows.append(ThinkerAdmission(slot=slot, prompt=prompt, sampling=sampling, want_vectors=False))
    return [token for token, _ in runner.admit(rows)]


def _decode(runner: QwenThinkerRunner, lengths: list[int], steps: int) -> tuple[list, list]:
    tokens, logits = [], []
    for i in range(steps):
        step = runner.step(len(lengths), vector_slots=[], max_length=max(lengths) + 1 + i)
        tokens.append(step.tokens)
        logits.append(runner.decoder.out_logits[: len(lengths)].clone())
    return tokens, logits


def test_compiled_decode_step_equals_eager(thinker) -> None:
    import torch._dynamo

    eager = _runner(thinker)
    compiled = _runner(thinker)
    compiled.decoder.step_layers = _compiled(compiled.decoder.layers)
    lengths = [7, 12]
    assert _admit(eager, lengths, temperature=0.0) == _admit(compiled, lengths, temperature=0.0)

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    want_tokens, want_logits = _decode(eager, lengths, steps=6)
    got_tokens, got_logits = _decode(compiled, lengths, steps=6)
    assert got_tokens == want_tokens
    for got, want in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # One graph serves every layer (the cache names each layer's buffers, not its index).
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_sampling_stays_inside_the_tokenizer_vocabulary(thinker) -> None:
    runner = _runner(thinker, decodable_vocab=100)
    lengths = [5, 9, 3]
    first = _admit(runner, lengths, temperature=1.0)
    tokens, _ = _decode(runner, lengths, steps=20)
    drawn = first + [t for step in tokens for t in step]
    assert max(drawn) < 100
    assert len(set(drawn)) > 10  # still sampling, not stuck on one id


def test_steps_queued_ahead_give_the_steps_taken_one_at_a_time(thinker) -> None:
    """``launch`` queues a step and its tokens' copy; queuing the next before reading this one's
    tokens (what an overlapped loop does, bench.decode --overlap) changes no token or vector: a
    step reads only device state the step before wrote."""
    one, ahead = _runner(thinker), _runner(thinker)
    lengths = [7, 12]
    assert _admit(one, lengths, temperature=0.8) == _admit(ahead, lengths, temperature=0.8)
    want = [one.step(2, vector_slots=[1], max_length=13 + i) for i in range(5)]
    pending = ahead.launch(2, vector_slots=[1], max_length=13)
    got = []
    for i in range(1, 5):
        following = ahead.launch(2, vector_slots=[1], max_length=13 + i)
        got.append(pending.get())
        pending = following
    got.append(pending.get())
    assert [s.tokens for s in got] == [s.tokens for s in want]
    for g, w in zip(got, want, strict=True):
        assert list(g.vectors) == [1]
        torch.testing.assert_close(g.vectors[1], w.vectors[1], rtol=0, atol=0)
