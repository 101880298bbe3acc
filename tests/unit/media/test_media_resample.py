"""The resampler keeps in-band tones, removes out-of-band ones and produces the exact length."""

from __future__ import annotations

import math

import numpy as np
import pytest
from media_synth import make_tone, peak_frequency

from omni_runtime.media.resample import resample


@pytest.mark.parametrize("orig_sr", [8000, 22050, 24000, 44100, 48000])
def test_tone_frequency_and_length_survive(orig_sr: int) -> None:
    tone = make_tone(freq=1000, sample_rate=orig_sr, seconds=2.0)
    out = resample(tone, orig_sr=orig_sr, target_sr=16000)
    assert out.dtype == np.float32
    assert out.size == math.ceil(tone.size * 16000 / orig_sr) == 32000
    assert peak_frequency(out, 16000) == pytest.approx(1000, abs=1.0)
    # Amplitude is preserved away from the edges (passband gain 1).
    assert np.abs(out[1000:-1000]).max() == pytest.approx(0.5, abs=0.01)


def test_tone_above_new_nyquist_is_filtered_not_aliased() -> None:
    # 10 kHz at 44.1 kHz would alias to 6 kHz at 16 kHz if samples were simply dropped.
    tone = make_tone(freq=10_000, sample_rate=44100, seconds=1.0)
    out = resample(tone, orig_sr=44100, target_sr=16000)
    rms_in = float(np.sqrt(np.mean(tone**2)))
    rms_out = float(np.sqrt(np.mean(out[500:-500] ** 2)))
    assert 20 * math.log10(rms_out / rms_in) < -40


def test_upsampling_keeps_tone() -> None:
    tone = make_tone(freq=3000, sample_rate=16000, seconds=1.0)
    out = resample(tone, orig_sr=16000, target_sr=24000)
    assert out.size == 24000
    assert peak_frequency(out, 24000) == pytest.approx(3000, abs=1.0)


def test_same_rate_is_identity() -> None:
    tone = make_tone(freq=440, sample_rate=16000, seconds=0.1)
    np.testing.assert_array_equal(resample(tone, orig_sr=16000, target_sr=16000), tone)


def test_empty_input_and_bad_rates() -> None:
    assert resample(np.zeros(0), orig_sr=44100, target_sr=16000).size == 0
    with pytest.raises(ValueError, match="positive"):
        resample(np.zeros(4), orig_sr=0, target_sr=16000)
