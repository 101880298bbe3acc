"""BigVGAN's anti-aliased activation as one stencil equals transformers' modules (float rounding)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2_5OmniToken2WavBigVGANModel
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniBigVGANConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniAntiAliasedActivation1d,
    Qwen2_5OmniSnakeBeta,
)

from omni_runtime.models.qwen2_5_omni.bigvgan import FusedAntiAliasedSnake, _phases, fuse_activations


@pytest.mark.parametrize(
    ("batch", "channels", "length"),
    [(1, 8, 1), (2, 8, 2), (3, 16, 37), (1, 4, 200), (2, 1, 7)],
)
def test_stencil_equals_the_stock_activation(batch: int, channels: int, length: int) -> None:
    torch.manual_seed(length)
    snake = Qwen2_5OmniSnakeBeta(channels)
    with torch.no_grad():  # trained-like parameters (the stock init is all zeros)
        snake.alpha.normal_(0, 0.5)
        snake.beta.normal_(0, 0.5)
    stock = Qwen2_5OmniAntiAliasedActivation1d(snake)
    x = torch.randn(batch, channels, length) * 3
    expected = stock(x)
    got = FusedAntiAliasedSnake(stock, compiled=False)(x)
    assert got.shape == expected.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_polyphase_taps_of_the_released_filter() -> None:
    """Ratio 2, 12 taps: each output phase is 6 taps; even outputs read x[m-3 .. m+2], odd ones
    x[m-2 .. m+3] (the weights are twice the filter's odd, resp. even taps)."""
    taps = [float(i) for i in range(12)]
    even, odd = _phases(taps, ratio=2, pad=5, pad_left=15)
    assert even == [(2.0 * (2 * j + 1), 2 - j) for j in range(6)]
    assert odd == [(2.0 * (2 * j), 3 - j) for j in range(6)]


def test_fused_bigvgan_equals_the_stock_model() -> None:
    config = Qwen2_5OmniBigVGANConfig(
        mel_dim=16,
        upsample_initial_channel=32,
        resblock_kernel_sizes=[3, 7],
        resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]],
        upsample_rates=[5, 3, 2],
        upsample_kernel_sizes=[11, 7, 4],
    )
    torch.manual_seed(0)
    stock = Qwen2_5OmniToken2WavBigVGANModel(config).eval()
    with torch.no_grad():
        for name, param in stock.named_parameters():
            if name.endswith(("alpha", "beta")):
                param.normal_(0, 0.3)
    fused = copy.deepcopy(stock)
    assert fuse_activations(fused, compiled=False) == 2 * 3 * 6 + 1  # 6 per AMP block, and the last
    assert not any(isinstance(m, Qwen2_5OmniAntiAliasedActivation1d) for m in fused.modules())
    mel = torch.randn(2, 16, 23)
    with torch.no_grad():
        torch.testing.assert_close(fused(mel), stock(mel), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the compiled stencils run on CUDA (device machine)"
)
def test_compiled_stencils_equal_the_stock_activation_on_cuda() -> None:
    torch.manual_seed(0)
    for channels, length, batch in [(768, 550, 16), (24, 13200, 2), (96, 1, 1), (48, 333, 3)]:
        snake = Qwen2_5OmniSnakeBeta(channels)
        with torch.no_grad():
            snake.alpha.normal_(0, 0.5)
            snake.beta.normal_(0, 0.5)
        stock = Qwen2_5OmniAntiAliasedActivation1d(snake).cuda()
        x = torch.randn(batch, channels, length, device="cuda") * 3
        with torch.no_grad():
            torch.testing.assert_close(
                FusedAntiAliasedSnake(stock, compiled=True)(x), stock(x), rtol=1e-4, atol=1e-4
            )
