"""The streaming video socket (/v1/video/chat/stream): frames and audio in, answers to queries out.

`endpoint` serves the socket and answers queries; `state` holds a session's config and buffers.
"""
