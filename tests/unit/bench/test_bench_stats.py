"""Bench statistics and report: exact numbers, the table, baseline rows, the JSON and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_runtime.bench.load import LoadSpec, request_body
from omni_runtime.bench.report import format_table, load_baselines, plot, write_json
from omni_runtime.bench.stats import Chunk, LevelSummary, RequestSample, percentile, request_rows, summarize


def test_percentile_matches_linear_interpolation() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_exact() -> None:
    samples = [
        # tokens after the first: 0.1, 0.1 and 0.2 s each
        RequestSample(ok=True, latency_s=1.0, ttft_s=0.1, last_text_s=1.0, ttfa_s=0.3, output_tokens=10),
        RequestSample(ok=True, latency_s=2.0, ttft_s=0.2, last_text_s=1.1, ttfa_s=None, output_tokens=10),
        RequestSample(ok=True, latency_s=3.0, ttft_s=0.3, last_text_s=2.1, ttfa_s=0.5, output_tokens=10),
        RequestSample(ok=False, latency_s=9.0, error="HTTP 500: boom"),
    ]
    assert summarize(samples, concurrency=4, wall_s=3.0) == LevelSummary(
        label="omni",
        concurrency=4,
        requests=4,
        failed=1,
        wall_s=3.0,
        requests_per_s=1.0,
        output_tokens_per_s=10.0,
        latency_mean_s=2.0,
        latency_p50_s=2.0,
        latency_p95_s=pytest.approx(2.9),  # type: ignore[arg-type]
        ttft_mean_s=pytest.approx(0.2),  # type: ignore[arg-type]
        ttft_p50_s=0.2,
        ttfa_mean_s=0.4,
        ttfa_p50_s=0.4,
        first_error="HTTP 500: boom",
        tpot_p50_s=pytest.approx(0.1),  # type: ignore[arg-type]
        tpot_p95_s=pytest.approx(0.19),  # type: ignore[arg-type]
    )


def test_summarize_all_failed_has_no_latencies() -> None:
    summary = summarize([RequestSample(ok=False, latency_s=1.0, error="x")], concurrency=1, wall_s=1.0)
    assert (summary.requests_per_s, summary.latency_p50_s, summary.ttft_p50_s) == (0.0, None, None)


def _row(label: str, concurrency: int, tokens: float, **extra: float | None) -> LevelSummary:
    base = dict.fromkeys(
        [
            "latency_mean_s",
            "latency_p50_s",
            "latency_p95_s",
            "ttft_mean_s",
            "ttft_p50_s",
            "ttfa_mean_s",
            "ttfa_p50_s",
        ]
    )
    base.update(extra)
    return LevelSummary(label, concurrency, 8, 0, 2.0, 4.0, tokens, **base)  # type: ignore[arg-type]


def test_table_is_exact() -> None:
    rows = [
        _row(
            "omni", 1, 123.456, latency_p50_s=0.25, ttft_p50_s=0.0123, tpot_p50_s=0.00241, tpot_p95_s=0.0031
        ),
        _row("hf-generate", 16, 5.0),
    ]
    assert format_table(rows).splitlines() == [
        "label        load  ok/all  req/s  tok/s  lat mean  lat p50  lat p95  ttft p50  tpot p50  tpot p95  ttfa p50",
        "-----------  ----  ------  -----  -----  --------  -------  -------  --------  --------  --------  --------",
        "omni            1     8/8   4.00  123.5         -    0.250        -     0.012    0.0024    0.0031         -",
        "hf-generate    16     8/8   4.00    5.0         -        -        -         -         -         -         -",
    ]


def test_baselines_load_and_errors_name_the_row(tmp_path: Path) -> None:
    good = tmp_path / "hf.json"
    good.write_text(
        json.dumps(
            {
                "levels": [
                    {
                        "label": "hf-generate",
                        "concurrency": 1,
                        "requests_per_s": 0.5,
                        "output_tokens_per_s": 11,
                    }
                ]
            }
        )
    )
    (row,) = load_baselines(good)
    assert (row.label, row.concurrency, row.output_tokens_per_s, row.latency_p50_s) == (
        "hf-generate",
        1,
        11.0,
        None,
    )
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps([{"label": "x", "concurrency": 1, "requests_per_s": "fast", "output_tokens_per_s": 1}])
    )
    with pytest.raises(ValueError, match=r"row 0: requests_per_s must be a number, got 'fast'"):
        load_baselines(bad)
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps([{"label": "x"}]))
    with pytest.raises(
        ValueError, match=r"row 0: missing fields \['concurrency', 'output_tokens_per_s', 'requests_per_s'\]"
    ):
        load_baselines(missing)


def test_json_roundtrip_and_png(tmp_path: Path) -> None:
    rows = [_row("omni", c, 10.0 * c, latency_p50_s=0.1 * c, ttfa_p50_s=0.05) for c in (1, 4, 16)]
    baseline = [_row("hf-generate", 1, 11.0)]
    write_json(tmp_path / "bench.json", meta={"mode": "text"}, levels=rows, baselines=baseline)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["meta"] == {"mode": "text"}
    assert [LevelSummary.from_json(r) for r in data["levels"]] == rows
    assert load_baselines(tmp_path / "bench.json") == rows  # our own output works as a baseline file
    plot(tmp_path / "bench.png", rows=[*rows, *baseline], title="t")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_request_body_fixes_the_output_length() -> None:
    speech = request_body(LoadSpec(url="http://x", model="m", mode="speech", stream=True, max_tokens=64))
    assert speech["ignore_eos"] is True and speech["max_tokens"] == 64 and speech["stream"] is True
    assert speech["modalities"] == ["text", "audio"]
    # no talker budget given: the talker ends where it ends (its default budget is minutes of audio)
    assert "stage_params" not in speech
    text = request_body(LoadSpec(url="http://x", model="m", mode="text", stream=False, max_tokens=8))
    assert "modalities" not in text and "stage_params" not in text


def test_bench_extra_body_stage_params_must_be_objects_by_stage() -> None:
    from omni_runtime.bench.main import build_parser

    parser = build_parser()
    for bad in ('{"stage_params": "x"}', '{"stage_params": {"talker": null}}'):
        with pytest.raises(SystemExit):
            parser.parse_args(["--url", "http://x", "--extra-body", bad])
    args = parser.parse_args(
        ["--url", "http://x", "--extra-body", '{"stage_params": {"talker": {"max_tokens": 4}}}']
    )
    assert args.extra_body == {"stage_params": {"talker": {"max_tokens": 4}}}


def test_extra_body_stage_params_merge_per_stage() -> None:
    """--extra-body's stage_params add to the bench's own (a talker budget: spoken whole, with
    ignore_eos) instead of replacing them; its other keys replace the bench's."""
    extra = {"stage_params": {"talker": {"max_tokens": 400}, "thinker": {"top_k": 5}}, "temperature": 0.5}
    body = request_body(
        LoadSpec(url="http://x", model="m", mode="speech", stream=True, max_tokens=64, extra_body=extra)
    )
    assert body["stage_params"] == {
        "talker": {"ignore_eos": True, "max_tokens": 400},
        "thinker": {"top_k": 5},
    }
    assert body["temperature"] == 0.5
    off = {"stage_params": {"talker": {"ignore_eos": False}}}
    body = request_body(
        LoadSpec(url="http://x", model="m", mode="speech", stream=True, max_tokens=8, extra_body=off)
    )
    assert body["stage_params"] == {"talker": {"ignore_eos": False}}
    assert extra["stage_params"] == {"talker": {"max_tokens": 400}, "thinker": {"top_k": 5}}  # not mutated


