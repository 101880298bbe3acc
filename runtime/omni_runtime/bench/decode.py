"""Thinker decode speed: the runtime's slot cache + CUDA graphs next to plain transformers ``generate``.

Run on a GPU (the lead runs it on an H100)::

    python -m omni_runtime.bench.decode                     # dummy Qwen2.5-Omni-7B, bf16
    python -m omni_runtime.bench.decode --batches 1,4,16 --steps 128 --prompt 128 --json out.json
    python -m omni_runtime.bench.decode --tp 2 --skip-generate   # thinker TP over GPUs 0,1
    python -m omni_runtime.bench.decode --family qwen3_omni_moe --batches 1,8,32   # 30B-A3B MoE

``--family qwen3_omni_moe`` times the released Qwen3-Omni-30B-A3B thinker (bench/decode_moe.py:
its bound counts the experts a batch routes to, so it grows with the batch).

``--tp N`` builds the thinker the way ``omni serve --load-format dummy --thinker-tp-size N`` does
(loader, sharding, follower processes on GPUs 1..N-1, the agreed KV slots): this process is
rank 0 and times the same runner the scheduler drives. ``--tp 1`` is that path without TP, the
fair baseline for a TP=2 row; the weight bytes and bound are then per rank.

Both sides use the same module objects (one random-weight 7B thinker on the GPU), the same
prompt length and the same number of new tokens, greedy. Reported per batch size: milliseconds
per decode step and tokens per second, and the memory-bandwidth bound of one step (bytes of the
weights a step reads / the GPU's HBM bandwidth), so "within 2x of the bound" can be checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

# Peak HBM bandwidth by GPU name (bytes/s); the SXM parts. Override with --hbm-tbps.
HBM_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L40S": 0.864e12}


def _bandwidth(name: str, override: float | None) -> float:
    if override:
        return override * 1e12
    for key, value in HBM_BANDWIDTH.items():
        if key in name:
            return value
    return 3.35e12


def measured_bandwidth(gib: float = 4.0, reps: int = 10) -> float:
    """The HBM bandwidth this GPU reaches, bytes/s: the better of a device-to-device copy (bytes
    read and written) and a sum (bytes read) over ``gib`` GiB, each the best of ``reps`` runs after a
    warm-up, far larger than the L2, so a bound can be measured against it in the same run."""
    import torch

    def best(n: int) -> float:
        src = torch.ones(n, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        fastest = 0.0
        for moved, run in ((8 * n, lambda: dst.copy_(src)), (4 * n, src.sum)):
            run()
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                end.synchronize()
                fastest = max(fastest, moved / (start.elapsed_time(end) / 1000))
        return fastest

    rate = best(int(gib * 2**30) // 4)
    torch.cuda.empty_cache()
    return rate


def _build(dtype_name: str, max_len: int, slots: int):
    import torch
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    from omni_runtime.models.qwen2_5_omni.loader import load_processor, released_7b_config
    from omni_runtime.models.qwen2_5_omni.runners import QwenThinkerRunner

    dtype = getattr(torch, dtype_name)
    device = torch.device("cuda", 0)
    # The released 7B thinker shape, with media token ids set (generate's rope index reads them).
    config = released_7b_config(load_processor(None)).thinker_config
    with torch.device(device):
        thinker = Qwen2_5OmniThinkerForConditionalGeneration._from_config(
            config, dtype=dtype, attn_implementation="sdpa"
        ).eval()
    runner = QwenThinkerRunner(
        thinker.model.language_model,
        thinker.lm_head,
        config,
        slots=slots,
        max_len=max_len,
        dtype=dtype,
        device=device,
        cuda_graphs=True,
    )
    return thinker, runner


def _build_serving(dtype_name: str, max_len: int, slots: int, tp: int) -> tuple[Any, Any, int]:
    """(adapter, runner, weight bytes one rank reads per step) through the serving loader."""
    from omni_runtime.contract.options import EngineOptions
    from omni_runtime.models.qwen2_5_omni.adapter import Qwen25OmniAdapter
    from omni_runtime.models.qwen2_5_omni.loader import load_model

    hosted = frozenset({"thinker", "mm_aggregate"})
    options = EngineOptions(
        load_format="dummy",
        device="cuda",
        dtype=dtype_name,
        thinker_tp_size=tp,
        max_batch_size=slots,
        max_model_len=max_len,
    )
    loaded = load_model(options, path=None, hosted=hosted)
    adapter = Qwen25OmniAdapter(loaded, options=options, hosted=hosted)
    runner = adapter.thinker_runner(slots=slots, max_len=max_len)
    params = [*loaded.text.layers.parameters(), *loaded.text.norm.parameters(), *loaded.lm_head.parameters()]
    return adapter, runner, sum(p.numel() * p.element_size() for p in params)


def _weight_bytes(thinker: Any) -> int:
    """What one decode step must read: every decoder layer, the final norm and the LM head."""
    lm = thinker.model.language_model
    params = [*lm.layers.parameters(), *lm.norm.parameters(), *thinker.lm_head.parameters()]
    return sum(p.numel() * p.element_size() for p in params)


def bench_runtime(
    runner: Any, *, batch: int, prompt: int, steps: int, vocab: int, overlap: bool = False
) -> float:
    """Milliseconds per decode step of the runtime's batched, graph-captured step. ``overlap``:
    each step is queued (``runner.launch``) before the previous one's tokens are read, so the host's
    work between steps runs while the GPU decodes."""
    import torch

    from omni_runtime.contract.adapter import RowSampling, ThinkerAdmission, ThinkerPrompt

    hidden = runner.decoder.out_hidden.shape[-1]
    gen = torch.Generator(device="cpu").manual_seed(batch)
    rows = []
    for slot in range(batch):
        ids = torch.randint(0, vocab, (prompt,), generator=gen).tolist()
        embeds = runner.embed(torch.tensor(ids, device=runner.device))
        positions = torch.arange(prompt).view(1, -1).expand(3, -1)
        tp = ThinkerPrompt(
            input_ids=ids, embeds=embeds.reshape(prompt, hidden), positions=positions, rope_delta=0
        )
        rows.append(
            ThinkerAdmission(slot=slot, prompt=tp, sampling=RowSampling(temperature=0.0), want_vectors=False)
        )
    runner.admit(rows)
    for i in range(3):  # warm the first bucket (and compile the layers for this batch size)
        runner.step(batch, vector_slots=[], max_length=prompt + 1 + i)
    # Capture every length bucket the timed steps reach, as the server's warm-up does: a bucket
    # captured inside the timed loop would bill its capture (and compilation) to the steps.
    runner.decoder.decode(batch, max_length=prompt + 4 + steps)
    torch.cuda.synchronize()
    start = time.perf_counter()
    if overlap:
        pending = runner.launch(batch, vector_slots=[], max_length=prompt + 4)
        for i in range(1, steps):
            following = runner.launch(batch, vector_slots=[], max_length=prompt + 4 + i)
            pending.get()
            pending = following
        pending.get()
    else:
        for i in range(steps):
            runner.step(batch, vector_slots=[], max_length=prompt + 4 + i)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000 / steps


def bench_generate(thinker: Any, *, batch: int, prompt: int, steps: int, vocab: int) -> float:
    """Milliseconds per new token of ``thinker.generate`` (prefill time subtracted)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, prompt), generator=gen).cuda()
    mask = torch.ones_like(ids)

    def run(new: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            thinker.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False
            )
        torch.cuda.synchronize()
        return time.perf_counter() - start

    run(2)  # warm up
    one = run(1)
    full = run(steps + 1)
    return (full - one) * 1000 / steps


