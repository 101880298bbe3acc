"""The stage link: a small binary transport between stage processes.

Modules: ``frames`` (the wire format, tensor encoding, errors), ``server`` (StageLinkServer),
``client`` (StageLinkClient).

A stage that runs in its own process (`omni stage`) is reached through this link. It carries a
JSON payload plus named tensors per frame; tensor bytes go on the wire straight from the tensor's
memory (never through JSON) and come back as numpy arrays or CPU torch tensors, whichever was
sent. GPU tensors are moved to the CPU at the sending edge.

Wire format, one frame::

    header  28 bytes, little-endian: magic b"OMNL", version u8, frame type u8, flags u16,
            request id u64, metadata length u32, data length u64
    meta    UTF-8 JSON: {"method"?, "payload"?, "tensors": [{name, kind, dtype, shape, offset, nbytes}], ...}
    data    the tensors' raw bytes, back to back

One connection multiplexes many requests. A request gets zero or more REPLY frames, then END or
ERROR; the client sends CANCEL when it stops listening early and the server cancels the handler.

Server::

    async def encode(payload, tensors):            # an async generator: stream many replies
        yield {"n": 1}, {"features": tensors["audio"] * 2}

    server = StageLinkServer({"audio_encoder.encode": encode})
    address = await server.start("127.0.0.1", 0)   # "127.0.0.1:PORT"; `server.ready = True` when warm

Client::

    client = StageLinkClient(address)
    async with contextlib.aclosing(client.call("audio_encoder.encode", {}, {"audio": x})) as replies:
        async for payload, tensors in replies:
            ...
    await client.health()   # {"alive": True, "ready": ..., "methods": [...]}, built into every server
"""
