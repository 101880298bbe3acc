"""Does an SM partition (CUDA green contexts) keep the vocoder fast while the thinker decodes?

Run by hand on the device machine (one GPU). Under load a Qwen2.5 vocoder call of 16 windows runs
beside the thinker's decode steps on the same GPU; its thousands of small kernels queue behind
the thinker's weight-streaming GEMMs and the call takes two to three times as long, unless the
window holds the thinker (pipeline.deadlines), which pauses every reply's text. This script
measures, in one process, with the released token2wav (random weights, bfloat16 DiT) and a
stand-in thinker (the 7B thinker's 28 layers of GEMMs at 16 rows, replayed as one CUDA graph):

- each alone: the vocoder call (second windows, batch 16) and the thinker step;
- together on the whole GPU (the vocoder's stream at the higher priority, as served today);
- together with the thinker confined by a green context to all SMs but K (the vocoder's stream
  stays on the whole GPU, so its kernels always find K SMs free of thinker blocks), for a few K.
  (torch 2.11's ``GreenContext.create`` takes the first N SMs, so two contexts would overlap.)

Per row: the vocoder call's time and the thinker steps a second while it runs. The last row
confines the vocoder to 32 SMs; its window graphs are captured on streams outside that context,
so it does not show the vocoder on 32 SMs (left as a probe). Measured on an H100
(docs/bench/green-split-h100-2026-11-27f.txt): 119 ms alone, 302 ms beside the thinker, 255 ms with
the thinker on 84 SMs: most of the slowdown is the memory system, not SMs.

    python tests/gpu/green_split.py [--splits 16,24,32,48]
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time

import torch


def thinker_graph(device: torch.device, rows: int = 16) -> tuple[torch.cuda.CUDAGraph, float, list]:
    """A CUDA graph of one stand-in decode step: per layer the 7B thinker's q/k/v, o, gate-up and
    down GEMMs (hidden 3584, intermediate 18944, 4 KV heads of 128) at ``rows`` tokens, bf16."""
    hidden, inter, kv = 3584, 18944, 4 * 128
    shapes = [(hidden, hidden + 2 * kv), (hidden, hidden), (hidden, 2 * inter), (inter, hidden)]
    weights = [
        [torch.randn(i, o, device=device, dtype=torch.bfloat16) * 0.01 for i, o in shapes] for _ in range(28)
    ]
    x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)

    def step() -> None:
        h = x
        for qkv, o, gate_up, down in weights:
            a = (h @ qkv)[:, :hidden]
            h = h + a @ o
            g = h @ gate_up
            h = h + (torch.nn.functional.silu(g[:, :inter]) * g[:, inter:]) @ down
        x.copy_(h * 0.001)

    stream = torch.cuda.current_stream(device)  # the thread's own stream (a green context's, or not)
    for _ in range(2):
        step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()
    torch.cuda.synchronize()
    gb = sum(w.numel() for layer in weights for w in layer) * 2 / 1e9
    return graph, gb, [weights, x]  # the graph reads these: they live as long as it is replayed


def build_vocoder(device: torch.device):
    import numpy as np
    from profile_vocoder import _released_token2wav  # tests/gpu, beside this script

    from omni_runtime.models.qwen2_5_omni import vocoder as vocoder_module
    from omni_runtime.models.qwen2_5_omni.loader import load_speakers

    config, token2wav = _released_token2wav(device)
    vocoder = vocoder_module.QwenVocoder(
        token2wav, speakers=load_speakers(None, config), device=device, dit_dtype=torch.bfloat16
    )
    voice = next(iter(vocoder.speakers))
    codes = [int(c) for c in np.random.default_rng(0).integers(0, 8000, 200)]
    # 16 second windows: keep codes [20, 30) with context [10, 35), as under a 16-stream wave
    window = {"start": 20, "end": 30, "ctx_start": 10, "ctx_end": 35}
    batch = [
        {"codes": codes, "window": window, "voice": voice, "seed": i, "reusable": True} for i in range(16)
    ]
    return vocoder, batch


def run_side(label: str, device: torch.device, thinker_ctx, vocoder_ctx, args) -> None:
    """One row: the thinker's graph replays in a loop on its thread (its context), the vocoder's
    calls on another (its context), timed separately and together."""
    result: dict[str, object] = {}
    ready = threading.Event()
    go = threading.Event()
    stop = threading.Event()
    steps: list[float] = []

    def thinker() -> None:
        torch.cuda.set_device(device)
        if thinker_ctx is not None:  # its work on the green context's stream, so on its SMs only
            torch.cuda.set_stream(thinker_ctx.Stream())
        else:
            torch.cuda.set_stream(torch.cuda.Stream(device=device, priority=0))
        graph, gb, _kept = thinker_graph(device)
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(30):
            graph.replay()
        torch.cuda.synchronize()
        result["thinker_alone_ms"] = (time.perf_counter() - began) * 1000 / 30
        result["thinker_gb"] = gb
        ready.set()
        go.wait()
        while not stop.is_set():
            graph.replay()
            torch.cuda.current_stream(device).synchronize()
            steps.append(time.perf_counter())

    def vocoder_side() -> None:
        torch.cuda.set_device(device)
        if vocoder_ctx is not None:
            torch.cuda.set_stream(vocoder_ctx.Stream())
        else:
            torch.cuda.set_stream(torch.cuda.Stream(device=device, priority=-1))
        ready.wait()  # one capture at a time: the thinker's graph first
        vocoder, batch = build_vocoder(device)
        for _ in range(3):
            vocoder.synthesize_many(batch)
        torch.cuda.synchronize()
        alone = []
        for _ in range(5):
            began = time.perf_counter()
            vocoder.synthesize_many(batch)
            torch.cuda.current_stream(device).synchronize()
            alone.append(time.perf_counter() - began)
        result["vocoder_alone_ms"] = sorted(alone)[2] * 1000
        go.set()
        time.sleep(0.2)
        together = []
        windows = []
        for _ in range(8):
            began = time.perf_counter()
            vocoder.synthesize_many(batch)
            torch.cuda.current_stream(device).synchronize()
            ended = time.perf_counter()
            together.append(ended - began)
            windows.append((began, ended))
            time.sleep(0.05)
        stop.set()
        result["vocoder_together_ms"] = sorted(together)[4] * 1000
        during = sum(1 for t in steps for b, e in windows if b <= t <= e)
        result["thinker_steps_per_s_during"] = during / sum(e - b for b, e in windows)
        gaps = [b - a for a, b in itertools.pairwise(steps)]
        result["thinker_step_ms_together_p50"] = sorted(gaps)[len(gaps) // 2] * 1000 if gaps else None

    threads = [threading.Thread(target=thinker), threading.Thread(target=vocoder_side)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(
        f"{label:34s} vocoder alone {result.get('vocoder_alone_ms', 0):6.1f} ms, together "
        f"{result.get('vocoder_together_ms', 0):6.1f} ms | thinker step alone "
        f"{result.get('thinker_alone_ms', 0):5.2f} ms ({result.get('thinker_gb', 0):.1f} GB), "
        f"together p50 {result.get('thinker_step_ms_together_p50') or 0:5.2f} ms, "
        f"{result.get('thinker_steps_per_s_during', 0):5.1f} steps/s during vocoder calls",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--splits", default="16,24,32,48", help="SMs the thinker leaves free")
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    print(torch.cuda.get_device_name(device), sms, "SMs, torch", torch.__version__, flush=True)
    from torch.cuda import green_contexts

    print(
        "GreenContext API:",
        [n for n in dir(green_contexts.GreenContext) if not n.startswith("_")],
        flush=True,
    )
    run_side("whole GPU (priorities only)", device, None, None, args)
    for spare in (int(s) for s in args.splits.split(",")):
        try:
            thinker_ctx = green_contexts.GreenContext.create(num_sms=sms - spare, device_id=0)
        except Exception as exc:  # report it and go on to the next split
            print(f"thinker on {sms - spare} SMs: {type(exc).__name__}: {exc}", flush=True)
            continue
        run_side(f"thinker on {sms - spare} SMs ({spare} spare)", device, thinker_ctx, None, args)
    # How the vocoder's call scales with SMs (its "alone" column; "together" shares SMs 0..K-1)
    vocoder_ctx = green_contexts.GreenContext.create(num_sms=32, device_id=0)
    run_side("vocoder on 32 SMs, thinker whole GPU", device, None, vocoder_ctx, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
