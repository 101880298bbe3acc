"""A decode row's MoE block as one CUDA kernel (``moe_experts.cu``; issue 17: decode at batch 1).

The fused decode layer (executor.moe_layer) ends each layer with three Triton kernels: the router,
the experts' gate-up, the experts' down. At one row they add about 33 µs a layer on an H200 for
75 MB of expert weights that one read takes 18 µs to stream, because the down rows can only be
read after gate-up ends, and holding them until then needs shared memory that Triton's pipeliner
keeps for itself. ``moe_experts.cu`` does the router and both halves in one kernel of one block a
multiprocessor, the down rows copied into shared memory by the copy engine while the gate and up
rows stream through registers (its header says how).

This module is the kernel's edge: :func:`plan` (pure: the kernel's compile-time sizes for a
layer's shape, or why it does not apply), NVRTC compilation for the GPU at hand (cached per
sizes), and launches through the driver API on PyTorch's current stream, as a programmatic
dependent launch when asked, so it joins the Triton kernels' PDL chain and CUDA graph captures.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

from omni_runtime.executor.triton_support import hopper_or_later

log = logging.getLogger(__name__)

THREADS_VALUES = 8  # values of the hidden row each thread holds
# Launch values (tests/gpu/sweep_moe_layer.py overrides them): TRIGGER says when the next kernel
# may launch (0 past the wait, 3 once routed, 1 after gate-up, 2 at the end); DEPTH, gate-up units
# a warp has in flight. On an H200, ms a decode step at batch 1: TRIGGER 0 2.460-2.467 and 1 2.459
# in one call, 3 2.504-2.509; DEPTH 1 2.519 and MIN_BLOCKS 1 2.545 in the call before, beside
# 2.502-2.539 for these values (docs/benchmarks.md).
TRIGGER = 0
DEPTH = 2
MIN_BLOCKS = 2  # blocks a multiprocessor must fit by registers (2: at most 128 a thread)
SHARED_LIMIT = 227 * 1024  # a Hopper block's dynamic shared memory at most
COMMON_HEADER = "moe_kernel_common.cuh"  # what the one-row kernels share, given to NVRTC as a header


@dataclass(frozen=True)
class RowPlan:
    """The kernel's compile-time sizes (``-D`` defines) and launch shape for one layer shape."""

    hidden: int
    inter: int
    experts: int
    top_k: int
    blocks: int
    threads: int
    normalize: bool
    trigger: int
    depth: int
    min_blocks: int
    trace: bool = False

    @property
    def shared_bytes(self) -> int:
        down = self.top_k * (self.hidden // self.blocks) * self.inter * 2
        return down + self.top_k * self.inter * 4 + self.hidden * 2 + 32 * 4 * 3 + 8

    def defines(self) -> dict[str, int]:
        return {
            "HIDDEN": self.hidden,
            "INTER": self.inter,
            "EXPERTS": self.experts,
            "TOP_K": self.top_k,
            "NCTA": self.blocks,
            "THREADS": self.threads,
            "NORMALIZE": int(self.normalize),
            "TRIGGER": self.trigger,
            "DEPTH": self.depth,
            "MIN_BLOCKS": self.min_blocks,
            "TRACE": int(self.trace),
        }


def plan(
    *, hidden: int, inter: int, experts: int, top_k: int, normalize: bool, multiprocessors: int
) -> RowPlan | str:
    """The kernel's sizes for a MoE block of this shape on a GPU of ``multiprocessors``, or a
    sentence saying why it does not take it (the caller keeps the Triton kernels)."""
    if hidden % (32 * THREADS_VALUES):
        return f"hidden size {hidden} is not a multiple of 256"
    threads = hidden // THREADS_VALUES
    if threads > 1024:
        return f"hidden size {hidden} needs {threads} threads a block (1024 at most)"
    if inter % 256:
        return f"expert width {inter} is not a multiple of 256"
    if experts % 32 or top_k > 32:
        return f"{experts} experts, top {top_k}: experts must be a multiple of 32 and k at most 32"
    warps = threads // 32
    for blocks in sorted(range(top_k, multiprocessors + 1, top_k), reverse=True):
        units = inter // (blocks // top_k) if inter % (blocks // top_k) == 0 else 0
        rows = hidden // blocks if hidden % blocks == 0 else 0
        if not units or not rows or units % warps or 4 * top_k * rows > 2 * hidden or experts % blocks:
            continue
        candidate = RowPlan(
            hidden, inter, experts, top_k, blocks, threads, normalize, TRIGGER, DEPTH, MIN_BLOCKS
        )
        if candidate.shared_bytes > SHARED_LIMIT:
            return f"a block's down rows need {candidate.shared_bytes} bytes of shared memory"
        return candidate
    return f"no block count up to {multiprocessors} splits {hidden} rows, {inter} units and {experts} experts"


def kernel_source(file: str) -> str:
    """The text of one of the package's CUDA sources (``moe_experts.cu``, ``row_gemv.cu``, ..)."""
    return resources.files("omni_runtime.executor").joinpath(file).read_text(encoding="utf-8")


def source() -> str:
    return kernel_source("moe_experts.cu")


def compile_cubin(row_plan: RowPlan, arch: str) -> tuple[bytes, str]:
    """(cubin, ptxas log) of ``moe_experts.cu`` at ``row_plan``'s sizes for ``arch`` (e.g.
    ``sm_90``), by NVRTC; a RuntimeError with NVRTC's log if it does not compile."""
    return compile_source(source(), "moe_experts.cu", row_plan.defines(), arch)


def compile_source(text: str, name: str, defines: dict[str, int], arch: str) -> tuple[bytes, str]:
    """(cubin, ptxas log) of CUDA C++ ``text`` (file ``name``, which may include
    ``COMMON_HEADER``) with ``defines`` for ``arch``, by NVRTC; a RuntimeError naming the file with
    NVRTC's log if it does not compile."""
    from cuda.bindings import nvrtc

    options = [f"-arch={arch}", "-std=c++17", "--ptxas-options=-v"]
    options += [f"-D{key}={value}" for key, value in defines.items()]
    header = resources.files("omni_runtime.executor").joinpath(COMMON_HEADER).read_text(encoding="utf-8")
    err, program = nvrtc.nvrtcCreateProgram(
        text.encode(), name.encode(), 1, [header.encode()], [COMMON_HEADER.encode()]
    )
    _check(err, "nvrtcCreateProgram")
    try:
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        err, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        message = log.decode(errors="replace").rstrip("\x00 \n")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"{name} does not compile for {arch}:\n{message}")
        err, size = nvrtc.nvrtcGetCUBINSize(program)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(program, cubin)
        _check(err, "nvrtcGetCUBIN")
        return cubin, message
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _check(err: Any, what: str) -> None:
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")


