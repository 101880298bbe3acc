"""The client the real-node tests run, with the `openai` package, against a router URL.

Run inside the client pod (`python - URL < node_client.py`: the script travels on stdin, so the
client image needs nothing of this repository) and from the test process itself (imported).
Each call returns a JSON-able summary of what the server answered; the tests assert on it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import sys
from typing import Any

from openai import AsyncOpenAI, OpenAI

HELLO = [{"role": "user", "content": "Say hello."}]
SHORT_SPEECH = {"talker": {"max_tokens": 40}}  # codec tokens: under a second of audio


def wav_rate(data: bytes) -> int:
    return int(struct.unpack("<I", data[24:28])[0])


def chat(base_url: str) -> dict[str, Any]:
    """Text, then SSE speech, through the chat completions API."""
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    text = client.chat.completions.create(model=model, messages=HELLO, max_tokens=8)  # type: ignore[arg-type]
    stream = client.chat.completions.create(
        model=model,
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=6,
        stream=True,
        modalities=["text", "audio"],
        audio={"voice": "Chelsie", "format": "wav"},  # type: ignore[typeddict-item]
        extra_body={"stage_params": SHORT_SPEECH},
    )
    audio = [c.choices[0].delta.audio for c in stream if c.choices and c.choices[0].delta.audio]
    rates = sorted({wav_rate(base64.b64decode(a.data)) for a in audio if a.data})
    return {
        "model": model,
        "text": text.choices[0].message.content,
        "completion_tokens": text.usage.completion_tokens if text.usage else 0,
        "sse_audio_chunks": len(audio),
        "sse_audio_ids": len({a.id for a in audio}),
        "sse_rates": rates,
    }


async def realtime_turn(conn: Any, *, modality: str = "audio", tokens: int = 4) -> dict[str, Any]:
    """One user message and one response on an open realtime connection."""
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi there."}]}
    )
    await conn.response.create(response={"output_modalities": [modality], "max_output_tokens": tokens})
    audio_bytes, types = 0, []
    async for event in conn:
        types.append(event.type)
        if event.type == "response.output_audio.delta":
            audio_bytes += len(base64.b64decode(event.delta))
        elif event.type == "error":
            return {"status": "error", "error": event.error.message, "types": types}
        elif event.type == "response.done":
            return {"status": event.response.status, "audio_bytes": audio_bytes, "types": types}
    return {"status": "closed", "types": types}


async def realtime(base_url: str) -> dict[str, Any]:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    model = (await client.models.list()).data[0].id
    async with client.realtime.connect(model=model) as conn:
        return await realtime_turn(conn)


if __name__ == "__main__":
    url = sys.argv[1]
    print(json.dumps({"chat": chat(url), "realtime": asyncio.run(realtime(url))}), flush=True)
