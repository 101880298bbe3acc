"""The stage link's wire format: frame header, JSON metadata, raw tensor bytes; link errors."""

from __future__ import annotations

import asyncio
import json
import math
import struct
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

MAGIC = b"OMNL"
VERSION = 1
HEADER = struct.Struct("<4sBBHQIQ")
DEFAULT_MAX_FRAME_BYTES = 2 << 30  # tensors of one frame; hidden states and features stay far below
DEFAULT_MAX_META_BYTES = 16 << 20
HEALTH_METHOD = "health"
READ_CHUNK = 4 << 20  # also the stream buffer size: fewer, larger socket reads for big tensors

Tensors = dict[str, Any]
Reply = tuple[dict[str, Any], Tensors]
Handler = Callable[[dict[str, Any], Tensors], Any]


class FrameType(IntEnum):
    REQUEST = 1
    REPLY = 2
    END = 3
    ERROR = 4
    CANCEL = 5


class LinkError(Exception):
    """Base of every stage-link failure."""


class LinkConnectionError(LinkError):
    """The connection could not be made, or was lost while a call was in flight."""


class LinkProtocolError(LinkError):
    """The peer sent bytes that are not a valid frame."""


class LinkFrameTooLarge(LinkError):
    """A frame is over the configured size limit (max_frame_bytes / max_meta_bytes)."""


class LinkRemoteError(LinkError):
    """The remote handler failed; ``remote_type`` names its exception class."""

    def __init__(self, message: str, *, remote_type: str = "Error", method: str = "") -> None:
        super().__init__(f"stage link method {method!r} failed: {remote_type}: {message}")
        self.message, self.remote_type, self.method = message, remote_type, method


class BadFrame(LinkProtocolError):
    """A well-framed frame with unusable contents: the stream is still in sync."""

    def __init__(self, message: str, request_id: int) -> None:
        super().__init__(message)
        self.request_id = request_id


@dataclass
class Frame:
    type: FrameType
    request_id: int
    meta: dict[str, Any]
    tensors: Tensors


# --- tensors <-> bytes -------------------------------------------------------------------------


def _tensor_bytes(name: str, value: Any) -> tuple[dict[str, Any], memoryview]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        cpu = value.detach().to("cpu").contiguous()
        flat = cpu.reshape(-1)
        raw = flat.view(torch.uint8)  # any dtype (bfloat16, bool, float8) as plain bytes
        spec = {"kind": "torch", "dtype": str(cpu.dtype).removeprefix("torch."), "shape": list(cpu.shape)}
        return spec, raw.numpy().data.cast("B")
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"tensor {name!r}: numpy arrays of Python objects cannot cross a stage link")
        arr = value if value.flags.c_contiguous else value.copy(order="C")  # keeps 0-d arrays 0-d
        spec = {"kind": "numpy", "dtype": arr.dtype.str, "shape": list(arr.shape)}
        return spec, arr.reshape(-1).data.cast("B")
    raise TypeError(f"tensor {name!r}: expected a numpy array or torch tensor, got {type(value).__name__}")


def encode_tensors(tensors: Mapping[str, Any] | None) -> tuple[list[dict[str, Any]], list[memoryview]]:
    """Describe ``tensors`` for the metadata and return views of their bytes (no copies)."""
    specs, views, offset = [], [], 0
    for name, value in (tensors or {}).items():
        spec, view = _tensor_bytes(str(name), value)
        specs.append({"name": str(name), **spec, "offset": offset, "nbytes": view.nbytes})
        views.append(view)
        offset += view.nbytes
    return specs, views


