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


def test_a_decode_stack_takes_the_steps_it_accepts(thinker) -> None:
    """A family's ``decode_stack`` (executor.moe_step's one-kernel step on a GPU) gets a step's
    input, rotary tables and cache with its write positions set, and its output goes to the final
    norm and the LM head; where it returns None the layers run one by one. Here the stack runs the
    same layers itself, for one-row steps only: every token and logit equals the plain runner's,
    and it took exactly the one-row steps."""
    plain, stacked = _runner(thinker), _runner(thinker)
    layers = stacked.decoder.step_layers
    took = []

    def stack(hidden, position_embeddings, cache):
        if hidden.shape[0] != 1:
            return None
        took.append(int(cache.write_pos[0]))
        mask = (torch.arange(cache.view_len)[None, :] <= cache.write_pos[:, None])[:, None, None, :]
        for i, layer in enumerate(layers):
            cache.layer_keys, cache.layer_values = cache.keys[i], cache.values[i]
            out = layer(
                hidden, attention_mask=mask, position_embeddings=position_embeddings, past_key_values=cache
            )
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    stacked.decoder.decode_stack = stack
    for rows in ([9], [7, 12]):
        assert _admit(plain, rows, temperature=0.0) == _admit(stacked, rows, temperature=0.0)
        want_tokens, want_logits = _decode(plain, rows, steps=4)
        got_tokens, got_logits = _decode(stacked, rows, steps=4)
        assert got_tokens == want_tokens
        for got, want in zip(got_logits, want_logits, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert took == [9, 10, 11, 12]  # the one-row steps, at the row's positions; not the two-row ones
