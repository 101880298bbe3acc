"""Stage link: tensors of every kind cross exactly; addresses parse; frames fail with clear errors."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch

from omni_runtime.pipeline.link.client import StageLinkClient
from omni_runtime.pipeline.link.frames import (
    LinkConnectionError,
    LinkFrameTooLarge,
    decode_tensors,
    encode_tensors,
    parse_address,
)
from omni_runtime.pipeline.link.server import StageLinkServer


async def echo(payload, tensors):
    return {"echo": payload, "names": sorted(tensors)}, tensors


NUMPY_CASES = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "f64": np.linspace(-1, 1, 7),
    "f16": np.array([1.5, -2.25, 65504], dtype=np.float16),
    "i8": np.array([-128, 0, 127], dtype=np.int8),
    "i64": np.array([[2**62, -(2**62)]], dtype=np.int64),
    "u8": np.arange(256, dtype=np.uint8),
    "bool": np.array([True, False, True]),
    "c64": np.array([1 + 2j, -3j], dtype=np.complex64),
    "big_endian": np.array([1, 256, 65536], dtype=">i4"),
    "scalar": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((0, 3), dtype=np.int32),
    "strided": np.arange(24, dtype=np.int16).reshape(4, 6).T,
}

TORCH_CASES = {
    "t_f32": torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)),
    "t_bf16": torch.tensor([1.0, -0.5, 3.140625], dtype=torch.bfloat16),
    "t_f16": torch.tensor([[0.5, 2.0]], dtype=torch.float16),
    "t_i32": torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32),
    "t_i64": torch.arange(10),
    "t_bool": torch.tensor([True, False]),
    "t_u8": torch.tensor([0, 255], dtype=torch.uint8),
    "t_scalar": torch.tensor(7),
    "t_empty": torch.zeros(0, 5),
    "t_strided": torch.arange(12).reshape(3, 4).t(),
    "t_grad": torch.ones(3, requires_grad=True),
}


async def test_round_trip_is_exact_for_numpy_and_torch() -> None:
    async with StageLinkServer({"echo": echo}) as server:
        address = await server.start()
        async with StageLinkClient(address) as client:
            sent = {**NUMPY_CASES, **TORCH_CASES}
            payload, back = await client.call_once("echo", {"k": [1, "x", None]}, sent)
    assert payload == {"echo": {"k": [1, "x", None]}, "names": sorted(sent)}
    assert sorted(back) == sorted(sent)
    for name, value in NUMPY_CASES.items():
        got = back[name]
        assert isinstance(got, np.ndarray) and got.dtype == value.dtype and got.shape == value.shape, name
        assert np.array_equal(got, value), name
        assert got.flags.writeable, name
    for name, value in TORCH_CASES.items():
        got = back[name]
        assert isinstance(got, torch.Tensor) and got.dtype == value.dtype and got.shape == value.shape, name
        assert torch.equal(got, value.detach()), name
        assert got.device.type == "cpu" and not got.requires_grad


def test_encoding_shares_memory_with_contiguous_tensors() -> None:
    array = np.arange(6, dtype=np.float32)
    specs, views = encode_tensors({"a": array})
    assert specs == [{"name": "a", "kind": "numpy", "dtype": "<f4", "shape": [6], "offset": 0, "nbytes": 24}]
    array[0] = 42.0  # a view, not a copy: the bytes on the wire come from the array itself
    assert np.frombuffer(views[0], dtype=np.float32)[0] == 42.0
    data = bytearray(views[0])
    assert decode_tensors(specs, data)["a"].tolist() == [42.0, 1, 2, 3, 4, 5]


def test_encoding_rejects_non_tensors() -> None:
    with pytest.raises(TypeError, match="tensor 'x': expected a numpy array or torch tensor, got list"):
        encode_tensors({"x": [1, 2]})
    with pytest.raises(TypeError, match="numpy arrays of Python objects"):
        encode_tensors({"o": np.array([object()])})


@pytest.mark.parametrize(
    ("address", "parsed"),
    [
        ("127.0.0.1:9000", ("127.0.0.1", 9000)),
        ("thinker-0.svc:31000", ("thinker-0.svc", 31000)),
        ("[::1]:7", ("::1", 7)),
        (":8", ("127.0.0.1", 8)),
        (("h", 5), ("h", 5)),
        ("unix:/tmp/s.sock", "/tmp/s.sock"),
    ],
)
def test_parse_address(address, parsed) -> None:
    assert parse_address(address) == parsed


def test_parse_address_error_names_the_format() -> None:
    with pytest.raises(ValueError, match=r"expected HOST:PORT or unix:/PATH"):
        parse_address("thinker")


async def test_frame_limits_fail_clearly_on_both_sides() -> None:
    big = {"x": np.zeros(1000, dtype=np.uint8)}
    async with StageLinkServer({"echo": echo}, max_frame_bytes=512) as server:
        address = await server.start()
        async with StageLinkClient(address, max_frame_bytes=512) as client:
            with pytest.raises(LinkFrameTooLarge, match=r"1000 bytes, over the stage link limit of 512"):
                await client.call_once("echo", {}, big)
            assert (await client.call_once("echo", {}, {"x": np.zeros(10, np.uint8)}))[1]["x"].shape == (10,)
        # A client with a bigger limit gets the server's refusal, not a hang.
        async with StageLinkClient(address) as client:
            with pytest.raises(LinkConnectionError, match=r"server rejected the stream: .*max_frame_bytes"):
                await client.call_once("echo", {}, big)
            assert (await client.health())["alive"] is True  # reconnects after the refusal


async def test_throughput_of_a_64_mib_tensor(capsys: pytest.CaptureFixture[str]) -> None:
    tensor = torch.ones(64 << 20, dtype=torch.uint8)
    async with StageLinkServer({"echo": echo}) as server:
        address = await server.start()
        async with StageLinkClient(address) as client:
            await client.call_once("echo", {}, {"x": tensor[:1024]})  # connect outside the timing
            started = time.perf_counter()
            _, back = await client.call_once("echo", {}, {"x": tensor})
            elapsed = time.perf_counter() - started
    assert back["x"].numel() == tensor.numel()
    with capsys.disabled():
        rate = 2 * 64 / elapsed
        print(
            f"\nstage link: 64 MiB round trip over loopback TCP in {elapsed * 1000:.0f} ms ({rate:.0f} MiB/s)"
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
async def test_gpu_tensors_arrive_on_the_cpu() -> None:
    async with StageLinkServer({"echo": echo}) as server:
        address = await server.start()
        async with StageLinkClient(address) as client:
            _, back = await client.call_once("echo", {}, {"g": torch.arange(4, device="cuda")})
    assert back["g"].device.type == "cpu" and back["g"].tolist() == [0, 1, 2, 3]


async def test_unix_socket(tmp_path) -> None:
    path = str(tmp_path / "link.sock")
    async with StageLinkServer({"echo": echo}) as server:
        assert await server.start_unix(path) == f"unix:{path}"
        async with StageLinkClient(f"unix:{path}") as client:
            payload, back = await client.call_once("echo", {"a": 1}, {"t": torch.tensor([1, 2])})
    assert payload["echo"] == {"a": 1} and back["t"].tolist() == [1, 2]
    await asyncio.sleep(0)
