"""Streaming input over HTTP: Mode B's session routes and Mode A's NDJSON chat body.

`routes` serves them and renders every error through `omni_runtime.api.errors`; `parsing` reads
bounded bodies and NDJSON frames. The sessions live in `omni_runtime.realtime.streaming_input`.
"""
