"""Streaming-input sessions: one user turn uploaded in numbered chunks, answered as a chat completion.

`session.StreamingInputSession` assembles chunks in order and generates once input ends; `models`
are the request bodies; `chat_format` the chat-completion JSON and SSE it answers with; `manager`
holds a worker's sessions within its limits. The HTTP side (routes, request parsing, error JSON)
lives in `omni_runtime.api.streaming_input`.
"""
