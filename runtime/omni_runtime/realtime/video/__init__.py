"""The streaming video socket (/v1/video/chat/stream): frames and audio in, answers to queries out.

`endpoint` serves the socket and checks each event; `query` answers one query and sends its
events; `sampling` checks and maps the per-stage sampling params; `state` holds a session's
config and buffers.
"""
