"""Plain HF transformers `generate` on the same GPU: the baseline `omni bench` is compared with.

It builds the released shapes of ``--family`` with random weights (Qwen2.5-Omni-7B, the default,
or Qwen3-Omni-30B-A3B; or the config of ``--model-path``, whose ``model_type`` names the family,
weights still random) and times the monolithic ``generate`` with a fixed output length, at batch =
concurrency (the best a plain ``generate`` server can do: static batches, all output at the end).

- text: the family's ``ThinkerForConditionalGeneration.generate``, greedy, exactly ``--max-tokens``.
- ``--speech``: the family's ``ForConditionalGeneration.generate`` with audio out,
  ``--speech-text-tokens`` text tokens and ``--talker-tokens`` codec tokens per request (a
  Qwen2.5 codec token is 2 mel frames = 480 samples at 24 kHz, a Qwen3 frame 1920 samples), one
  call with a batch of N prompts per level; what it takes to run on random weights, and why, is
  in ``hf_speech``'s docstring.

``levels`` in the output JSON are rows in ``omni bench``'s format, so ``--baseline-json`` shows
them next to ours (for a ``generate`` call, time to first token and first audio = latency).
``speech`` holds what that format has no field for: audio seconds, audio seconds per wall second,
samples per request. ``meta`` names the device.

    python -m omni_runtime.bench.hf_baseline --concurrency 1,4,16 --max-tokens 128 --speech --out hf.json
    python -m omni_runtime.bench.hf_baseline --family qwen3_omni_moe --speech --talker-tokens 125 --out hf.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from omni_runtime.support.cli_types import positive_int


def level_row(
    *, label: str, concurrency: int, latency: float, tokens: int, ttfa: float | None
) -> dict[str, Any]:
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


def prompt_ids(*, batch: int, length: int, config: Any, device: Any) -> Any:
    """Random ordinary token ids: below the special tokens (the top of the vocabulary in Qwen's and
    the tiny tokenizer's layout; 1000..100000 for the released 152k vocabulary), and never a media
    or marker id of the config: with the tiny tokenizer's ids in a 7B config those fall inside the
    range, and a stray vision-start or audio placeholder makes ``get_rope_index`` look for media."""
    import torch

    thinker = config.thinker_config
    vocab_size = int(thinker.text_config.vocab_size)
    high = min(100000, vocab_size - vocab_size // 4)
    low = min(1000, high // 4)
    markers = sorted(
        int(value)
        for key, value in thinker.to_dict().items()
        if key.endswith(("_token_id", "_token_index")) and isinstance(value, int)
    )
    ids = torch.randint(low, high, (batch, length), device=device)
    return torch.where(torch.isin(ids, torch.tensor(markers, device=device)), low, ids)


FAMILIES = ("qwen2_5_omni", "qwen3_omni_moe")
# The family's transformers classes: (whole model with talker, thinker alone).
CLASSES = {
    "qwen2_5_omni": ("Qwen2_5OmniForConditionalGeneration", "Qwen2_5OmniThinkerForConditionalGeneration"),
    "qwen3_omni_moe": ("Qwen3OmniMoeForConditionalGeneration", "Qwen3OmniMoeThinkerForConditionalGeneration"),
}
SHAPES = {"qwen2_5_omni": "Qwen2.5-Omni-7B", "qwen3_omni_moe": "Qwen3-Omni-30B-A3B"}


def family_of(model_path: Path | None, family: str | None) -> str:
    """``--family``, else the ``model_type`` of ``--model-path``'s config.json, else Qwen2.5."""
    if model_path is not None:
        found = json.loads((model_path / "config.json").read_text()).get("model_type")
        if found not in FAMILIES:
            raise ValueError(f"--model-path: model_type {found!r} is not one of {', '.join(FAMILIES)}")
        if family is not None and family != found:
            raise ValueError(f"--family {family} but --model-path holds a {found} config; drop one")
        return str(found)
    return family or FAMILIES[0]


def _config_and_speakers(model_path: Path | None, family: str) -> tuple[Any, dict[str, dict[str, Any]]]:
    if family == "qwen3_omni_moe":
        from omni_runtime.models.qwen3_omni_moe.config import ensure_talker_fields, released_30b_a3b_config

        if model_path is None:
            return released_30b_a3b_config(), {}
        from transformers import AutoConfig

        return ensure_talker_fields(AutoConfig.from_pretrained(str(model_path))), {}
    from omni_runtime.models.qwen2_5_omni import loader

    if model_path is None:
        # The released 7B shapes with media token ids set (generate's rope index reads them).
        config = loader.released_7b_config(loader.load_processor(None))
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(model_path))
    # The same speaker entries the runtime serves (spk_dict.pt, else random ones): hf_speech says why.
    return config, loader.load_speakers(model_path, config)


