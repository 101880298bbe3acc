"""A realtime session's conversation: ordered items that become the engine's chat turns.

The session keeps every committed user utterance and every assistant reply, so the model sees
earlier turns on each response (the protocol's promise) without the client re-sending them. User
audio is kept as decoded 16 kHz samples; assistant audio is not kept at all, only its transcript
and its length, because the model hears its own replies as text. What an assistant item puts into
history is cut to the audio the client actually played (`conversation.item.truncate` or the duplex
`playback.ack`): the transcript is trimmed in proportion to the played audio, at a word boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from omni_runtime.contract.engine import ChatTurn, MediaInput
from omni_runtime.realtime.audio import MODEL_RATE, float_to_b64_pcm16
from omni_runtime.realtime.errors import ITEM_NOT_FOUND, ProtocolError

Role = Literal["user", "assistant", "system"]
# Rough token costs, only to keep the history inside the model's context window.
_CHARS_PER_TOKEN = 4
_AUDIO_TOKENS_PER_SECOND = 25
_IMAGE_TOKENS = 256


@dataclass
class Part:
    type: str  # input_text | input_audio | input_image | output_text | output_audio
    text: str = ""  # input_text / output_text
    transcript: str = ""  # input_audio / output_audio
    audio: np.ndarray | None = None  # input_audio: float32 at 16 kHz
    image: np.ndarray | None = None  # input_image: RGB uint8
    audio_ms: int = 0  # output_audio: length generated


@dataclass
class Item:
    id: str
    role: Role
    content: list[Part] = field(default_factory=list)
    status: Literal["completed", "incomplete", "in_progress"] = "completed"
    played_ms: int | None = None  # assistant audio the client played; None means all of it

    def output_audio_ms(self) -> int:
        return sum(part.audio_ms for part in self.content if part.type == "output_audio")

    def history_text(self) -> str:
        """The text this item contributes to the model's context."""
        pieces: list[str] = []
        for part in self.content:
            if part.type in ("input_text", "output_text"):
                pieces.append(part.text)
            elif part.type == "output_audio":
                pieces.append(
                    trim_to_played(part.transcript, played_ms=self.played_ms, total_ms=part.audio_ms)
                )
            elif part.type == "input_audio" and part.audio is None:
                pieces.append(part.transcript)
        return " ".join(piece for piece in pieces if piece)

    def chat_turn(self) -> ChatTurn | None:
        """The engine's turn for this item (None: it contributes nothing to the context)."""
        text, media = self.history_text(), self.media()
        return ChatTurn(role=self.role, text=text, media=media) if text or media else None

    def media(self) -> tuple[MediaInput, ...]:
        out: list[MediaInput] = []
        for part in self.content:
            if part.type == "input_audio" and part.audio is not None and part.audio.size:
                out.append(MediaInput(kind="audio", data=part.audio, sample_rate=MODEL_RATE))
            elif part.type == "input_image" and part.image is not None:
                out.append(MediaInput(kind="image", data=part.image))
        return tuple(out)

    def token_estimate(self) -> int:
        tokens = len(self.history_text()) // _CHARS_PER_TOKEN + 4
        for part in self.content:
            if part.audio is not None:
                tokens += int(part.audio.size / MODEL_RATE * _AUDIO_TOKENS_PER_SECOND)
            if part.image is not None:
                tokens += _IMAGE_TOKENS
        return tokens

    def to_json(self, *, with_audio: bool = False, input_rate: int = MODEL_RATE) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        for part in self.content:
            entry: dict[str, Any] = {"type": part.type}
            if part.type in ("input_text", "output_text"):
                entry["text"] = part.text
            elif part.type == "input_audio":
                entry["transcript"] = part.transcript or None
                if with_audio and part.audio is not None:
                    from omni_runtime.media.resample import resample

                    entry["audio"] = float_to_b64_pcm16(
                        resample(part.audio, orig_sr=MODEL_RATE, target_sr=input_rate)
                    )
            elif part.type == "output_audio":
                # What the model will see: the transcript cut to the played audio.
                entry["transcript"] = trim_to_played(
                    part.transcript, played_ms=self.played_ms, total_ms=part.audio_ms
                )
            elif part.type == "input_image":
                entry["image_url"] = None  # images are not echoed back
            content.append(entry)
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "role": self.role,
            "status": self.status,
            "content": content,
        }


