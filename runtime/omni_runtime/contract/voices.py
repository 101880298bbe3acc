"""Voice names: the model's own speakers, and OpenAI's voice names mapped onto them (one definition).

Clients written for the OpenAI API ask for OpenAI's voices (``alloy``, ``echo``, ...). Each OpenAI
name stands for a speaking style; it maps to the model's first speaker of that style, or to the
model's default speaker when it has none of that style. The model's own speaker names work as they
are (case does not matter). Anything else is refused with the list of the model's speakers.
Chat completions, realtime sessions and streaming input all resolve voices with `resolve_voice`.

| OpenAI voices | Qwen2.5-Omni / Qwen3-Omni speaker |
|---|---|
| alloy, coral, marin, nova, sage, shimmer | Chelsie |
| ash, ballad, cedar, echo, fable, onyx, verse | Ethan (then Qwen3's Aiden) |
"""

from __future__ import annotations

from typing import Literal

Style = Literal["female", "male"]

OPENAI_VOICES: dict[str, Style] = {
    "alloy": "female",
    "ash": "male",
    "ballad": "male",
    "cedar": "male",
    "coral": "female",
    "echo": "male",
    "fable": "male",
    "marin": "female",
    "nova": "female",
    "onyx": "male",
    "sage": "female",
    "shimmer": "female",
    "verse": "male",
}

# Speakers of the model families we serve, by style, in order of preference.
SPEAKERS_BY_STYLE: dict[Style, tuple[str, ...]] = {
    "female": ("Chelsie",),
    "male": ("Ethan", "Aiden"),
}


class UnknownVoice(ValueError):
    """A voice that is neither one of the model's speakers nor an OpenAI voice name."""


def resolve_voice(requested: str | None, *, voices: tuple[str, ...], default: str | None) -> str | None:
    """The model speaker to use for ``requested`` (None: the default speaker).

    ``voices`` are the model's speakers; when they are not known here (empty: the talker runs
    elsewhere, or the worker serves text only) OpenAI names mean the default and other names pass
    through for the talker to check.
    """
    if requested is None:
        return default
    style = OPENAI_VOICES.get(requested.lower())
    if not voices:
        return None if style is not None else requested
    if requested in voices:
        return requested
    by_lower = {voice.lower(): voice for voice in voices}
    if requested.lower() in by_lower:
        return by_lower[requested.lower()]
    if style is not None:
        preferred = next((speaker for speaker in SPEAKERS_BY_STYLE[style] if speaker in voices), None)
        return preferred or default or voices[0]
    raise UnknownVoice(f"unknown voice {requested!r}; available: {', '.join(voices)}")
