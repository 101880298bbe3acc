"""The /v1/realtime socket (OpenAI Realtime, GA and beta), with duplex: barge-in, backchannels, resume.

`endpoint` serves the socket and keeps resumable duplex sessions; `session.RealtimeSession` is the
per-socket state machine, built from `config` (session.update), `conversation` and `items`
(history), `input_audio` with `turn_detection` (server VAD; `vad` is silero, the one module of
the realtime package that imports torch, and only when a session turns server VAD on) and
`response` (one assistant reply).
"""
