"""Image decoding: any format Pillow reads → RGB uint8 array, with the pixel cap checked first.

Pillow reads the header lazily, so the size is known before the pixels are decoded: an image
over the cap is refused without allocating it (decompression bombs included). EXIF orientation
is applied, so a phone photo reaches the model the right way up.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from omni_runtime.media.errors import IMAGE_TOO_LARGE, INVALID_MEDIA, MediaError
from omni_runtime.media.limits import MediaLimits

# The served families' vision processors (Qwen2-VL's smart_resize, in Qwen2.5- and Qwen3-Omni)
# refuse a longer side over 200 times the shorter one.
MAX_ASPECT_RATIO = 200


def decode_image(data: bytes, *, limits: MediaLimits) -> np.ndarray:
    """Decode image bytes to an H x W x 3 uint8 RGB array; raises MediaError when unreadable or too big."""
    if not data:
        raise MediaError("the image is empty (0 bytes)", code=INVALID_MEDIA)
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > limits.max_image_pixels:
                raise _too_large(width, height, limits)
            if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
                raise MediaError(
                    f"the image is {width}x{height}, a side over {MAX_ASPECT_RATIO} times the other; the "
                    f"model's vision processor takes at most {MAX_ASPECT_RATIO}:1 (crop or pad it)",
                    code=INVALID_MEDIA,
                )
            img.load()
            oriented = ImageOps.exif_transpose(img) or img
            rgb = oriented.convert("RGB")
    except Image.DecompressionBombError as exc:
        raise MediaError(
            f"the image is too large to decode safely ({exc})", code=IMAGE_TOO_LARGE, status=400
        ) from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        # Pillow raises OSError for truncated data and SyntaxError from some format parsers.
        raise MediaError(
            "the image could not be decoded: not a supported image (send PNG, JPEG, WebP, GIF or BMP)",
            code=INVALID_MEDIA,
        ) from exc
    return np.asarray(rgb, dtype=np.uint8)


def _too_large(width: int, height: int, limits: MediaLimits) -> MediaError:
    return MediaError(
        f"the image is {width}x{height} = {width * height} pixels; this worker accepts at most "
        f"{limits.max_image_pixels} (downscale it, or raise --max-image-pixels)",
        code=IMAGE_TOO_LARGE,
    )
