"""Malformed fields in every client event of the OpenAI dialect (and duplex): never an escape.

Each event type starts from a well-formed template; every field (at every depth) is replaced by
each hostile value in turn. Whatever the value, the session answers (an ``error`` naming what is
wrong, or the event's own reply when the value happens to be acceptable), nothing escapes
``handle_text``, and afterwards the session still does its job: a ``session.update`` is applied
and a text response runs to ``response.done``.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest

HOSTILE: list[Any] = [None, True, -1, 7, 1e308, "", "x" * 300, [], {}, [[[[]]]], {"a": {"b": {}}}, "\ud800"]

TEMPLATES: dict[str, dict[str, Any]] = {
    "session.update": {
        "session": {
            "type": "realtime",
            "instructions": "Be brief.",
            "output_modalities": ["text"],
            "max_output_tokens": 8,
            "audio": {
                "input": {"turn_detection": None, "format": {"type": "audio/pcm", "rate": 24000}},
                "output": {"voice": "Chelsie"},
            },
        }
    },
    "input_audio_buffer.append": {"audio": "AAAAAAAA"},
    "input_audio_buffer.commit": {},
    "input_audio_buffer.clear": {},
    "conversation.item.create": {
        "previous_item_id": None,
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    },
    "conversation.item.retrieve": {"item_id": "item_missing"},
    "conversation.item.truncate": {"item_id": "item_missing", "content_index": 0, "audio_end_ms": 0},
    "conversation.item.delete": {"item_id": "item_missing"},
    "response.create": {"response": {"output_modalities": ["text"], "max_output_tokens": 4}},
    "response.cancel": {"response_id": "resp_missing"},
    "playback.ack": {"item_id": "item_missing", "audio_end_ms": 5},
}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every field path of a template, containers and leaves."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*prefix, key)
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield (*prefix, index)
            yield from _paths(inner, (*prefix, index))


def _replaced(template: dict[str, Any], path: tuple[Any, ...], bad: Any) -> dict[str, Any]:
    event = copy.deepcopy(template)
    target: Any = event
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = bad
    return event


def _cases() -> Iterator[tuple[str, dict[str, Any]]]:
    for kind, template in TEMPLATES.items():
        yield kind, {"type": kind, **template}
        for path in _paths(template):
            for bad in HOSTILE:
                yield kind, {"type": kind, **_replaced(template, path, bad)}
        for bad in HOSTILE:  # the event's own identity fields
            yield kind, {"type": kind, "event_id": bad, **template}


CASES = list(_cases())


@pytest.mark.parametrize("duplex", [False, True], ids=["realtime", "duplex"])
async def test_every_malformed_event_is_answered_and_the_session_goes_on(make_driver, duplex: bool) -> None:
    driver = await make_driver(duplex=duplex)
    driver.drain()
    silent: list[tuple[str, dict[str, Any]]] = []
    for kind, event in CASES:
        before = len(driver.events)
        await driver.send(event)  # an escaping exception fails the test here
        driver.drain()
        started = kind == "response.create" and driver.session.response is not None  # replies come later
        if (
            len(driver.events) == before
            and not started
            and kind not in ("input_audio_buffer.clear", "playback.ack")
        ):
            silent.append((kind, event))
        if driver.session.response is not None:  # a response the fuzz started: let it end
            await driver.send({"type": "response.cancel"})
    # Only events whose reply may be nothing at all stay silent: a well-formed append (OpenAI
    # acknowledges none), a commit in duplex, a clear, an ack. Every malformed case said something.
    wrong = [
        c
        for c in silent
        if c[0] != "input_audio_buffer.commit"
        and not (c[0] == "input_audio_buffer.append" and c[1].get("audio") in (TEMPLATES[c[0]]["audio"], ""))
        and not (
            c[0] == "response.cancel" and c[1].get("response_id") is None
        )  # as if absent: nothing to cancel
    ]
    assert not wrong, wrong[:5]

    # Still usable: once any response the fuzz started has ended, an update is applied and a
    # text response runs to its end.
    for _ in range(500):
        if driver.session.response is None:
            break
        await asyncio.sleep(0.01)
    assert driver.session.response is None, "a cancelled response never ended"
    driver.drain()
    driver.cursor = len(driver.events)
    await driver.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "instructions": "Say hi.", "output_modalities": ["text"]},
        }
    )
    await driver.until("session.updated")
    await driver.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        }
    )
    await driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    usable_from = driver.cursor
    done = await driver.until("response.done")
    assert not [e for e in driver.events[usable_from:] if e["type"] == "error"]
    assert done["response"]["status"] in ("completed", "incomplete"), done


async def test_a_cancel_before_the_response_first_runs_still_ends_it(make_driver) -> None:
    """create and cancel handled back to back (no await between): the response's task never ran."""
    driver = await make_driver()
    await driver.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        }
    )
    await driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    await driver.send({"type": "response.cancel"})
    first = await driver.until("response.done")
    assert first["response"]["status"] == "cancelled"
    assert driver.session.response is None
    await driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    second = await driver.until("response.done")
    assert second["response"]["status"] in ("completed", "incomplete")
    assert second["response"]["id"] != first["response"]["id"]


async def test_json_nested_too_deep_to_parse_is_an_error_event(make_driver) -> None:
    driver = await make_driver()
    driver.drain()
    await driver.send('{"type": "session.update", "session": ' + "[" * 100_000 + "]" * 100_000 + "}")
    error = await driver.until("error")
    assert error["error"]["code"] == "invalid_json"
