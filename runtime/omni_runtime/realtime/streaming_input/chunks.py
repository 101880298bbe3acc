"""A chunk's bytes: decoded, checked against the session's payload cap, its modality settled.

Cheap checks happen here, on the chunk's own request, so a client hears about a bad chunk (bad
base64, odd PCM16, non-UTF-8 text, past the cap) in that chunk's answer, with the field named.
Decoding media (images, frames) happens later, in sequence order (`assembly`).
"""

from __future__ import annotations

from omni_runtime.realtime.audio import decode_b64
from omni_runtime.realtime.errors import PAYLOAD_TOO_LARGE, ProtocolError, invalid
from omni_runtime.realtime.streaming_input.models import Chunk, Modality, infer_modality


def over_cap(param: str, *, total: int, cap: int) -> ProtocolError:
    return ProtocolError(
        f"this chunk would bring the session to {total} bytes; a session may carry at most {cap}, so the "
        "session is closed (send less, or split the input into sessions)",
        code=PAYLOAD_TOO_LARGE,
        param=param,
        status=413,
    )


def chunk_bytes(chunk: Chunk, *, received: int, cap: int) -> tuple[Modality, bytes, int | None]:
    """(modality, decoded payload, characters for a text chunk) of a chunk in a session that has
    ``received`` bytes of at most ``cap``."""
    param = f"{chunk.place}.payload"
    room = cap - received
    if chunk.payload is None:
        if chunk.modality not in (None, "text") or chunk.text is None:
            raise invalid(param, f"a {chunk.modality} chunk needs a base64 payload")
        raw = chunk.text.encode()
    else:
        estimate = len(chunk.payload) * 3 // 4
        if estimate - 2 > room:  # past the cap by its base64 length alone: refused before decoding
            raise over_cap(param, total=received + estimate, cap=cap)
        raw = decode_b64(chunk.payload, param=param, max_bytes=cap + 3)
    if len(raw) > room:
        raise over_cap(param, total=received + len(raw), cap=cap)
    modality = infer_modality(chunk, raw)
    if modality == "text":
        try:
            return modality, raw, len(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise invalid(param, "a text chunk must be UTF-8") from exc
    if modality == "audio" and len(raw) % 2:
        raise invalid(param, "audio chunks are PCM16: an even number of bytes")
    return modality, raw, None


class OffsetOrder:
    """Chunks placed by byte ``offset``: each waits until the bytes before it are in, then leaves
    (in order) to take the session's next sequence id. Overlaps and offsets inside what was already
    taken are refused, naming ``offset``; a repeated offset is a duplicate."""

    def __init__(self) -> None:
        self.waiting: dict[int, tuple[Modality, bytes, bool]] = {}
        self.seen: set[int] = set()
        self.next_offset = 0
        self.end_requested = False  # finish() came while bytes were missing

    def check(self, offset: int) -> None:
        if offset < self.next_offset:
            raise invalid(
                "offset", f"offset {offset} falls inside input already received (next: {self.next_offset})"
            )

    def add(self, offset: int, modality: Modality, raw: bytes, *, end: bool, place: str) -> None:
        if not raw:
            raise invalid(f"{place}.payload", "a chunk placed by offset needs a non-empty payload")
        for start, (_, data, _) in self.waiting.items():
            if offset < start + len(data) and start < offset + len(raw):
                raise invalid(
                    "offset",
                    f"bytes {offset}..{offset + len(raw)} overlap the chunk at offset {start} ({len(data)} bytes)",
                )
        self.seen.add(offset)
        self.waiting[offset] = (modality, raw, end)

    def pop_ready(self) -> tuple[Modality, bytes, bool] | None:
        """The chunk at the next offset, if it is in."""
        ready = self.waiting.pop(self.next_offset, None)
        if ready is not None:
            self.next_offset += len(ready[1])
        return ready
