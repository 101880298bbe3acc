"""The speech half of the bench report: listener columns, open-loop rows, the speech plot, the
audio delta durations the load generator reads and its seeded Poisson arrivals."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from omni_runtime.bench.load import audio_seconds, poisson_arrivals
from omni_runtime.bench.report import format_table, plot_speech
from omni_runtime.bench.stats import LevelSummary
from omni_runtime.media.audio import encode_wav, to_pcm16


def _speech_row(label: str, concurrency: int, **extra: object) -> LevelSummary:
    row = LevelSummary(label, concurrency, 4, 0, 2.0, 2.0, 64.0, *([None] * 7))  # type: ignore[arg-type]
    speech = {
        "ttfa_p95_s": 0.5,
        "ttfa_p99_s": 0.75,
        "stall_mean_s": 0.125,
        "stall_p95_s": 0.4,
        "stall_max_s": 0.5,
        "closest_s": -0.05,
        "rtf_p50": 0.25,
        "rtf_max": 0.5,
        "audio_streams": 4,
        "realtime_streams": 3,
        "audio_s_per_s": 12.5,
        "stream_audio_min_s": 1.5,
        "stream_audio_p50_s": 9.75,
    }
    return replace(row, ttfa_p50_s=0.25, **{**speech, **extra})  # type: ignore[arg-type]


def test_speech_table_is_exact() -> None:
    rows = [
        _speech_row("omni", 4, ttfa_first_wave_p50_s=0.6, ttfa_later_p50_s=0.4),
        _speech_row("omni", 0, rate_per_s=1.5),
        _speech_row("hf", 1, realtime_streams=4),
    ]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == [
        "label", "load", "ok/all", "req/s", "tok/s", "lat", "mean", "lat", "p50", "lat", "p95", "ttft",
        "p50", "tpot", "p50", "tpot", "p95", "ttfa", "p50", "ttfa", "p95", "ttfa", "p99", "stall/str", "stall", "max", "closest", "rtf", "p50",
        "rt/str", "audio", "s/s", "audio/str", "min", "audio/str", "p50", "ttfa", "1st", "wave", "ttfa",
        "later",
    ]  # fmt: skip
    assert lines[2].split() == [
        "omni", "4", "4/4", "2.00", "64.0", "-", "-", "-", "-", "-", "-", "0.250", "0.500", "0.750", "0.125",
        "0.500", "-0.050", "0.250", "3/4", "12.50", "1.50", "9.75", "0.600", "0.400",
    ]  # fmt: skip
    assert lines[3].split()[:2] == ["omni", "1.5/s"]
    assert lines[4].split()[-6:] == ["4/4", "12.50", "1.50", "9.75", "-", "-"]


def test_first_wave_and_later_ttfa() -> None:
    """Closed loop, two waves of 2: the first two requests sent are the first wave, whatever order
    they finish in; a failed request or one without audio counts in neither."""
    from omni_runtime.bench.stats import RequestSample, summarize

    def sample(sent: float, ttfa: float | None, ok: bool = True) -> RequestSample:
        return RequestSample(ok=ok, latency_s=1.0, ttfa_s=ttfa, sent_s=sent)

    two_waves = [
        sample(0.01, 0.4),
        sample(1.5, 0.2),
        sample(0.0, 0.6),
        sample(1.0, 0.3),
        sample(2.0, 9.0, ok=False),
    ]
    row = summarize(two_waves, concurrency=2, wall_s=3.0)
    assert (row.ttfa_first_wave_p50_s, row.ttfa_later_p50_s) == (0.5, 0.25)
    one_wave = summarize(two_waves[:2], concurrency=2, wall_s=3.0)
    open_loop = summarize(two_waves, concurrency=2, wall_s=3.0, rate_per_s=1.0)
    no_times = summarize([RequestSample(ok=True, latency_s=1.0, ttfa_s=0.1)] * 3, concurrency=1, wall_s=3.0)
    for row in (one_wave, open_loop, no_times):
        assert (row.ttfa_first_wave_p50_s, row.ttfa_later_p50_s) == (None, None)


def test_speech_plot_is_a_png(tmp_path: Path) -> None:
    rows = [_speech_row("omni", c, stall_mean_s=0.1 * c) for c in (1, 4, 16)]
    rows.append(_speech_row("omni", 0, rate_per_s=2.0))
    plot_speech(tmp_path / "speech.png", rows=rows, title="t")
    assert (tmp_path / "speech.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_audio_seconds_of_wav_and_pcm_deltas() -> None:
    pcm = np.zeros(2400, dtype=np.float32)  # 0.1 s at 24 kHz, 0.15 s at 16 kHz
    wav24 = base64.b64encode(encode_wav(pcm, sample_rate=24000)).decode()
    wav16 = base64.b64encode(encode_wav(pcm, sample_rate=16000)).decode()
    raw = base64.b64encode(to_pcm16(pcm)).decode()
    assert audio_seconds(wav24, pcm_rate=1) == pytest.approx(0.1)
    assert audio_seconds(wav16, pcm_rate=1) == pytest.approx(0.15)
    assert audio_seconds(raw, pcm_rate=24000) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="not base64"):
        audio_seconds("@@@", pcm_rate=24000)
    with pytest.raises(ValueError, match="WAV"):
        audio_seconds(base64.b64encode(b"RIFF1234").decode(), pcm_rate=24000)


def test_poisson_arrivals_are_seeded_sorted_and_bounded() -> None:
    a = poisson_arrivals(4.0, 50.0, seed=7)
    assert a == poisson_arrivals(4.0, 50.0, seed=7)
    assert a != poisson_arrivals(4.0, 50.0, seed=8)
    assert a == sorted(a) and a[0] > 0 and a[-1] < 50.0
    assert 150 < len(a) < 250  # about rate x duration = 200
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, 1.0, seed=0)


def test_combine_puts_our_rows_and_the_baseline_in_one_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omni_runtime.bench.combine import main
    from omni_runtime.bench.report import write_json

    ours = [_speech_row("omni", 1), _speech_row("omni", 4)]
    text = replace(_speech_row("omni-text", 1), **dict.fromkeys(("audio_streams", "realtime_streams")))
    write_json(tmp_path / "bench.json", meta={}, levels=[*ours, text], baselines=[])
    hf = {"levels": [{"label": "hf", "concurrency": 1, "requests_per_s": 1, "output_tokens_per_s": 2}]}
    hf["levels"].append({**hf["levels"][0], "label": "hf-speech", "audio_streams": 1, "realtime_streams": 1})
    (tmp_path / "hf.json").write_text(json.dumps(hf))
    out = tmp_path / "combined"
    assert main([str(tmp_path / "bench.json"), str(tmp_path / "hf.json"), "--speech", "--out", str(out)]) == 0
    labels = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]]
    assert labels == ["omni", "omni", "hf-speech"]  # text rows left out
    assert (out / "speech.png").exists() and (out / "bench.png").exists()
    (tmp_path / "bad.json").write_text("[1]")
    assert main([str(tmp_path / "bad.json")]) == 2
    assert "row 0 is not an object" in capsys.readouterr().err