def test_request_rows_are_exact_and_in_send_order() -> None:
    """requests.jsonl's rows: sent order, seconds rounded to 0.1 ms, the listener's stall from the
    audio timeline (played from first audio: 0.2 s plays until 0.5, the next chunk comes at 0.6)."""
    speech = RequestSample(
        ok=True,
        latency_s=2.00004,
        ttft_s=0.1,
        ttfa_s=0.3,
        audio=(Chunk(0.3, 0.2), Chunk(0.6, 1.0), Chunk(1.0, 0.5)),
        sent_s=1.5,
    )
    refused = RequestSample(ok=False, latency_s=0.01, error="full", status=429, sent_s=0.25)
    # 11 tokens streamed from 0.05 s to 0.55 s: 0.05 s a token after the first
    text = RequestSample(ok=True, latency_s=0.8, ttft_s=0.05, last_text_s=0.55, output_tokens=11, sent_s=0.0)
    rows = request_rows([speech, refused, text], level="c=2")
    assert rows == [
        {
            "level": "c=2", "sent_s": 0.0, "ok": True, "status": None, "latency_s": 0.8, "ttft_s": 0.05,
            "tpot_s": 0.05, "ttfa_s": None, "audio_s": None, "stall_s": None, "stalls": None, "min_slack_s": None, "error": None, "chunks": None,
        },
        {
            "level": "c=2", "sent_s": 0.25, "ok": False, "status": 429, "latency_s": 0.01, "ttft_s": None,
            "tpot_s": None, "ttfa_s": None, "audio_s": None, "stall_s": None, "stalls": None, "min_slack_s": None, "error": "full", "chunks": None,
        },
        {
            "level": "c=2", "sent_s": 1.5, "ok": True, "status": None, "latency_s": 2.0, "ttft_s": 0.1,
            "tpot_s": None, "ttfa_s": 0.3, "audio_s": 1.7, "stall_s": 0.1, "stalls": 1, "min_slack_s": -0.1, "error": None,
            "chunks": [[0.3, 0.2], [0.6, 1.0], [1.0, 0.5]],
        },
    ]  # fmt: skip
    assert json.loads(json.dumps(rows)) == rows


def test_talker_tokens_is_the_talker_budget_spoken_whole(capsys: pytest.CaptureFixture[str]) -> None:
    from omni_runtime.bench.main import main, with_talker_tokens

    extra = {"stage_params": {"talker": {"temperature": 0.5}}, "seed": 1}
    merged = with_talker_tokens(extra, 400)
    assert merged == {"stage_params": {"talker": {"temperature": 0.5, "max_tokens": 400}}, "seed": 1}
    assert extra == {"stage_params": {"talker": {"temperature": 0.5}}, "seed": 1}  # not mutated
    assert with_talker_tokens(None, None) is None
    body = request_body(
        LoadSpec(url="http://x", model="m", mode="speech", stream=True, max_tokens=64, extra_body=merged)
    )
    assert body["stage_params"] == {"talker": {"ignore_eos": True, "temperature": 0.5, "max_tokens": 400}}
    # wrong combinations stop before any request, with the fix
    assert main(["--url", "http://127.0.0.1:9", "--talker-tokens", "400"]) == 2
    assert "add --mode speech" in capsys.readouterr().err
    both = '{"stage_params": {"talker": {"max_tokens": 10}}}'
    assert (
        main(
            ["--url", "http://127.0.0.1:9", "--mode", "speech", "--talker-tokens", "4", "--extra-body", both]
        )
        == 2
    )
    assert "give one" in capsys.readouterr().err
