"""Handlers of the conversation-item client events of a realtime session.

``conversation.item.create|delete|truncate|retrieve`` and the duplex ``playback.ack`` (the client's
playback position of an assistant item, which decides how much of it stays in history when the
user barges in). Each takes the session and the event and raises ProtocolError for client mistakes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omni_runtime.realtime.errors import invalid, missing
from omni_runtime.realtime.session.items import parse_item

if TYPE_CHECKING:
    from omni_runtime.realtime.session.session import RealtimeSession


async def playback_ack(session: RealtimeSession, event: dict[str, Any]) -> None:
    item_id, played = event.get("item_id"), event.get("audio_end_ms")
    if not isinstance(item_id, str):
        raise missing("item_id", where="playback.ack")
    if isinstance(played, bool) or not isinstance(played, int) or played < 0:
        raise invalid("audio_end_ms", "expected the played position in milliseconds (an integer >= 0)")
    session.conversation.get(item_id)
    session.acks[item_id] = played


# --- conversation items -----------------------------------------------------------------


async def item_create(session: RealtimeSession, event: dict[str, Any]) -> None:
    if "item" not in event:
        raise missing("item", where="conversation.item.create")
    item = await parse_item(
        event["item"],
        input_rate=session.config.input_rate,
        max_bytes=session.settings.max_event_bytes,
        media_limits=session.settings.media_limits,
        existing={existing.id for existing in session.conversation.items},
    )
    previous_id = event.get("previous_item_id")
    if previous_id is not None and not isinstance(previous_id, str):
        raise invalid("previous_item_id", "expected an item id or 'root'")
    previous = session.conversation.add(item, previous_item_id=previous_id)
    session.announce_item(item, previous)


async def item_delete(session: RealtimeSession, event: dict[str, Any]) -> None:
    item_id = event.get("item_id")
    if not isinstance(item_id, str):
        raise missing("item_id", where="conversation.item.delete")
    if session.response is not None and session.response.item.id == item_id:
        raise invalid("item_id", "the item belongs to the response in progress; cancel the response first")
    session.conversation.delete(item_id)
    session.outbox.emit("conversation.item.deleted", item_id=item_id)


async def item_truncate(session: RealtimeSession, event: dict[str, Any]) -> None:
    item_id, end_ms = event.get("item_id"), event.get("audio_end_ms")
    if not isinstance(item_id, str):
        raise missing("item_id", where="conversation.item.truncate")
    if isinstance(end_ms, bool) or not isinstance(end_ms, int) or end_ms < 0:
        raise invalid("audio_end_ms", "expected milliseconds of audio to keep (an integer >= 0)")
    item = session.conversation.get(item_id)
    if item.role != "assistant" or not any(part.type == "output_audio" for part in item.content):
        raise invalid("item_id", "only an assistant message with audio can be truncated")
    total = item.output_audio_ms()
    in_progress = session.response is not None and session.response.item is item
    if end_ms > total and not in_progress:
        raise invalid("audio_end_ms", f"{end_ms} ms is past the end of the item's audio ({total} ms)")
    item.played_ms = end_ms
    content_index = event.get("content_index", 0)
    session.outbox.emit(
        "conversation.item.truncated", item_id=item_id, content_index=content_index, audio_end_ms=end_ms
    )


async def item_retrieve(session: RealtimeSession, event: dict[str, Any]) -> None:
    item_id = event.get("item_id")
    if not isinstance(item_id, str):
        raise missing("item_id", where="conversation.item.retrieve")
    item = session.conversation.get(item_id)
    session.outbox.emit(
        "conversation.item.retrieved",
        item=item.to_json(with_audio=True, input_rate=session.config.input_rate),
    )
