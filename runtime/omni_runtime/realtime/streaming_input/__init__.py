"""Streaming-input sessions: one user turn uploaded in numbered chunks, answered as a chat completion.

`session.StreamingInputSession` assembles chunks in order and generates once input ends; `models`
are the request bodies; `chat_format` the chat-completion JSON and SSE it answers with; `http`
serves them over HTTP.
"""