def main(argv: list[str] | None = None) -> int:
    from omni_runtime.pipeline.scheduler import launches  # the runners the serving loop queues ahead

    parser = argparse.ArgumentParser(
        prog="python -m omni_runtime.bench.decode", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--batches", default="1,4,16", help="comma list of batch sizes (default 1,4,16)")
    parser.add_argument("--steps", type=int, default=128, help="decode steps timed per batch size")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--skip-generate", action="store_true", help="only time the runtime")
    parser.add_argument(
        "--tp",
        type=int,
        default=0,
        help="build the thinker as omni serve does with --thinker-tp-size TP (GPUs 0..TP-1); implies --skip-generate",
    )
    parser.add_argument(
        "--hbm-tbps", type=float, default=None, help="HBM bandwidth in TB/s (default: by GPU name)"
    )
    parser.add_argument(
        "--family",
        default="qwen2_5_omni",
        choices=["qwen2_5_omni", "qwen3_omni_moe"],
        help="model family at its released shape (default qwen2_5_omni: 7B; qwen3_omni_moe: 30B-A3B)",
    )
    parser.add_argument(
        "--experts",
        default="omni_fused+qkv,omni_fused,grouped_mm",
        help="qwen3_omni_moe: the runtime's experts kernels to time, one runner each, +qkv for the "
        "fused q/k/v projection; the first is the runtime row (default omni_fused+qkv, as served, "
        "then omni_fused and grouped_mm)",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="also time the runtime with each step queued before the previous one's tokens are read",
    )
    parser.add_argument(
        "--json", default=None, help="also write the results to this file, and a plot beside it (.png)"
    )
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    name = torch.cuda.get_device_name(0)
    max_len = 1 << max(10, (args.prompt + args.steps + 16).bit_length())
    thinker: Any = None
    runner: Any
    experts: tuple[str, str] | None = None  # (HF's kernel, the runtime's) for an MoE thinker
    others: dict[str, Any] = {}  # MoE: runners of the other experts kernels timed beside it
    if args.family == "qwen3_omni_moe":
        if args.tp:
            print("bench_decode: --tp is not supported for qwen3_omni_moe yet", file=sys.stderr)
            return 2
        from omni_runtime.bench import decode_moe

        print(
            f"building a random-weight Qwen3-Omni-30B-A3B thinker ({args.dtype}) on {name} ...",
            file=sys.stderr,
        )
        thinker, make_runner, vocab, bytes_for, hf_kernel = decode_moe.build(
            args.dtype, max_len=max_len, slots=max(batches)
        )
        kernels = [k.strip() for k in args.experts.split(",") if k.strip()]
        experts = (hf_kernel, kernels[0])
        runner = make_runner(kernels[0])
        others = {kernel: make_runner(kernel) for kernel in kernels[1:]}
    elif args.tp:
        if args.tp > torch.cuda.device_count():
            print(f"bench_decode: --tp {args.tp} needs {args.tp} GPUs", file=sys.stderr)
            return 2
        print(
            f"building the serving 7B thinker with TP={args.tp} ({args.dtype}) on {name} ...", file=sys.stderr
        )
        _, runner, weight_bytes = _build_serving(args.dtype, max_len=max_len, slots=max(batches), tp=args.tp)
        vocab = int(runner.sampler.vocab_size)  # ids the tokenizer decodes
        args.skip_generate = True
    else:
        print(
            f"building a random-weight Qwen2.5-Omni-7B thinker ({args.dtype}) on {name} ...", file=sys.stderr
        )
        thinker, runner = _build(args.dtype, max_len=max_len, slots=max(batches))
        vocab = thinker.config.text_config.vocab_size
        weight_bytes = _weight_bytes(thinker)
    if experts is None:
        dense_bytes = weight_bytes

        def bytes_for(batch: int) -> float:
            return dense_bytes

    bandwidth = _bandwidth(name, args.hbm_tbps)
    measured = measured_bandwidth()
    results: dict[str, Any] = {
        "gpu": name,
        "thinker_tp_size": args.tp or 1,
        "dtype": args.dtype,
        "prompt_tokens": args.prompt,
        "decode_steps": args.steps,
        "family": args.family,
        "experts_kernels": {"generate": experts[0], "runtime": experts[1]} if experts else None,
        "hbm_bytes_per_s": bandwidth,
        "measured_hbm_bytes_per_s": measured,
        "rows": [],
    }
    for batch in batches:
        if experts is not None:
            from omni_runtime.bench.decode_moe import set_experts

            set_experts(thinker, experts[1])
        runtime_ms = bench_runtime(runner, batch=batch, prompt=args.prompt, steps=args.steps, vocab=vocab)
        overlap_ms = None
        if args.overlap and not launches(runner):
            print(
                "bench_decode: --overlap: this runner (thinker TP) has no launch; not timed", file=sys.stderr
            )
        elif args.overlap:
            overlap_ms = bench_runtime(
                runner, batch=batch, prompt=args.prompt, steps=args.steps, vocab=vocab, overlap=True
            )
        by_kernel = {experts[1]: runtime_ms} if experts is not None else {}
        for kernel, other in others.items():
            from omni_runtime.bench.decode_moe import set_experts

            set_experts(thinker, kernel)
            by_kernel[kernel] = bench_runtime(
                other, batch=batch, prompt=args.prompt, steps=args.steps, vocab=vocab
            )
        generate_ms = None
        if not args.skip_generate:
            if experts is not None:
                set_experts(thinker, experts[0])
            generate_ms = bench_generate(
                thinker, batch=batch, prompt=args.prompt, steps=args.steps, vocab=vocab
            )
        step_bytes = bytes_for(batch)
        row = {
            "batch": batch,
            "bytes_per_step": step_bytes,
            "bandwidth_bound_ms_per_step": step_bytes / bandwidth * 1000,
            "measured_bound_ms_per_step": step_bytes / measured * 1000,
            "runtime_ms_per_step": runtime_ms,
            "runtime_tokens_per_s": batch * 1000 / runtime_ms,
            "runtime_ms_per_step_by_experts_kernel": by_kernel or None,
            "runtime_overlap_ms_per_step": overlap_ms,
            "generate_ms_per_step": generate_ms,
            "generate_tokens_per_s": None if generate_ms is None else batch * 1000 / generate_ms,
        }
        results["rows"].append(row)
        print(json.dumps(row), file=sys.stderr)
    tp_label = f", thinker TP={args.tp} (serving path)" if args.tp else ""
    print(f"\nThinker decode on {name}{tp_label}, {args.dtype}, prompt {args.prompt}, {args.steps} steps")
    if experts is not None:
        print(f"experts kernel: generate {experts[0]}, runtime {experts[1]}")
    print(
        f"bound = weights a step reads / HBM {bandwidth / 1e12:.2f} TB/s (the datasheet's); "
        f"x meas: against the {measured / 1e12:.2f} TB/s measured here"
    )
    print(
        f"{'batch':>5} {'GB/step':>8} {'bound ms':>9} {'runtime ms/step':>16} {'tok/s':>9} {'x bound':>8} "
        f"{'x meas':>7} {'generate ms/step':>17} {'tok/s':>9}"
    )
    for row in results["rows"]:
        gen_ms = row["generate_ms_per_step"]
        gen = (
            f"{gen_ms:17.2f} {row['generate_tokens_per_s']:9.1f}"
            if gen_ms is not None
            else f"{'-':>17} {'-':>9}"
        )
        bound_ms = row["bandwidth_bound_ms_per_step"]
        print(
            f"{row['batch']:>5} {row['bytes_per_step'] / 1e9:8.2f} {bound_ms:9.2f} {row['runtime_ms_per_step']:16.2f} "
            f"{row['runtime_tokens_per_s']:9.1f} {row['runtime_ms_per_step'] / bound_ms:8.2f} "
            f"{row['runtime_ms_per_step'] / row['measured_bound_ms_per_step']:7.2f} {gen}"
        )
        if row["runtime_overlap_ms_per_step"] is not None:
            ms = row["runtime_overlap_ms_per_step"]
            print(
                f"{'':>5} runtime with the next step queued before the tokens are read: {ms:.2f} ms/step "
                f"({ms / bound_ms:.2f} x bound, {ms / row['measured_bound_ms_per_step']:.2f} x measured)"
            )
        for kernel, ms in (row["runtime_ms_per_step_by_experts_kernel"] or {}).items():
            if experts is not None and kernel != experts[1]:
                print(
                    f"{'':>5} runtime with experts kernel {kernel}: {ms:.2f} ms/step ({ms / bound_ms:.2f} x bound, "
                    f"{ms / row['measured_bound_ms_per_step']:.2f} x measured)"
                )
    if args.json:
        from pathlib import Path

        from omni_runtime.bench.report import plot_decode

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
        plot_decode(Path(args.json).with_suffix(".png"), results)
        print(f"wrote {args.json} and its plot {Path(args.json).with_suffix('.png')}")
    close = getattr(runner, "close", None)
    if close is not None:  # TP followers
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