def run(
    *,
    levels: list[int],
    max_tokens: int,
    prompt_len: int,
    speech: bool,
    speech_levels: list[int] | None = None,
    text: bool = True,
    speech_text_tokens: int = 64,
    talker_tokens: int = 400,
    device_name: str = "cuda",
    model_path: Path | None = None,
    family: str = "qwen2_5_omni",
) -> dict[str, Any]:
    """Time the levels; returns ``{"meta": ..., "levels": [rows], "speech": [extras]}``."""
    import torch
    import transformers

    from omni_runtime.bench import hf_speech

    device = torch.device(device_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # bf16 matmuls crawl on CPUs
    torch.manual_seed(0)
    config, speakers = _config_and_speakers(model_path, family)
    whole, thinker_only = (getattr(transformers, name) for name in CLASSES[family])
    with torch.device(device):
        if speech:  # one full model; its thinker serves the text levels too
            model = whole._from_config(config, dtype=dtype).eval()
            thinker = model.thinker
        else:
            thinker = thinker_only._from_config(config.thinker_config, dtype=dtype).eval()
    weight_gb = sum(p.numel() * p.element_size() for p in thinker.model.parameters()) / 1e9
    print(f"thinker LM weights {weight_gb:.1f} GB {dtype} on {device}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    extras: list[dict[str, Any]] = []

    def prompt(batch: int) -> Any:
        ids = prompt_ids(batch=batch, length=prompt_len, config=config, device=device)
        return hf_speech.chat_prompt(ids, config) if family == hf_speech.QWEN3 else ids

    for c in levels if text else []:
        ids = prompt(c)

        def gen(ids: Any = ids) -> None:
            thinker.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
            )

        gen()  # warm-up
        hf_speech.synchronize(device)
        start = time.perf_counter()
        gen()
        hf_speech.synchronize(device)
        latency = time.perf_counter() - start
        print(
            f"hf-generate text c={c}: {latency:.2f}s, {latency / max_tokens * 1e3:.1f} ms/step",
            file=sys.stderr,
        )
        rows.append(
            level_row(label="hf-generate", concurrency=c, latency=latency, tokens=max_tokens, ttfa=None)
        )
    if speech:
        guard = hf_speech.prepare(model, speakers=speakers)
        for c in speech_levels or levels:
            ids = prompt(c)
            result = hf_speech.time_speech(
                model, guard, ids, text_tokens=speech_text_tokens, talker_tokens=talker_tokens
            )
            extra = result.extras(text_tokens=speech_text_tokens, talker_tokens=talker_tokens)
            print(
                f"hf-generate speech c={c} (one batched generate): {result.latency_s:.2f}s, all audio at "
                f"the end; {extra['audio_s']:.1f} s of audio, {extra['audio_s_per_wall_s']:.2f} audio s "
                f"per wall s; {result.codes_replaced} out-of-table codes mapped to 0",
                file=sys.stderr,
            )
            row = level_row(
                label="hf-generate-speech",
                concurrency=c,
                latency=result.latency_s,
                tokens=speech_text_tokens,
                ttfa=result.latency_s,
            )
            rows.append({**row, **result.listener_fields()})
            extras.append(extra)
    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "model": str(model_path) if model_path else f"{SHAPES[family]} shapes, random weights",
        "family": family,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    return {"meta": meta, "levels": rows, "speech": extras}


def _levels(text: str) -> list[int]:
    try:
        levels = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,4,16, got {text!r}")
    return levels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m omni_runtime.bench.hf_baseline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--concurrency", type=_levels, default=[1, 4, 16], help="levels, e.g. 1,4,16")
    parser.add_argument("--max-tokens", type=positive_int, default=128, help="text levels' output length")
    parser.add_argument("--prompt-len", type=positive_int, default=64)
    parser.add_argument("--speech", action="store_true", help="also time speech generate at every level")
    parser.add_argument(
        "--speech-concurrency", type=_levels, help="speech levels (default: the --concurrency levels)"
    )
    parser.add_argument("--no-text", action="store_true", help="skip the text levels")
    parser.add_argument(
        "--speech-text-tokens", type=positive_int, default=64, help="thinker tokens per speech reply"
    )
    parser.add_argument(
        "--talker-tokens", type=positive_int, default=400, help="codec tokens per speech reply"
    )
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument(
        "--family",
        choices=FAMILIES,
        help="the model family (default: --model-path's model_type, else qwen2_5_omni)",
    )
    parser.add_argument(
        "--model-path",
        type=Path,
        help="checkpoint directory whose config.json (and spk_dict.pt) to use; weights stay random. "
        "Default: the family's released shapes",
    )
    parser.add_argument("--out", required=True, type=Path)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.model_path is not None and not (args.model_path / "config.json").is_file():
        print(f"--model-path: no config.json in {args.model_path}", file=sys.stderr)
        return 2
    try:
        family = family_of(args.model_path, args.family)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    result = run(
        levels=args.concurrency,
        max_tokens=args.max_tokens,
        prompt_len=args.prompt_len,
        speech=args.speech,
        speech_levels=args.speech_concurrency,
        text=not args.no_text,
        speech_text_tokens=args.speech_text_tokens,
        talker_tokens=args.talker_tokens,
        device_name=args.device,
        model_path=args.model_path,
        family=family,
    )
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
