"""A `Runtime` (engine.kernels.runtime) running the CUDA twins' host code on NumPy, their kernels on the CPU.

`EmuRuntime` is what `CudaRuntime` is on a GPU: `xp` is NumPy (wrapped so that `empty` and
`empty_like` hand out NaN-poisoned memory, as a fresh device buffer may hold anything), `launch`
builds each kernel source with g++ (tests/kernels/emulate.py `FiberKernels`, every CUDA thread a
fiber, arguments checked against the kernel's parameter types) and `gemm` computes what cuBLAS
does: float32 operands multiplied and summed in float64 (cuBLAS's fp32 GEMM rounds differently,
within 1e-6 relative), bf16 operands widened exactly and summed in float64, the result rounded to
float32. So `<op>_on(EmuRuntime(), ...)` runs the twin's whole host path: buffers, launch shapes,
argument order and C types, chunking loops. Needs g++, no GPU.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from engine.kernels.nvrtc import KernelSource
from engine.kernels.runtime import Runtime, check_gemm, check_gemm_indexed
from tests.kernels.emulate import FiberKernels

_BUILT: dict[tuple[str, str], FiberKernels] = {}
_WORKDIR: list[Path] = []


def _workdir() -> Path:
    if not _WORKDIR:
        path = Path(tempfile.mkdtemp(prefix="tune-emulate-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _WORKDIR.append(path)
    return _WORKDIR[0]


def built(source: KernelSource):
    """The source built for the host once per test session (the MoE source, whose kernels use
    warp-wide tensor-core instructions, on its own emulator, tests/kernels/emulate_moe.py)."""
    key = (source.name, source.code)
    if key not in _BUILT:
        if source.name in ("moe", "moe_gemm", "moe_cublas"):
            from tests.kernels.emulate_moe import FiberKernels as MoeKernels

            _BUILT[key] = _MoeAdapter(MoeKernels(source.code, source.kernels, _workdir(), source.options))
        else:
            _BUILT[key] = FiberKernels(source.code, source.kernels, _workdir(), source.options)
    return _BUILT[key]


class _MoeAdapter:
    """emulate_moe.FiberKernels behind the launch signature of emulate.FiberKernels."""

    def __init__(self, kernels) -> None:
        self.kernels = kernels

    def launch(self, kernel, grid, block, args, shared_mem=0, reverse=False) -> None:
        grid = tuple(grid) + (1,) * (2 - len(grid))
        self.kernels.launch(kernel, grid[:2], int(block[0]), tuple(args), shared_mem=shared_mem)


def _wide(x: np.ndarray) -> np.ndarray:
    """float64 values of float32 or bf16-bit (uint16) operands."""
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def poison_like(shape, dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    out = np.empty(shape, dt)
    if dt.kind == "f":
        out.fill(np.nan)
    elif dt.kind in "iu":
        out.view(np.uint8).fill(0xA5)  # garbage ids and counts, never a plausible small value
    elif dt.kind == "b":
        out.view(np.uint8).fill(0)
    return out


class _PoisonNumpy(ModuleType):
    """NumPy, except that uninitialised allocations come filled with NaN (or 0xA5 bytes)."""

    def __init__(self) -> None:
        super().__init__("numpy_poisoned")

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def empty(shape, dtype=float, order="C"):
        return poison_like(shape, dtype)

    @staticmethod
    def empty_like(a, dtype=None, order="K", subok=True, shape=None):
        return poison_like(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


class EmuRuntime(Runtime):
    """NumPy arrays, kernels run by g++-built fibers, GEMMs in float64. `reverse` runs the threads of
    each block in reverse index order (a missing barrier shows in one order or the other)."""

    def __init__(self, reverse: bool = False) -> None:
        self.xp = _PoisonNumpy()
        self.reverse = reverse
        self.launches: list[tuple[str, tuple, tuple]] = []  # (kernel, grid, block), for tests to inspect

    def launch(self, source, kernel, grid, block, args, shared_mem=0) -> None:
        self.launches.append((kernel, tuple(grid), tuple(block)))
        built(source).launch(kernel, grid, block, args, shared_mem=shared_mem, reverse=self.reverse)

    def address(self, a: Any) -> int:
        return int(a.ctypes.data)

    def gemm_indexed(self, a, b, index, out, *, trans_b=False, alpha=1.0, beta=0.0) -> None:
        check_gemm_indexed(a, b, index, out, trans_b)
        for t in range(out.shape[0]):
            self.gemm(a[t], b[int(index[t])], out[t], trans_b=trans_b, alpha=alpha, beta=beta)

    def gemm(self, a, b, out, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> None:
        check_gemm(a, b, out, trans_a, trans_b)
        wide = _wide

        A = wide(a).T if trans_a else wide(a)
        B = wide(b).T if trans_b else wide(b)
        prod = np.float64(np.float32(alpha)) * (A @ B)
        if beta != 0.0:
            prod += np.float64(np.float32(beta)) * out.astype(np.float64)
        out[...] = prod.astype(np.float32)