@functools.cache
def _function(row_plan: RowPlan, device_index: int) -> Any:
    """The loaded kernel for ``row_plan`` on GPU ``device_index`` (its primary context)."""
    compile_for = functools.partial(compile_cubin, row_plan)
    return load_for_device(compile_for, "moe_experts_row", row_plan.shared_bytes, device_index)


def load_for_device(
    compile_for: Callable[[str], tuple[bytes, str]], kernel: str, shared_bytes: int, device_index: int
) -> tuple[Any, Any]:
    """(module, function) of ``kernel`` compiled by ``compile_for(arch)`` for GPU ``device_index``'s
    architecture and loaded there (``load_function``)."""
    major, minor = torch.cuda.get_device_capability(device_index)
    cubin, _log = compile_for(f"sm_{major}{minor}")
    return load_function(cubin, kernel, shared_bytes, device_index)


def load_function(cubin: bytes, kernel: str, shared_bytes: int, device_index: int) -> tuple[Any, Any]:
    """(module, function) of ``kernel`` in ``cubin`` loaded on GPU ``device_index``, allowed
    ``shared_bytes`` of dynamic shared memory."""
    from cuda.bindings import driver

    _current_context(device_index)
    err, module = driver.cuModuleLoadData(cubin)
    _check(err, "cuModuleLoadData")
    err, function = driver.cuModuleGetFunction(module, kernel.encode())
    _check(err, "cuModuleGetFunction")
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    (err,) = driver.cuFuncSetAttribute(function, attribute, shared_bytes)
    _check(err, "cuFuncSetAttribute")
    return module, function


def launch(
    function: Any,
    values: list[Any],
    *,
    blocks: int,
    threads: int,
    shared_bytes: int,
    device: torch.device,
    pdl: bool,
) -> None:
    """Launch ``function`` with argument ``values`` (ctypes) on PyTorch's current stream of
    ``device``, as a programmatic dependent launch when ``pdl``."""
    from cuda.bindings import driver

    _current_context(device_index(device))
    pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = blocks, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = shared_bytes
    config.hStream = driver.CUstream(torch.cuda.current_stream(device).cuda_stream)
    attributes = []
    if pdl:
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        attributes.append(attribute)
    config.attrs = attributes
    config.numAttrs = len(attributes)
    (err,) = driver.cuLaunchKernelEx(config, function, ctypes.addressof(pointers), 0)
    _check(err, "cuLaunchKernelEx")


@functools.cache
def _primary_context(device_index: int) -> Any:
    """GPU ``device_index``'s primary context: the one PyTorch's runtime calls use."""
    from cuda.bindings import driver

    torch.cuda.init()
    (err,) = driver.cuInit(0)
    _check(err, "cuInit")
    err, device = driver.cuDeviceGet(device_index)
    _check(err, "cuDeviceGet")
    err, context = driver.cuDevicePrimaryCtxRetain(device)
    _check(err, "cuDevicePrimaryCtxRetain")
    return context


def _current_context(device_index: int) -> None:
    """Make GPU ``device_index``'s primary context current on this thread (a thread that only used
    PyTorch's allocator may have none, or another GPU's)."""
    from cuda.bindings import driver

    context = _primary_context(device_index)
    err, current = driver.cuCtxGetCurrent()
    _check(err, "cuCtxGetCurrent")
    if int(current) != int(context):
        (err,) = driver.cuCtxSetCurrent(context)
        _check(err, "cuCtxSetCurrent")