def _decode_one(spec: dict[str, Any], data: bytearray) -> Any:
    shape, offset, nbytes = tuple(int(d) for d in spec["shape"]), int(spec["offset"]), int(spec["nbytes"])
    if offset < 0 or nbytes < 0 or offset + nbytes > len(data) or any(d < 0 for d in shape):
        raise ValueError("tensor bytes out of range")
    if spec["kind"] == "numpy":
        dtype = np.dtype(spec["dtype"])
        if dtype.hasobject or math.prod(shape) * dtype.itemsize != nbytes:
            raise ValueError(f"numpy {dtype} {list(shape)} does not fit {nbytes} bytes")
        return np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
    if spec["kind"] == "torch":
        import torch

        dtype = getattr(torch, str(spec["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {spec['dtype']!r}")
        itemsize = torch.empty((), dtype=dtype).element_size()
        if math.prod(shape) * itemsize != nbytes:
            raise ValueError(f"torch {dtype} {list(shape)} does not fit {nbytes} bytes")
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        raw = torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=offset)
        return raw.view(dtype).reshape(shape)
    raise ValueError(f"unknown tensor kind {spec['kind']!r}")


def decode_tensors(specs: list[dict[str, Any]], data: bytearray) -> Tensors:
    """Rebuild tensors from their specs; they share ``data``'s memory (writable, no copy)."""
    return {str(spec["name"]): _decode_one(spec, data) for spec in specs}


# --- frames on a stream ------------------------------------------------------------------------


def write_frame(
    writer: asyncio.StreamWriter,
    frame_type: FrameType,
    request_id: int,
    meta: dict[str, Any] | None = None,
    tensors: Mapping[str, Any] | None = None,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    max_meta_bytes: int = DEFAULT_MAX_META_BYTES,
) -> None:
    """Queue one whole frame on ``writer`` without awaiting, so concurrent frames never interleave."""
    specs, views = encode_tensors(tensors)
    meta_bytes = json.dumps({**(meta or {}), "tensors": specs}, separators=(",", ":")).encode()
    data_len = sum(v.nbytes for v in views)
    if data_len > max_frame_bytes:
        raise LinkFrameTooLarge(
            f"frame tensors are {data_len} bytes, over the stage link limit of {max_frame_bytes} "
            "bytes (max_frame_bytes): send smaller pieces or raise the limit on both ends"
        )
    if len(meta_bytes) > max_meta_bytes:
        raise LinkFrameTooLarge(
            f"frame metadata is {len(meta_bytes)} bytes, over the limit of {max_meta_bytes} bytes "
            "(max_meta_bytes): move large values into tensors"
        )
    header = HEADER.pack(MAGIC, VERSION, int(frame_type), 0, request_id, len(meta_bytes), data_len)
    writer.write(header + meta_bytes)
    for view in views:
        if view.nbytes:
            writer.write(view)


async def read_frame(
    reader: asyncio.StreamReader,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    max_meta_bytes: int = DEFAULT_MAX_META_BYTES,
) -> Frame | None:
    """Read one frame; None at a clean end of stream between frames."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise LinkConnectionError("stream ended inside a frame header") from exc
    magic, version, ftype, _flags, request_id, meta_len, data_len = HEADER.unpack(header)
    if magic != MAGIC:
        raise LinkProtocolError(f"bad frame magic {magic!r}: the peer does not speak the stage link")
    if version != VERSION:
        raise LinkProtocolError(f"stage link version {version} from the peer; this side speaks {VERSION}")
    if meta_len > max_meta_bytes or data_len > max_frame_bytes:
        raise LinkFrameTooLarge(
            f"incoming frame has {meta_len} metadata and {data_len} tensor bytes, over the limits "
            f"{max_meta_bytes} (max_meta_bytes) and {max_frame_bytes} (max_frame_bytes)"
        )
    meta_raw = await reader.readexactly(meta_len)
    data = bytearray(data_len)
    view, filled = memoryview(data), 0
    while filled < data_len:  # chunked, so the reader's own buffer never holds a whole large frame
        chunk = await reader.read(min(READ_CHUNK, data_len - filled))
        if not chunk:
            raise LinkConnectionError("stream ended inside a frame body")
        view[filled : filled + len(chunk)] = chunk
        filled += len(chunk)
    try:
        kind = FrameType(ftype)
        meta = json.loads(meta_raw)
        if not isinstance(meta, dict):
            raise ValueError("metadata is not a JSON object")
        tensors = decode_tensors(meta.pop("tensors", []), data)
    except (ValueError, KeyError, TypeError) as exc:
        raise BadFrame(f"malformed frame: {exc}", request_id) from exc
    return Frame(kind, request_id, meta, tensors)


def parse_address(address: str | tuple[str, int]) -> tuple[str, int] | str:
    """``"host:port"``, ``"[::1]:port"``, ``(host, port)`` or ``"unix:/path"`` (returned as the path)."""
    if isinstance(address, tuple):
        return address[0], int(address[1])
    if address.startswith("unix:"):
        return address.removeprefix("unix:")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"stage link address {address!r}: expected HOST:PORT or unix:/PATH")
    return host.strip("[]") or "127.0.0.1", int(port)
