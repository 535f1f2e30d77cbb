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
import contextlib
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from engine.kernels.nvrtc import KernelSource
from engine.kernels.runtime import CaptureError, Runtime, check_gemm, check_gemm_indexed
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
            prod += np.float64(np.float32(beta)) * wide(out)
        result = prod.astype(np.float32)
        if out.dtype == np.uint16:  # bf16 out: the fp32 result rounded once, nearest-even
            u = result.view(np.uint32).astype(np.uint64)
            result = ((u + 0x7FFF + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)
        out.view(np.ndarray)[...] = result

    def upload(self, dst, host) -> None:
        host = np.ascontiguousarray(host, dtype=dst.dtype)
        if host.shape != tuple(dst.shape):
            raise ValueError(f"upload of {host.shape} into {tuple(dst.shape)}")
        dst[...] = host


# ----------------------------------------------------------------------------------------------
# Counting every device operation, and capturing a step as a graph, on the emulator


class EmuCaptureError(CaptureError):
    """What a CUDA stream capture refuses (a host read, an upload, an operation it cannot hold),
    seen on the emulator: a CaptureError carrying the failed graph, as the CUDA runtime's."""


# NumPy functions that only make views or ask about shapes: no kernel on a GPU
_VIEW_FUNCS = {
    "reshape",
    "transpose",
    "swapaxes",
    "moveaxis",
    "squeeze",
    "expand_dims",
    "broadcast_to",
    "shape",
    "ndim",
    "size",
    "result_type",
    "may_share_memory",
    "shares_memory",
    "atleast_1d",
    "atleast_2d",
    "iscomplexobj",
    "isscalar",
    "can_cast",
    "diagonal",
    "real",
    "imag",
}
# functions whose CuPy version reads the device (the size of its result depends on the data)
_SYNC_FUNCS = {"nonzero", "flatnonzero", "argwhere", "unique", "array_equal", "allclose", "isclose"}
# functions CuPy builds on its concatenate, which joins more than 8 arrays of one dtype that average
# under 2 MiB in one kernel whose table of their addresses it uploads (_concatenate_single_kernel)
_JOIN_FUNCS = {"concatenate", "stack", "vstack", "hstack", "column_stack", "dstack"}


class DeviceArray(np.ndarray):
    """An emulated device array: NumPy memory whose every operation a `RecordingRuntime` counts, and
    whose conversion to a host value (float(), int(), bool(), item(), tolist(), to_host) is a read
    of the device: recorded, and an error inside a captured region, as a CUDA capture makes it."""

    _rt: RecordingRuntime | None = None  # the runtime that counts (set on the class while one is active)

    def __array_finalize__(self, obj) -> None:  # views and results stay device arrays
        pass

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        rt = DeviceArray._rt
        args = [_base(x) for x in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_base(o) for o in out)
        fn = getattr(ufunc, method)
        result = fn(*args, **kwargs)
        if out is None:
            result = result if isinstance(result, (np.ndarray, tuple)) else np.asarray(result)
            outs = result if isinstance(result, tuple) else (result,)
            kw = dict(kwargs, out=tuple(outs))
        else:
            kw = kwargs
        if rt is not None:
            name = f"{ufunc.__name__}.{method}" if method != "__call__" else ufunc.__name__
            rt._op("glue", name, lambda: fn(*args, **kw))
        if out is not None:
            return out[0] if len(out) == 1 else out
        if isinstance(result, tuple):
            return tuple(r.view(DeviceArray) if isinstance(r, np.ndarray) else r for r in result)
        return result.view(DeviceArray)  # 0-d for a whole reduction, as CuPy gives it

    def __array_function__(self, func, types, args, kwargs):
        rt = DeviceArray._rt
        name = func.__name__
        if rt is not None and not rt._depth and name in _JOIN_FUNCS and _joins_with_a_table(args[0]):
            rt._op("upload", f"{name} of {len(args[0])} arrays (CuPy uploads their addresses)")
        counted = rt is not None and not rt._depth and name not in _VIEW_FUNCS
        if rt is not None:
            rt._depth += 1
        try:
            out = super().__array_function__(func, types, args, kwargs)
        finally:
            if rt is not None:
                rt._depth -= 1
        if counted:
            thunk = None
            if isinstance(out, np.ndarray) and name not in _SYNC_FUNCS:
                res, a, kw = _base(out), _bases(args), _bases(kwargs)
                thunk = lambda: np.copyto(res, func(*a, **kw))  # noqa: E731
            rt._op("read" if name in _SYNC_FUNCS else "glue", name, thunk)
        if isinstance(out, np.ndarray) and not isinstance(out, DeviceArray) and name not in _SYNC_FUNCS:
            return out.view(DeviceArray)
        return out

    def __getitem__(self, key):
        _uploads("getitem with a host index", key)
        out = np.ndarray.__getitem__(self, key)
        if not isinstance(out, np.ndarray):  # one element: a 0-d device array, as CuPy gives it
            return np.asarray(out).view(DeviceArray)
        return out

    def __setitem__(self, key, value) -> None:
        _uploads("setitem from the host", key, value)
        base, val = self.view(np.ndarray), _base(value)
        base[key] = val
        rt = DeviceArray._rt
        if rt is not None:
            rt._op("glue", "setitem", lambda: base.__setitem__(key, val))

    def _read(self, what: str):
        rt = DeviceArray._rt
        if rt is not None:
            rt._op("read", what)
        return self.view(np.ndarray)

    def __float__(self) -> float:
        return float(self._read("float"))

    def __int__(self) -> int:
        return int(self._read("int"))

    def __index__(self) -> int:
        return int(self._read("index"))

    def __bool__(self) -> bool:
        return bool(self._read("bool"))

    def item(self, *a):
        return self._read("item").item(*a)

    def tolist(self):
        return self._read("tolist").tolist()

    def get(self):
        return np.array(self._read("get"))

    def astype(self, dtype, *a, **kw):
        base = self.view(np.ndarray)
        out = np.ndarray.astype(base, dtype, *a, **kw)
        rt = DeviceArray._rt
        if rt is not None:
            rt._op("glue", "astype", lambda: np.copyto(out, base, casting="unsafe"))
        return out.view(DeviceArray)

    def copy(self, order="C"):
        base = self.view(np.ndarray)
        out = np.ndarray.copy(base, order)
        rt = DeviceArray._rt
        if rt is not None:
            rt._op("glue", "copy", lambda: np.copyto(out, base))
        return out.view(DeviceArray)

    def fill(self, value) -> None:
        base = self.view(np.ndarray)
        base.fill(value)
        rt = DeviceArray._rt
        if rt is not None:
            rt._op("glue", "fill", lambda: base.fill(value))


def _base(x):
    return x.view(np.ndarray) if isinstance(x, DeviceArray) else x


def _joins_with_a_table(arrays) -> bool:
    """Whether CuPy's concatenate joins `arrays` in one kernel with an uploaded table of addresses."""
    arrays = list(arrays)
    if len(arrays) <= 8 or len({np.dtype(a.dtype) for a in arrays}) != 1:
        return False
    return sum(a.nbytes for a in arrays) < (2 << 20) * len(arrays)


def _host_array(x) -> bool:
    """Whether x (or an element of a tuple or list of them) is host data CuPy would upload to combine
    it with a device array (an index array, an assigned value); host scalars are kernel arguments."""
    if isinstance(x, (list, tuple)):
        return any(_host_array(v) for v in x)
    return isinstance(x, np.ndarray) and not isinstance(x, DeviceArray)


def _uploads(name: str, *xs) -> None:
    rt = DeviceArray._rt  # NumPy's own calls inside a device function (depth > 0) are not the caller's
    if rt is not None and not rt._depth and any(_host_array(x) for x in xs):
        rt._op("upload", name)


def _bases(x):
    if isinstance(x, dict):
        return {k: _bases(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_bases(v) for v in x)
    return _base(x)


class _DeviceNumpy(_PoisonNumpy):
    """`xp` of a RecordingRuntime: NumPy whose arrays are DeviceArrays; making one from host data
    is an upload, filling one a kernel (memset), an empty one only an allocation."""

    def __init__(self, rt: RecordingRuntime) -> None:
        super().__init__()
        self._rt = rt

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def _new(self, a: np.ndarray, what: str | None) -> DeviceArray:
        self._rt._op("alloc", what or "empty")
        if what is not None:  # a fill kernel: replayed as one
            first = a.copy()
            self._rt._op("glue", what, lambda: np.copyto(a, first))
        return a.view(DeviceArray)

    def empty(self, shape, dtype=float, order="C"):
        return self._new(poison_like(shape, dtype), None)

    def empty_like(self, a, dtype=None, order="K", subok=True, shape=None):
        return self._new(
            poison_like(a.shape if shape is None else shape, a.dtype if dtype is None else dtype), None
        )

    def zeros(self, shape, dtype=float, order="C"):
        return self._new(np.zeros(shape, dtype), "zeros")

    def zeros_like(self, a, dtype=None, **kw):
        return self._new(np.zeros(a.shape, a.dtype if dtype is None else dtype), "zeros")

    def ones(self, shape, dtype=float, order="C"):
        return self._new(np.ones(shape, dtype), "ones")

    def full(self, shape, value, dtype=None, order="C"):
        return self._new(np.full(shape, value, dtype), "full")

    def arange(self, *a, **kw):
        return self._new(np.arange(*a, **kw), "arange")

    def asarray(self, a, dtype=None, order=None):
        if isinstance(a, DeviceArray):
            if dtype is None or np.dtype(dtype) == a.dtype:
                return a
            return a.astype(dtype)
        self._rt._op("upload", "asarray")
        self._rt._op("alloc", "asarray")
        return np.array(a, dtype=dtype).view(DeviceArray)

    def array(self, a, dtype=None, copy=True, order="K"):
        if isinstance(a, DeviceArray):
            return a.astype(a.dtype if dtype is None else dtype) if copy else self.asarray(a, dtype)
        return self.asarray(a, dtype)

    def ascontiguousarray(self, a, dtype=None):
        if not isinstance(a, DeviceArray):
            return np.ascontiguousarray(self.asarray(a, dtype)).view(DeviceArray)
        if a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
            return a
        self._rt._op("alloc", "ascontiguousarray")
        base = a.view(np.ndarray)
        out = np.ascontiguousarray(base, dtype=dtype)
        self._rt._op("glue", "ascontiguousarray", lambda: np.copyto(out, base, casting="unsafe"))
        return out.view(DeviceArray)


class EmuGraph:
    """A captured region on the emulator: the kernels and GEMMs it issued, replayed in order."""

    def __init__(self, rt: RecordingRuntime) -> None:
        self.rt = rt
        self.ops: list[tuple[str, Any]] = []  # (name, thunk)
        self.pool: list[Any] = []  # arrays allocated inside: the graph's private pool, kept alive
        self.replays = 0

    def release(self) -> None:
        self.ops, self.pool = None, []

    def replay(self) -> None:
        if self.ops is None:
            raise EmuCaptureError("the capture failed or was released; nothing to replay")
        self.replays += 1
        for name, thunk in self.ops:
            self.rt._count("replayed", name)
            thunk()


class RecordingRuntime(EmuRuntime):
    """EmuRuntime that counts every device operation by kind, and captures graphs as CUDA does.

    Kinds: "launch" (our kernels), "gemm" (one cuBLAS call, batched or not), "glue" (an array
    operation CuPy would launch a kernel for: arithmetic, copies, reductions, fills, casts),
    "upload", "read" (the host waits for the device), "alloc". `counts` holds the totals since
    `reset()`; `ops` the names in order. `with rt.capture() as g:` records launches and GEMMs into
    `g` without running them (as a stream capture does); a host read, an upload or an array
    operation inside raises EmuCaptureError; arrays allocated inside belong to `g.pool`.
    `g.replay()` runs the recorded work again.
    """

    def __init__(self, reverse: bool = False) -> None:
        super().__init__(reverse)
        self.xp = _DeviceNumpy(self)
        self.counts: dict[str, int] = {}
        self.ops: list[tuple[str, str]] = []
        self._depth = 0
        self._graph: EmuGraph | None = None
        self._patched: list[tuple[Any, str, Any]] = []
        DeviceArray._rt = self
        _patch_to_host()

    def reset(self) -> None:
        self.counts = {}
        self.ops = []

    def device_ops(self) -> int:
        """Operations a GPU would launch: kernels, GEMMs and array glue."""
        return sum(self.counts.get(k, 0) for k in ("launch", "gemm", "glue"))

    def _count(self, kind: str, name: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.ops.append((kind, name))

    def _op(self, kind: str, name: str, thunk=None) -> None:
        """One device operation; inside a capture, glue is recorded (`thunk` redoes it on replay)."""
        if self._graph is not None:
            if kind == "alloc":
                self._count("alloc_in_capture", name)
                return
            if kind == "glue" and thunk is not None:
                self._graph.ops.append((name, thunk))
                return
            raise EmuCaptureError(f"{kind} ({name}) inside a captured region")
        self._count(kind, name)

    # --- device work ---------------------------------------------------------------------------
    def launch(self, source, kernel, grid, block, args, shared_mem=0) -> None:
        if self._graph is not None:
            self._graph.ops.append(
                (kernel, lambda: EmuRuntime.launch(self, source, kernel, grid, block, args, shared_mem))
            )
            return
        self._count("launch", kernel)
        EmuRuntime.launch(self, source, kernel, grid, block, args, shared_mem)

    def gemm(self, a, b, out, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> None:
        check_gemm(a, b, out, trans_a, trans_b)
        base = [x.view(np.ndarray) if isinstance(x, DeviceArray) else x for x in (a, b, out)]
        kw = dict(trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        if self._graph is not None:
            self._graph.ops.append(("gemm", lambda: EmuRuntime.gemm(self, *base, **kw)))
            return
        self._count("gemm", "gemm")
        EmuRuntime.gemm(self, *base, **kw)

    def gemm_batched(self, a, b, out, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> None:
        from engine.kernels.runtime import check_gemm_batched

        check_gemm_batched(a, b, out)
        base = [x.view(np.ndarray) if isinstance(x, DeviceArray) else x for x in (a, b, out)]
        kw = dict(trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)

        def run():
            for i in range(base[2].shape[0]):
                EmuRuntime.gemm(self, base[0][i], base[1][i], base[2][i], **kw)

        if self._graph is not None:
            self._graph.ops.append(("gemm_batched", run))
            return
        self._count("gemm", "gemm_batched")
        run()

    def gemm_indexed(self, a, b, index, out, *, trans_b=False, alpha=1.0, beta=0.0) -> None:
        """One cuBLAS call (pointer arrays built on the device): the index is read at run time, on
        the device, never by the host."""
        check_gemm_indexed(a, b, index, out, trans_b)
        a_, b_, idx, out_ = (
            x.view(np.ndarray) if isinstance(x, DeviceArray) else x for x in (a, b, index, out)
        )
        kw = dict(trans_b=trans_b, alpha=alpha, beta=beta)

        def run():
            for t in range(out_.shape[0]):
                EmuRuntime.gemm(self, a_[t], b_[int(idx[t])], out_[t], **kw)

        if self._graph is not None:
            self._graph.ops.append(("gemm_indexed", run))
            return
        self._count("gemm", "gemm_indexed")
        run()

    def upload(self, dst, host) -> None:
        self._op("upload", "upload")
        host = np.ascontiguousarray(host, dtype=dst.dtype)
        if host.shape != tuple(dst.shape):
            raise ValueError(f"upload of {host.shape} into {tuple(dst.shape)}")
        dst.view(np.ndarray)[...] = host

    def read(self, *arrays):
        self._op("read", "read")
        return [np.array(a.view(np.ndarray) if isinstance(a, DeviceArray) else a) for a in arrays]

    # --- capture -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self):
        if self._graph is not None:
            raise EmuCaptureError("a capture is already under way")
        graph = EmuGraph(self)
        self._graph = graph
        _patch_to_host()
        try:
            yield graph
        except CaptureError as exc:
            graph.ops = None
            if exc.graph is None:
                exc.graph = graph  # released by the caller once the failed work's arrays are gone
            raise
        except Exception as exc:  # as the CUDA runtime: any failure inside is a CaptureError
            graph.ops = None
            raise EmuCaptureError(f"{type(exc).__name__}: {exc}", graph) from exc
        except BaseException:
            graph.ops = None
            raise
        finally:
            self._graph = None
        self._count("capture", "capture")


def _patch_to_host() -> None:
    """The engine's `to_host` of a DeviceArray is a read of the device: counted by the runtime that
    is active, an error inside a capture. (Modules that imported `to_host` by name get the counting
    version too; it behaves as the original for every other array.)"""
    import sys

    from engine.kernels import runtime as rt_mod

    original = getattr(rt_mod.to_host, "__wrapped__", rt_mod.to_host)

    def to_host(a):
        if isinstance(a, DeviceArray) and DeviceArray._rt is not None:
            DeviceArray._rt._op("read", "to_host")
            return np.array(a.view(np.ndarray))
        return original(a)

    to_host.__wrapped__ = original  # type: ignore[attr-defined]
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("engine") and getattr(mod, "to_host", None) is not None:
            if getattr(mod.to_host, "__wrapped__", mod.to_host) is original:
                mod.to_host = to_host
