"""`conversation.item.create` bodies → conversation items (GA and beta content shapes).

User content: ``input_text`` {text}, ``input_audio`` {audio: base64 PCM16 at the session's input
rate, transcript}, ``input_image`` {image_url: data URI}. Assistant content: ``output_text`` /
``text`` {text}, ``output_audio`` / ``audio`` {transcript} (a client-supplied assistant turn is
history, so only its words matter). System content: ``input_text`` / ``text``.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread

from omni_runtime.media.errors import MediaError
from omni_runtime.media.image import decode_image
from omni_runtime.media.limits import MediaLimits
from omni_runtime.media.resample import resample
from omni_runtime.media.sources import decode_data_uri
from omni_runtime.realtime.audio import MODEL_RATE, decode_b64, pcm16_to_float
from omni_runtime.realtime.errors import INVALID_MEDIA, ProtocolError, invalid
from omni_runtime.realtime.protocol import new_id
from omni_runtime.realtime.request_types import check_text
from omni_runtime.realtime.session.conversation import Item, Part

_TEXT_TYPES = {
    "user": ("input_text", "text"),
    "system": ("input_text", "text"),
    "assistant": ("output_text", "text"),
}


def _text_of(part: dict[str, Any], param: str, max_chars: int) -> str:
    text = part.get("text", part.get("transcript"))
    if not isinstance(text, str):
        raise invalid(f"{param}.text", "expected a string")
    return check_text(text, param=f"{param}.text", max_chars=max_chars)


async def parse_item(
    body: Any,
    *,
    input_rate: int,
    max_bytes: int,
    max_text_chars: int,
    media_limits: MediaLimits,
    existing: set[str],
) -> Item:
    if not isinstance(body, dict):
        raise invalid("item", "expected an object")
    kind = body.get("type", "message")
    if kind != "message":
        raise invalid("item.type", f"{kind!r} items are not supported (tools are not served); use 'message'")
    role = body.get("role")
    if role not in ("user", "assistant", "system"):
        raise invalid("item.role", "expected 'user', 'assistant' or 'system'")
    item_id = body.get("id") or new_id("item")
    if not isinstance(item_id, str) or item_id in existing:
        raise invalid(
            "item.id", f"{item_id!r} is already in the conversation; leave id out or pick a new one"
        )
    content = body.get("content")
    if not isinstance(content, list) or not content:
        raise invalid("item.content", "expected a non-empty list of content parts")
    parts: list[Part] = []
    for index, raw in enumerate(content):
        param = f"item.content[{index}]"
        if not isinstance(raw, dict):
            raise invalid(param, "expected an object")
        part_type = raw.get("type")
        if part_type in _TEXT_TYPES[role]:
            parts.append(Part(type=_TEXT_TYPES[role][0], text=_text_of(raw, param, max_text_chars)))
        elif role == "assistant" and part_type in ("output_audio", "audio"):
            parts.append(Part(type="output_text", text=_text_of(raw, param, max_text_chars)))
        elif role == "user" and part_type == "input_audio":
            parts.append(
                _audio_part(
                    raw, param=param, input_rate=input_rate, max_bytes=max_bytes, max_chars=max_text_chars
                )
            )
        elif role == "user" and part_type == "input_image":
            parts.append(await _image_part(raw, param=param, limits=media_limits))
        else:
            raise invalid(f"{param}.type", f"{part_type!r} is not a content type for a {role} message")
    return Item(id=item_id, role=role, content=parts)


def _audio_part(raw: dict[str, Any], *, param: str, input_rate: int, max_bytes: int, max_chars: int) -> Part:
    transcript = raw.get("transcript") or ""
    if not isinstance(transcript, str):
        raise invalid(f"{param}.transcript", "expected a string")
    check_text(transcript, param=f"{param}.transcript", max_chars=max_chars)
    if "audio" not in raw or raw["audio"] is None:
        if not transcript:
            raise invalid(f"{param}.audio", "input_audio needs base64 PCM16 audio (or a transcript)")
        return Part(type="input_audio", transcript=str(transcript))
    pcm = pcm16_to_float(
        decode_b64(raw["audio"], param=f"{param}.audio", max_bytes=max_bytes), param=f"{param}.audio"
    )
    return Part(
        type="input_audio",
        audio=resample(pcm, orig_sr=input_rate, target_sr=MODEL_RATE),
        transcript=str(transcript),
    )


async def _image_part(raw: dict[str, Any], *, param: str, limits: MediaLimits) -> Part:
    url = raw.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str) or not url.startswith("data:"):
        raise invalid(f"{param}.image_url", "expected the image as a data: URI (data:image/png;base64,...)")
    try:
        data = decode_data_uri(url, limits=limits)
        image = await anyio.to_thread.run_sync(lambda: decode_image(data, limits=limits))
    except MediaError as exc:
        raise ProtocolError(
            f"{param}.image_url: {exc.message}",
            code=INVALID_MEDIA,
            param=f"{param}.image_url",
            status=exc.status,
        ) from exc
    return Part(type="input_image", image=image)
