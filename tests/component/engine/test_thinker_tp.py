"""Thinker tensor parallelism on the CPU (gloo): two real processes compute what one computes.

The tiny checkpoint (8 heads, 4 KV heads) splits over 2 ranks. Rank 0 is this test process;
the follower is the real ``omni_runtime.entrypoints.tp_follower`` process it spawns. Prefill and decode
logits (float32) must match the single-process thinker to float rounding, greedy tokens exactly,
through compaction moves too; closing the runner must leave no follower behind.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from served_worker import alive

from omni_runtime.contract.adapter import RowSampling, ThinkerAdmission, ThinkerPrompt
from omni_runtime.contract.engine import EngineError
from omni_runtime.contract.options import EngineOptions

HOSTED = frozenset({"thinker", "mm_aggregate"})
PROMPTS = [list(range(100, 107)), list(range(300, 312)), list(range(500, 509))]


def _runner(checkpoint: Path, tp: int) -> tuple[Any, Any]:
    from omni_runtime.models.qwen2_5_omni.adapter import Qwen25OmniAdapter
    from omni_runtime.models.qwen2_5_omni.loader import load_model

    options = EngineOptions(
        model_path=str(checkpoint), device="cpu", thinker_tp_size=tp, max_batch_size=4, max_model_len=256
    )
    loaded = load_model(options, path=checkpoint, hosted=HOSTED)
    adapter = Qwen25OmniAdapter(loaded, options=options, hosted=HOSTED)
    return adapter, adapter.thinker_runner(slots=4, max_len=256)


@pytest.fixture(scope="module")
def runners(tiny_checkpoint: Path) -> Iterator[dict[int, tuple[Any, Any]]]:
    built = {1: _runner(tiny_checkpoint, 1), 2: _runner(tiny_checkpoint, 2)}
    yield built
    built[2][1].close()


def _rows(adapter: Any) -> list[ThinkerAdmission]:
    rows = []
    for slot, ids in enumerate(PROMPTS):
        with torch.inference_mode():
            embeds = adapter.loaded.embed(torch.tensor(ids))
        positions = torch.arange(len(ids)).view(1, -1).expand(3, -1)
        prompt = ThinkerPrompt(input_ids=ids, embeds=embeds, positions=positions, rope_delta=slot)
        rows.append(ThinkerAdmission(slot, prompt, RowSampling(temperature=0.0), want_vectors=False))
    return rows


def _trace(adapter: Any, runner: Any) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Prefill three rows, decode, drop row 0 (row 2 moves into slot 0), decode on: logits and tokens."""
    decoder = runner.decoder
    logits: list[torch.Tensor] = []
    tokens: list[list[int]] = []
    rows = _rows(adapter)
    lengths = [len(ids) for ids in PROMPTS]
    with torch.inference_mode():
        longest = max(lengths)
        embeds = torch.zeros(len(rows), longest, 128)
        positions = torch.zeros(3, len(rows), longest, dtype=torch.int64)
        for i, row in enumerate(rows):
            embeds[i, : lengths[i]] = row.prompt.embeds
            positions[:, i, : lengths[i]] = row.prompt.positions
        first, _ = decoder.prefill(
            slots=[0, 1, 2], embeds=embeds, positions=positions, lengths=lengths, want_hidden=False
        )
        logits.append(first.clone())
        decoder.last_ids[:3] = first.argmax(-1)
        decoder.lengths[:3] = torch.tensor(lengths)
        decoder.rope_delta[:3] = torch.tensor([0, 1, 2])
        n = 3
        for step in range(6):
            if step == 3:  # row 0 leaves: compaction moves row 2 into slot 0
                decoder.move(2, 0, int(decoder.lengths[2]))
                n = 2
            out = decoder.decode(n, max_length=int(decoder.lengths[:n].max()) + 1)
            logits.append(out.logits.clone())
            chosen = out.logits.argmax(-1)
            tokens.append(chosen.tolist())
            decoder.last_ids[:n] = chosen
            decoder.lengths[:n] += 1
    return logits, tokens


def test_tp2_logits_match_tp1(runners: dict[int, tuple[Any, Any]]) -> None:
    single, _ = _trace(*runners[1])
    split, tokens = _trace(*runners[2])
    _, tokens_single = _trace(*runners[1])
    assert len(single) == len(split) == 7
    for one, two in zip(single, split, strict=True):
        assert one.shape == two.shape
        torch.testing.assert_close(two, one, rtol=1e-4, atol=1e-4)
    assert tokens == tokens_single


def test_tp2_runner_greedy_tokens_equal_tp1(runners: dict[int, tuple[Any, Any]]) -> None:
    results = {}
    for tp, (adapter, runner) in runners.items():
        firsts = runner.admit(_rows(adapter))
        steps = [[token for token, _ in firsts]]
        lengths = [len(ids) for ids in PROMPTS]
        for i in range(5):
            steps.append(runner.step(3, vector_slots=[], max_length=max(lengths) + 1 + i).tokens)
        results[tp] = steps
    assert results[2] == results[1]


