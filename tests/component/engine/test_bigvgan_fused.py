"""BigVGAN's anti-aliased activation as one Triton kernel equals transformers' modules (float
rounding): on the CPU through Triton's interpreter (a subprocess: it is chosen at import), and
on CUDA compiled (device machine)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from transformers import Qwen2_5OmniToken2WavBigVGANModel
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniBigVGANConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniAntiAliasedActivation1d,
    Qwen2_5OmniSnakeBeta,
)

from omni_runtime.models.qwen2_5_omni.bigvgan import FusedAntiAliasedSnake, _phases, fuse_activations

# (batch, channels, samples): rows shorter than a block, and 800 samples, whose middle blocks take
# the kernel's interior path
SHAPES = [(1, 3, 1), (2, 2, 2), (3, 2, 37), (1, 1, 800), (2, 1, 7)]


def _stock(channels: int, seed: int, device: str = "cpu") -> Qwen2_5OmniAntiAliasedActivation1d:
    torch.manual_seed(seed)
    snake = Qwen2_5OmniSnakeBeta(channels)
    with torch.no_grad():  # trained-like parameters (the stock init is all zeros)
        snake.alpha.normal_(0, 0.5)
        snake.beta.normal_(0, 0.5)
    return Qwen2_5OmniAntiAliasedActivation1d(snake).to(device)


def _small_bigvgan() -> Qwen2_5OmniToken2WavBigVGANModel:
    config = Qwen2_5OmniBigVGANConfig(
        mel_dim=16,
        upsample_initial_channel=8,
        resblock_kernel_sizes=[3, 7],
        resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]],
        upsample_rates=[3, 2],
        upsample_kernel_sizes=[7, 4],
    )
    torch.manual_seed(0)
    model = Qwen2_5OmniToken2WavBigVGANModel(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("alpha", "beta")):
                param.normal_(0, 0.3)
    return model


def check_on(device: str) -> None:
    """Every table shape, and a whole small BigVGAN with every activation replaced."""
    for batch, channels, length in SHAPES:
        stock = _stock(channels, length, device)
        x = torch.randn(batch, channels, length, device=device) * 3
        with torch.no_grad():
            got, expected = FusedAntiAliasedSnake(stock)(x), stock(x)
        assert got.shape == expected.shape == x.shape
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    stock_model = _small_bigvgan().to(device)
    fused = copy.deepcopy(stock_model)
    assert fuse_activations(fused) == 2 * 2 * 6 + 1  # 6 per AMP block, and the last
    assert not any(isinstance(m, Qwen2_5OmniAntiAliasedActivation1d) for m in fused.modules())
    mel = torch.randn(2, 16, 9, device=device)
    with torch.no_grad():
        torch.testing.assert_close(fused(mel), stock_model(mel), rtol=1e-4, atol=1e-5)


def test_kernel_equals_the_stock_activation_in_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = "import sys; sys.path.insert(0, sys.argv[1]); import test_bigvgan_fused as t; t.check_on('cpu')"
    done = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(__file__)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_polyphase_taps_of_the_released_filter() -> None:
    """Ratio 2, 12 taps: each output phase is 6 taps; even outputs read x[m-3 .. m+2], odd ones
    x[m-2 .. m+3] (the weights are twice the filter's odd, resp. even taps)."""
    taps = [float(i) for i in range(12)]
    even, odd = _phases(taps, ratio=2, pad=5, pad_left=15)
    assert even == [(2.0 * (2 * j + 1), 2 - j) for j in range(6)]
    assert odd == [(2.0 * (2 * j), 3 - j) for j in range(6)]


def test_other_filters_stay_stock() -> None:
    snake = Qwen2_5OmniSnakeBeta(4)
    odd_sized = Qwen2_5OmniAntiAliasedActivation1d(snake, up_kernel_size=8, down_kernel_size=8)
    with pytest.raises(ValueError, match="12-tap"):
        FusedAntiAliasedSnake(odd_sized)


def test_without_triton_every_activation_stays_stock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    model = _small_bigvgan()
    assert fuse_activations(model) == 0
    assert sum(isinstance(m, Qwen2_5OmniAntiAliasedActivation1d) for m in model.modules()) == 2 * 2 * 6 + 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel runs on CUDA (device machine)")
def test_kernel_equals_the_stock_activation_on_cuda() -> None:
    check_on("cuda")
    stock = _stock(768, 0, "cuda")  # the released first stage's width, a batch of 16 steady windows
    x = torch.randn(16, 768, 550, device="cuda") * 3
    with torch.no_grad():
        torch.testing.assert_close(FusedAntiAliasedSnake(stock)(x), stock(x), rtol=1e-4, atol=1e-4)
