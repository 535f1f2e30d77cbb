"""What the parity tests of the CUDA twins share: where a twin runs, and how its results are judged.

A `Backend` runs a twin's host code (`<op>_on(rt, ...)`) on a runtime and hands results back as
NumPy arrays:
- "cpu": a CPU twin (engine.kernels.<op>_cpu), which takes NumPy arrays and no runtime (`rt` is None);
  `twice` runs it in line, then on two CPU workers with every piece handed to them;
- "gpu": `CudaRuntime` on a CUDA device, inputs copied there with CuPy; every allocation made
  while the twin runs is filled with 0xFF bytes first (NaN for float32 and bf16), so an output
  element the kernels never wrote fails the comparison;
- "emulated": `EmuRuntime` (tests/kernels/emu_runtime.py): NumPy arrays, the kernels built by g++
  and run on the CPU, allocations NaN-filled. Runs on every machine with g++.

`Backend.twice` runs a twin twice and demands bit-identical results (on the emulator the second
run takes each block's threads in reverse order; a CPU twin's second run is on two workers), so a
race or a read of unwritten memory shows as a difference. `compare` measures a result against the
reference computed in float64, and a `Check` carries the figures that bench/gpu_check.py prints: the
norm-wise relative error decides (fp32 paths 1e-5, bf16 paths ~1e-2), max abs and max rel
(max |out - ref| / max |ref|) are shown.
Inputs are drawn fresh on every run (the `fresh_rng` fixture), never zeros.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.kernels.emu_runtime import EmuRuntime

FP32_TOL = 1e-5  # norm-wise relative error of fp32 math against a float64 reference
BF16_TOL = 1e-2  # bf16 operands (the frozen-weight GEMMs)


@dataclass(frozen=True)
class Check:
    """One comparison of a twin's output with the reference."""

    op: str  # e.g. "rmsnorm_backward.dx"
    case: str  # the shapes and options
    max_abs: float
    max_rel: float  # max |out - ref| / max |ref|
    rel: float  # ||out - ref|| / ||ref||: what decides
    tol: float
    nan: int  # NaN where the reference has none: values never written
    ok: bool

    @property
    def message(self) -> str:
        return (
            f"{self.op} [{self.case}]: relative error {self.rel:.3e} (tolerance {self.tol:.0e}), "
            f"max abs {self.max_abs:.3e}, max rel {self.max_rel:.3e}, {self.nan} unexpected NaN"
        )


def compare(op: str, case: str, out: Any, ref: Any, tol: float) -> Check:
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if o.shape != r.shape:
        return Check(op, f"{case}; shape {o.shape} != {r.shape}", np.inf, np.inf, np.inf, tol, 0, False)
    nan = int((np.isnan(o) & ~np.isnan(r)).sum())
    fin = np.isfinite(o) & np.isfinite(r)
    diff = np.abs(o[fin] - r[fin])
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r[fin]).max()) if diff.size else 0.0
    norm = float(np.linalg.norm(r[fin]))
    rel = float(np.linalg.norm(diff)) / norm if norm else max_abs
    same_inf = bool(np.array_equal(np.isinf(o), np.isinf(r)))
    ok = nan == 0 and same_inf and rel <= tol
    return Check(op, case, max_abs, max_abs / scale if scale else max_abs, rel, tol, nan, ok)


def assert_checks(checks: Iterable[Check]) -> None:
    """Every check passes; a failure lists all the checks that failed, not only the first."""
    failed = [c.message for c in checks if not c.ok]
    assert not failed, "\n".join(failed)


def _walk(x: Any, f: Callable[[Any], Any]) -> Any:
    if isinstance(x, dict):
        return {k: _walk(v, f) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_walk(v, f) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_walk(v, f) for v in x)
    return f(x)