def _prompt(adapter: Any, ids: list[int]) -> ThinkerPrompt:
    with torch.inference_mode():
        embeds = adapter.loaded.embed(torch.tensor(ids))
    return ThinkerPrompt(
        input_ids=ids, embeds=embeds, positions=torch.arange(len(ids)).expand(3, -1), rope_delta=0
    )


def test_tp2_keeps_and_reuses_a_conversation_prefix_like_tp1(runners: dict[int, tuple[Any, Any]]) -> None:
    """Conversation KV under TP: every rank keeps its shard of a finished row, restores it into
    another slot and prefills only the suffix; the tokens equal a fresh prefill's and TP=1's, and
    freeing rank 0's copy frees the followers' (the next op carries the forget)."""
    import gc

    greedy = RowSampling(temperature=0.0)
    results = {}
    for tp, (adapter, runner) in runners.items():
        ids = list(range(700, 720))
        prompt = _prompt(adapter, ids)
        [(first, _)] = runner.admit([ThinkerAdmission(0, prompt, greedy, want_vectors=False)])
        fed = [first]
        for i in range(3):
            fed.append(runner.step(1, vector_slots=[], max_length=len(ids) + 2 + i).tokens[0])
        kept = runner.keep(slot=0, length=len(ids) + 3, prompt=prompt, vectors=None)  # ids + fed[:3]
        longer = _prompt(adapter, [*ids, *fed[:3], 900, 901, 902])
        reuse = ThinkerAdmission(1, longer, greedy, False, prefix=kept, prefix_length=len(ids) + 3)
        fresh = ThinkerAdmission(2, longer, greedy, False)
        tokens = [[token for token, _ in runner.admit([reuse, fresh])]]
        del kept
        reuse.prefix = None
        gc.collect()  # rank 0's copy is gone: the followers drop theirs at the next op
        for i in range(4):
            tokens.append(
                runner.step(3, vector_slots=[], max_length=len(longer.input_ids) + 1 + i).tokens[1:3]
            )
        if tp == 2:  # the forget went out with the first step after the copy was freed
            assert (runner.decoder._kept, runner.decoder._forgotten) == ({}, [])
        results[tp] = (reuse.reused, tokens)
    assert results[2] == results[1]
    reused, tokens = results[2]
    assert reused == 23 and all(mine == theirs for mine, theirs in tokens)


def test_bad_tp_size_names_the_flag_and_the_choices(tiny_checkpoint: Path) -> None:
    from omni_runtime.executor.tensor_parallel import check_tp_size, valid_tp_sizes
    from omni_runtime.models.qwen2_5_omni.loader import load_model, load_processor, released_7b_config

    text_7b = released_7b_config(load_processor(None)).thinker_config.text_config
    assert valid_tp_sizes(text_7b) == [1, 2, 4]
    with pytest.raises(EngineError) as err:
        check_tp_size(text_7b, 3)
    assert str(err.value) == (
        "--thinker-tp-size 3 does not divide the thinker's 28 attention heads / 4 KV heads "
        "(MLP width 18944); use 1, 2 or 4"
    )
    assert err.value.param == "thinker_tp_size"
    options = EngineOptions(model_path=str(tiny_checkpoint), device="cpu", thinker_tp_size=8)
    with pytest.raises(
        EngineError, match=r"--thinker-tp-size 8 does not divide the thinker's 8 attention heads / 4 KV"
    ):
        load_model(options, path=tiny_checkpoint, hosted=HOSTED)  # refused before any follower starts


def test_shards_hold_their_slice(runners: dict[int, tuple[Any, Any]]) -> None:
    from omni_runtime.executor.tensor_parallel import RowParallelLinear

    full = runners[1][0].loaded.text.layers[0]
    shard = runners[2][0].loaded.text.layers[0]
    assert shard.self_attn.q_proj.weight.shape == (64, 128)  # 4 of 8 heads x 16
    assert shard.self_attn.k_proj.weight.shape == (32, 128)  # 2 of 4 KV heads
    torch.testing.assert_close(shard.self_attn.q_proj.bias, full.self_attn.q_proj.bias[:64])
    assert isinstance(shard.self_attn.o_proj, RowParallelLinear)
    torch.testing.assert_close(shard.self_attn.o_proj.weight, full.self_attn.o_proj.weight[:, :64])
    torch.testing.assert_close(shard.mlp.down_proj.weight, full.mlp.down_proj.weight[:, :128])
    assert shard.self_attn.num_key_value_groups == full.self_attn.num_key_value_groups == 2
    # Replicated: embeddings and the final norm.
    torch.testing.assert_close(runners[2][0].loaded.embed.weight, runners[1][0].loaded.embed.weight)


def test_close_stops_the_follower(runners: dict[int, tuple[Any, Any]]) -> None:
    """Runs last in this module: it closes the shared TP=2 runner."""
    adapter, runner = runners[2]
    pids = adapter.loaded.tp.pids
    assert len(pids) == 1 and alive(pids[0]) and pids[0] != os.getpid()
    runner.close()
    assert not alive(pids[0])
    runner.close()  # idempotent