def trim_to_played(text: str, *, played_ms: int | None, total_ms: int) -> str:
    """The part of ``text`` spoken in the first ``played_ms`` of ``total_ms`` of audio.

    The engine does not (yet) report which characters each audio chunk speaks, so the cut is
    proportional, moved back to the last word boundary; nothing played means nothing kept.
    """
    if played_ms is None or total_ms <= 0 or played_ms >= total_ms:
        return text
    if played_ms <= 0:
        return ""
    cut = int(len(text) * played_ms / total_ms)
    head = text[:cut]
    if cut < len(text) and not text[cut].isspace() and " " in head:
        head = head[: head.rindex(" ")]
    return head.rstrip()


class Conversation:
    def __init__(self, *, max_items: int) -> None:
        self.items: list[Item] = []
        self.max_items = max_items
        self._windows: dict[str, str] = {}  # sticky context window name -> its first item's id

    def get(self, item_id: str) -> Item:
        for item in self.items:
            if item.id == item_id:
                return item
        raise ProtocolError(
            f"no conversation item with id '{item_id}' (it was never created or was deleted)",
            code=ITEM_NOT_FOUND,
            param="item_id",
        )

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def add(self, item: Item, *, previous_item_id: str | None = None) -> str | None:
        """Insert after ``previous_item_id`` ("root" = first; None = last); returns the id before it."""
        if previous_item_id is None:
            before = self.last_id()
            self.items.append(item)
        elif previous_item_id == "root":
            before = None
            self.items.insert(0, item)
        else:
            index = self.items.index(self.get(previous_item_id))
            before = previous_item_id
            self.items.insert(index + 1, item)
        # Past the item cap the oldest items leave the context (the client keeps its own copy).
        while len(self.items) > self.max_items:
            self.items.pop(0)
        return before

    def delete(self, item_id: str) -> None:
        self.items.remove(self.get(item_id))

    def turns(
        self,
        *,
        instructions: str,
        exclude: str | None = None,
        token_budget: int,
        window: str | None = None,
    ) -> tuple[ChatTurn, ...]:
        """Chat turns for the engine: instructions first, then items, oldest dropped past the budget.

        ``window`` names a sticky context window (one per kind of request: responses, duplex
        probes): its first item stays first for as long as everything after it fits, and when the
        budget runs out the window moves on to half the budget at once. The engine keeps a
        session's KV for the prompt prefix that does not change (conversation KV), so a window
        that slid by one item every turn would change the prefix right after the instructions and
        cost a full prefill each turn; moving it rarely keeps turns cheap between the moves.
        """
        items = [i for i in self.items if i.id != exclude and i.status != "in_progress"]
        budget = token_budget - len(instructions) // _CHARS_PER_TOKEN
        sticky = None
        if window is not None and (first := self._windows.get(window)) is not None:
            sticky = next((k for k, item in enumerate(items) if item.id == first), None)
        start = window_start([item.token_estimate() for item in items], budget=budget, sticky=sticky)
        if window is not None and items:
            self._windows[window] = items[start].id
        turns: list[ChatTurn] = []
        if instructions:
            turns.append(ChatTurn(role="system", text=instructions))
        turns.extend(turn for item in items[start:] if (turn := item.chat_turn()) is not None)
        return tuple(turns)


def window_start(costs: list[int], *, budget: int, sticky: int | None, refill: float = 0.5) -> int:
    """Index of the first item in the context window (the newest item is always in).

    Without a sticky start (none yet, or its item was deleted) every item fits or the window
    starts where the newest items fill at most the budget; with one, the window keeps it while
    the items from it fit, and otherwise starts where they fill at most ``refill`` of the budget.
    """
    if not costs:
        return 0
    tail = [0] * (len(costs) + 1)  # tail[i]: the cost of items i.. to the end
    for i in range(len(costs) - 1, -1, -1):
        tail[i] = tail[i + 1] + costs[i]
    if sticky is not None and tail[sticky] <= budget:
        return sticky
    limit = budget if sticky is None else budget * refill
    return next((i for i in range(len(costs)) if tail[i] <= limit), len(costs) - 1)
