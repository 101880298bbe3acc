"""Plain HF transformers `generate` on the same GPU: the baseline `omni bench` is compared with.

It builds Qwen2.5-Omni-7B-shaped modules with random weights (the released talker shape) and
times the monolithic `generate` with a fixed output length, at batch = concurrency (the best a
plain `generate` server can do: static batches, all output at the end). Rows are written in
`omni bench`'s format so `--baseline-json` shows them next to ours.

    python -m omni_runtime.bench.hf_baseline --concurrency 1,4,16 --max-tokens 128 --out hf.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _row(*, label: str, concurrency: int, latency: float, tokens: int, ttfa: float | None) -> dict[str, Any]:
    return {
        "label": label,
        "concurrency": concurrency,
        "requests": concurrency,
        "failed": 0,
        "wall_s": latency,
        "requests_per_s": concurrency / latency,
        "output_tokens_per_s": concurrency * tokens / latency,
        "latency_mean_s": latency,
        "latency_p50_s": latency,
        "latency_p95_s": latency,
        "ttft_mean_s": latency,  # generate returns everything at the end
        "ttft_p50_s": latency,
        "ttfa_mean_s": ttfa,
        "ttfa_p50_s": ttfa,
    }


def _timed(fn: Any) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def run(
    *, levels: list[int], max_tokens: int, prompt_len: int, speech: bool, talker_tokens: int
) -> list[dict]:
    import torch
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as hf

    from omni_runtime.models.qwen2_5_omni.loader import load_processor, released_7b_config

    torch.manual_seed(0)
    # The released 7B shapes with media token ids set (generate's rope index reads them).
    config = released_7b_config(load_processor(None))
    rows = []
    with torch.device("cuda"):
        thinker = hf.Qwen2_5OmniThinkerForConditionalGeneration._from_config(
            config.thinker_config, dtype=torch.bfloat16
        ).eval()
    weight_gb = sum(p.numel() * p.element_size() for p in thinker.model.parameters()) / 1e9
    print(f"thinker LM weights {weight_gb:.1f} GB bf16", file=sys.stderr)
    for c in levels:
        ids = torch.randint(1000, 100000, (c, prompt_len), device="cuda")
        mask = torch.ones_like(ids)

        def gen(ids: Any = ids, mask: Any = mask) -> None:
            thinker.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
            )

        gen()  # warm-up
        latency = _timed(gen)
        print(
            f"hf-generate text c={c}: {latency:.2f}s, {latency / max_tokens * 1e3:.1f} ms/step",
            file=sys.stderr,
        )
        rows.append(_row(label="hf-generate", concurrency=c, latency=latency, tokens=max_tokens, ttfa=None))
    if speech:
        del thinker
        torch.cuda.empty_cache()
        with torch.device("cuda"):
            model = hf.Qwen2_5OmniForConditionalGeneration._from_config(config, dtype=torch.bfloat16).eval()
        token2wav_config: Any = config.token2wav_config
        talker_config: Any = config.talker_config
        mel_dim = token2wav_config.dit_config.mel_dim
        model.speaker_map = {
            "Chelsie": {
                "bos_token": talker_config.tts_codec_start_token_id,
                "cond": torch.randn(1, 192, device="cuda", dtype=torch.bfloat16),
                "ref_mel": torch.randn(1, 300, mel_dim, device="cuda", dtype=torch.bfloat16),
            }
        }
        ids = torch.randint(1000, 100000, (1, prompt_len), device="cuda")

        def speak() -> None:
            model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                speaker="Chelsie",
                thinker_max_new_tokens=64,
                thinker_min_new_tokens=64,
                talker_max_new_tokens=talker_tokens,
                talker_min_new_tokens=talker_tokens,
                thinker_do_sample=False,
            )

        latency = _timed(speak)
        print(f"hf-generate speech c=1: {latency:.2f}s (first audio = end)", file=sys.stderr)
        rows.append(_row(label="hf-generate-speech", concurrency=1, latency=latency, tokens=64, ttfa=latency))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omni_runtime.bench.hf_baseline", description=__doc__)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--speech", action="store_true", help="also time one full speech generate")
    parser.add_argument("--talker-tokens", type=int, default=400)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rows = run(
        levels=[int(c) for c in args.concurrency.split(",")],
        max_tokens=args.max_tokens,
        prompt_len=args.prompt_len,
        speech=args.speech,
        talker_tokens=args.talker_tokens,
    )
    Path(args.out).write_text(json.dumps({"levels": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
