"""vLLM-Omni's session-based streaming audio dialect of ``/v1/realtime`` (the "transcription" protocol).

Clients written against vLLM's realtime connection (and vLLM-Omni's subclass of it) speak a flat,
smaller protocol than the OpenAI Realtime API: ``session.update`` with a top-level ``model``, a first
``input_audio_buffer.commit`` that starts the stream, PCM16 appends at 16 kHz, and a last
``input_audio_buffer.commit`` with ``final: true``; the server answers with ``transcription.delta``
and ``transcription.done`` (with usage), plus vLLM-Omni's ``response.output_audio.*`` events when
audio output is asked for. `dialect` decides which protocol a socket speaks, `events` parses this
one's client events, `session` runs it on the engine.
"""