class RowExperts:
    """One layer's MoE block for one decode row: its weights, the kernel, its published values and
    launch count."""

    def __init__(self, row_plan: RowPlan, weights: tuple[torch.Tensor, ...], eps: float) -> None:
        self.plan, self.weights, self.eps = row_plan, weights, eps  # post_norm, router, gate_up, down
        device = self.device = weights[-1].device
        # Published values with their launch's tag (zero: none yet), and the launch count.
        self.logits = torch.zeros(row_plan.experts, dtype=torch.int64, device=device)
        self.act = torch.zeros(row_plan.top_k * row_plan.inter, dtype=torch.int32, device=device)
        self.launches = torch.zeros(1, dtype=torch.int32, device=device)
        self.route_weights = torch.empty(row_plan.top_k, dtype=torch.bfloat16, device=device)
        self.route_index = torch.empty(row_plan.top_k, dtype=torch.int64, device=device)

    def __call__(self, mid: torch.Tensor, *, pdl: bool, trace: torch.Tensor | None = None) -> torch.Tensor:
        """``mid`` [1, H] (the attention block's output plus residual) through the MoE block and
        its residual: the layer's output [1, H]. ``trace`` (int64, at least [blocks, 8]): each
        block's phase marks (the kernel compiled with them)."""
        out = torch.empty_like(mid)
        row_plan = self.plan if trace is None else dataclasses.replace(self.plan, trace=True)
        _module, function = _function(row_plan, device_index(self.device))
        values = [
            ctypes.c_uint64(t.data_ptr())
            for t in (
                mid, *self.weights, self.logits, self.act, self.route_weights, self.route_index,
                self.launches, out,
            )
        ]  # fmt: skip
        values.append(ctypes.c_float(self.eps))  # type: ignore[arg-type]
        values.append(ctypes.c_uint64(0 if trace is None else trace.data_ptr()))
        launch(
            function, values, blocks=self.plan.blocks, threads=self.plan.threads,
            shared_bytes=self.plan.shared_bytes, device=self.device, pdl=pdl,
        )  # fmt: skip
        return out


def usable(weight: torch.Tensor, device: torch.device) -> bool:
    """Whether the kernel can read ``weight`` as it does: contiguous bfloat16 on ``device``, its
    first element 16-byte aligned (16-byte loads and the copy engine's bulk copies)."""
    return (
        weight.dtype == torch.bfloat16
        and weight.is_contiguous()
        and weight.device == device
        and weight.data_ptr() % 16 == 0
    )


def driver_kernels_run(device: torch.device, tensors: Sequence[torch.Tensor]) -> bool:
    """Whether the one-row CUDA kernels can run here on ``tensors``: a GPU of compute capability 9.0
    or later, every tensor one they can read (``usable``), and ``cuda.bindings`` (NVRTC and the
    driver API) importable."""
    if not hopper_or_later(device) or not all(usable(t, device) for t in tensors):
        return False
    try:
        import cuda.bindings.driver
        import cuda.bindings.nvrtc  # noqa: F401
    except ImportError:
        return False
    return True


def loads_or_warns(load: Callable[[], object], kernel: str, keeps: str, switch: str) -> bool:
    """Whether ``load()`` (a kernel's compile and load on this GPU) succeeds; where it raises a
    RuntimeError, a warning naming ``kernel``, what runs instead (``keeps``) and the ``switch`` that
    skips the check, and False (the layers keep their other kernels rather than fail every step)."""
    try:
        load()
    except RuntimeError as exc:
        log.warning(
            "%s does not run on this GPU (%s); %s (%s=0 skips this check)", kernel, exc, keeps, switch
        )
        return False
    return True


def row_experts(
    *,
    post_norm: torch.Tensor,
    router: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    normalize: bool,
    eps: float,
) -> RowExperts | None:
    """The kernel for a MoE block with these weights (``post_norm`` [H], ``router`` [E, H],
    ``gate_up`` [E, 2I, H], ``down`` [E, H, I]), compiled and loaded now, or None where it does not
    run: weights it cannot read (``usable``), not a GPU of compute capability 9.0 or later, no
    ``cuda.bindings``, a shape it does not take, or a kernel that does not compile or load here
    (logged: the layer keeps its Triton kernels rather than fail every decode step)."""
    device = down.device
    weights = (post_norm, router, gate_up, down)
    if not driver_kernels_run(device, weights):
        return None
    experts, hidden, inter = down.shape
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    row_plan = plan(
        hidden=hidden, inter=inter, experts=experts, top_k=top_k, normalize=normalize, multiprocessors=sms
    )
    if isinstance(row_plan, str) or not loads(row_plan, device_index(device)):
        return None
    return RowExperts(row_plan, weights, eps)


def loads(row_plan: RowPlan, device_index: int) -> bool:
    """Whether the kernel compiles and loads on GPU ``device_index`` (once per sizes; cached); a
    warning naming the switch that turns it off where it does not."""
    return loads_or_warns(
        lambda: _function(row_plan, device_index), "the one-row MoE kernel",
        "one-row decode steps keep the Triton kernels", "OMNI_MOE_ROW_KERNEL",
    )  # fmt: skip


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()