def _leaves(x: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(x, (tuple, list)):
        for i, v in enumerate(x):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, x


class Backend:
    """Where twins run for a test: "emulated" (g++ on the CPU) or "gpu" (CuPy)."""

    def __init__(self, name: str, cp: Any = None, large: bool | None = None):
        self.name = name
        self.cp = cp
        self._large = large
        if name == "gpu":
            from engine.kernels.runtime import cuda_runtime

            self.rt = cuda_runtime()
        elif name == "cpu":
            self.rt = None
        else:
            self.rt = EmuRuntime()
            self._rt_reverse = EmuRuntime(reverse=True)

    @property
    def large(self) -> bool:
        """Whether real-model sizes are affordable (on a GPU, not in the emulator), unless told (or
        unless $TUNE_PARITY_SMALL is set: test sizes on a GPU too, for a short device call)."""
        if self._large is not None:
            return self._large
        return self.name == "gpu" and not os.environ.get("TUNE_PARITY_SMALL")

    def put(self, a: Any) -> Any:
        """A host array (or None) as this backend's array."""
        if a is None or self.name != "gpu" or not isinstance(a, np.ndarray):
            return a.copy() if isinstance(a, np.ndarray) else a
        return self.cp.asarray(a)

    def get(self, a: Any) -> Any:
        """This backend's array (or a nested structure of them) as NumPy."""

        def host(x):
            if self.name == "gpu" and type(x).__module__.startswith("cupy"):
                return self.cp.asnumpy(x)
            return x

        return _walk(a, host)

    @contextlib.contextmanager
    def poisoned(self):
        """Every device allocation inside is 0xFF-filled first (the emulator always does this)."""
        if self.name != "gpu":
            yield
            return
        cp = self.cp
        pool = cp.get_default_memory_pool()

        def alloc(size: int):
            mem = pool.malloc(size)
            if size:
                cp.cuda.runtime.memsetAsync(mem.ptr, 0xFF, size, cp.cuda.get_current_stream().ptr)
            return mem

        cp.cuda.set_allocator(alloc)
        try:
            yield
        finally:
            cp.cuda.set_allocator(pool.malloc)

    def twice(self, fn: Callable[[Any], Any], what: str) -> Any:
        """fn(rt) run twice (poisoned allocations), results as NumPy; AssertionError unless the two
        runs agree bit for bit. Inputs fn mutates must be rebuilt inside fn."""
        if self.name == "cpu":
            first = fn(None)
            with two_cpu_workers():
                second = fn(None)
        else:
            with self.poisoned():
                first = self.get(fn(self.rt))
            with self.poisoned():
                second = self.get(fn(self._rt_reverse if self.name != "gpu" else self.rt))
        for (path, a), (_, b) in zip(_leaves(first), _leaves(second), strict=True):
            if isinstance(a, np.ndarray) and a.dtype.kind in "fiub":
                same = a.shape == b.shape and np.array_equal(
                    np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
                )
                if not same:
                    n = int((a != b).sum()) if a.shape == b.shape else -1
                    raise AssertionError(
                        f"{what}{path}: two runs differ in {n} of {a.size} values (a race, or a read of "
                        f"memory nothing wrote)"
                    )
        return first


@contextlib.contextmanager
def two_cpu_workers():
    """Inside, CPU twins run their pieces on two CPU workers (engine.kernels.cpu_workers), however small."""
    from engine.kernels import cpu_workers, moe_cpu

    pool = cpu_workers.CpuWorkers()
    pool.set_count(2)
    saved = cpu_workers._PROCESS, moe_cpu.PIECE_MIN_FLOPS
    cpu_workers._PROCESS, moe_cpu.PIECE_MIN_FLOPS = pool, 0.0
    try:
        yield
    finally:
        cpu_workers._PROCESS, moe_cpu.PIECE_MIN_FLOPS = saved
        pool.set_count(1)


def backends_param():
    """pytest params for the `backend` fixture: the emulator everywhere, the GPU where there is one."""
    import pytest

    return [pytest.param("emulated"), pytest.param("gpu", marks=pytest.mark.gpu)]


def f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """Random normal float32 values (never zeros)."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def f64(a: Any) -> Any:
    """A float64 copy for the reference (None stays None)."""
    return None if a is None else np.asarray(a, dtype=np.float64)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (nearest-even) as uint16 bit patterns."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns as float64 values (exact)."""
    return (
        (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    )
