"""The listen/speak decision of a model-driven duplex session, and what playback puts into history.

Pure functions, so every rule is a table test. Once per unit of appended audio (``unit_ms``,
1 s by default) `decide_unit` says what the session does with that unit, in this order:

1. a response is already talking: nothing to decide (the overlap policy watches for barge-in);
2. the unit's index is below ``force_listen_count``: listen (the model must not answer off one
   second of partial audio);
3. the client marked the unit ``force_listen``: listen;
4. the detector hears the user speaking at the unit's end: listen (a turn is not over mid-word);
5. nothing new since the last response (server VAD heard no speech; without VAD, no audio):
   listen, without asking the model;
6. otherwise the model decides: its greedy next token after the pending user audio, as the
   assistant (`model_choice`). Ending its turn at once (end of sequence, no text), whitespace, or
   a listen marker means listen; any other token means it has something to say: speak.

Limits, stated plainly: the decision is the served thinker's own next-token choice, so it is only
as good as the model's sense of a finished turn (a random-weight test checkpoint nearly always
"speaks"); each probe prefills the whole conversation again (no KV reuse between units); and
rules 4 and 5 mean that with server VAD the model is only asked at pauses, never mid-speech.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Action = Literal["listen", "speak", "none"]
LISTEN_MARKERS = ("<|listen|>", "<listen>", "<|silence|>", "<|chunk_eos|>", "<|tts_pad|>", "...")


@dataclass(frozen=True)
class UnitState:
    index: int  # 0 for the session's first unit
    force_listen_count: int
    client_force_listen: bool
    user_speaking: bool
    new_input: bool  # speech (or, without VAD, audio) since the last response began
    response_active: bool


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    ask_model: bool = False  # True: the action is the model's to take (see `model_choice`)

    @property
    def model_listen(self) -> bool:
        return self.action == "listen" and self.reason == "model_listen"


def decide_unit(state: UnitState) -> Decision:
    """What the session does at the end of one unit, before the model is asked (rules 1-6)."""
    if state.response_active:
        return Decision("none", "speaking")
    if state.index < state.force_listen_count:
        return Decision("listen", "force_listen_count")
    if state.client_force_listen:
        return Decision("listen", "client_force_listen")
    if state.user_speaking:
        return Decision("listen", "user_speaking")
    if not state.new_input:
        return Decision("listen", "no_new_input")
    return Decision("speak", "model_speak", ask_model=True)


def model_choice(*, text: str, finish_reason: str) -> Decision:
    """Rule 6: the thinker's one greedy token after the pending user turn."""
    token = text.strip()
    if not token and finish_reason == "stop":
        return Decision("listen", "model_listen")  # it ended its turn without a word
    if not token or any(token.startswith(marker) for marker in LISTEN_MARKERS):
        return Decision("listen", "model_listen")
    return Decision("speak", "model_speak")


def played_for_history(*, acked_ms: int | None, client_acks: bool, estimate_ms: int, total_ms: int) -> int:
    """How much of an assistant item's audio enters history when its playback is cut short.

    The client's ``playback.ack`` is the authority: an acked position is kept as reported; a
    client that acks but has not acked this item yet has played none of it. A client that never
    sends ``playback.ack`` (a plain OpenAI client) gets the real-time estimate instead.
    """
    if acked_ms is not None:
        played = acked_ms
    elif client_acks:
        played = 0
    else:
        played = estimate_ms
    return max(0, min(played, total_ms))
