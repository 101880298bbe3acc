"""Image decoding to RGB uint8, with the pixel cap enforced before pixels are decoded."""

from __future__ import annotations

import io

import numpy as np
import pytest
from media_synth import encode_png
from PIL import Image

from omni_runtime.media import MediaError, MediaLimits, decode_image
from omni_runtime.media.errors import IMAGE_TOO_LARGE, INVALID_MEDIA

LIMITS = MediaLimits()


def test_png_decodes_to_exact_rgb_pixels() -> None:
    pixels = np.zeros((4, 6, 3), dtype=np.uint8)
    pixels[:, :3] = (255, 0, 0)
    pixels[:, 3:] = (0, 0, 255)
    out = decode_image(encode_png(pixels), limits=LIMITS)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, pixels)


@pytest.mark.parametrize("mode", ["RGBA", "L", "P"])
def test_other_modes_become_rgb(mode: str) -> None:
    buffer = io.BytesIO()
    Image.new(mode, (5, 3)).save(buffer, format="PNG")
    assert decode_image(buffer.getvalue(), limits=LIMITS).shape == (3, 5, 3)


def test_jpeg_decodes() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 8), (10, 200, 30)).save(buffer, format="JPEG", quality=95)
    out = decode_image(buffer.getvalue(), limits=LIMITS)
    assert out.shape == (8, 16, 3)
    assert np.abs(out.astype(int) - [10, 200, 30]).max() <= 3


def test_pixel_cap_names_size_and_flag() -> None:
    data = encode_png(np.zeros((20, 30, 3), dtype=np.uint8))
    with pytest.raises(MediaError) as caught:
        decode_image(data, limits=MediaLimits(max_image_pixels=599))
    assert caught.value.code == IMAGE_TOO_LARGE
    assert str(caught.value) == (
        "the image is 30x20 = 600 pixels; this worker accepts at most 599 (downscale it, or raise --max-image-pixels)"
    )
    assert decode_image(data, limits=MediaLimits(max_image_pixels=600)).shape == (20, 30, 3)


@pytest.mark.parametrize(("width", "height"), [(201, 1), (1, 201), (3000, 14)])
def test_a_side_over_200_times_the_other_is_refused_naming_the_ratio(width: int, height: int) -> None:
    with pytest.raises(MediaError) as caught:
        decode_image(encode_png(np.zeros((height, width, 3), dtype=np.uint8)), limits=LIMITS)
    assert caught.value.code == INVALID_MEDIA
    assert str(caught.value) == (
        f"the image is {width}x{height}, a side over 200 times the other; the model's vision processor takes at "
        "most 200:1 (crop or pad it)"
    )


def test_a_side_200_times_the_other_decodes() -> None:
    assert decode_image(encode_png(np.zeros((1, 200, 3), dtype=np.uint8)), limits=LIMITS).shape == (1, 200, 3)


@pytest.mark.parametrize("data", [b"", b"\x89PNG\r\n\x1a\n truncated", b"GIF89a-nope"])
def test_unreadable_image_is_invalid_media(data: bytes) -> None:
    with pytest.raises(MediaError) as caught:
        decode_image(data, limits=LIMITS)
    assert caught.value.code == INVALID_MEDIA
    assert caught.value.status == 400
