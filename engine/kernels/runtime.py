"""Where a CUDA twin runs: the `Runtime` its host code is written against, the GPU's, and the one current.

Every op module writes its CUDA twin's host side once, as `<op>_on(rt, ...)`, against a `Runtime`:
the array module `xp`, kernel launches and fp32-accumulating matrix products. `CudaRuntime`
(`cuda_runtime()`, `runtime_for(x)`) is the GPU: CuPy arrays, kernels compiled by NVRTC
(`engine.kernels.nvrtc.get_kernel`), cuBLAS `cublasGemmEx` with bf16 or fp32 operands. The public
twin `<op>(...)` of a module is `<op>_on(runtime_for(x), ...)`. tests/kernels gives the same host code
a runtime that is NumPy with the kernels built by g++ (tests/kernels/emu_runtime.py), so the whole
twin (buffers, launch shapes, argument order and C types, chunking loops) runs without a GPU.

`use_runtime(rt)` makes `rt` the runtime of this thread, which `engine.model.ops` reads to run each op
on its twin (`Backend.active()` enters it on a GPU); it lives here, below the model and the backend,
so that both can reach it. `array_module` and `to_host` tell NumPy from CuPy arrays without importing
CuPy, for kernels and model code alike.

What it is not: no kernels and no CUDA C++ live here. Importing this module needs neither CuPy nor
NVRTC nor a GPU; CuPy is imported when a `CudaRuntime` is made.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import EngineError
from .nvrtc import KernelSource, get_kernel

_RUNTIME: contextvars.ContextVar[Any] = contextvars.ContextVar("engine_runtime", default=None)


@contextlib.contextmanager
def use_runtime(rt: Any) -> Iterator[Any]:
    """Inside, `rt` is the runtime of this thread: every op of engine.model.ops runs its twin on it."""
    token = _RUNTIME.set(rt)
    try:
        yield rt
    finally:
        _RUNTIME.reset(token)


def current_runtime() -> Any:
    """The runtime ops run on in this thread, or None (references, or twins on CuPy arguments)."""
    return _RUNTIME.get()


def to_host(a: Any) -> np.ndarray:
    """A NumPy array of any array (CuPy arrays are copied to the host), or of a Python scalar."""
    get = getattr(a, "get", None)
    if get is not None and type(a).__module__.startswith("cupy"):
        return get()
    return np.asarray(a)


def array_module(a: Any) -> ModuleType:
    """numpy or cupy, whichever `a` belongs to (cupy.get_array_module without importing CuPy)."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


# cudaDataType and cublasComputeType_t values (cuda_runtime library_types.h, cublas_api.h)
CUDA_R_32F = 0
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_PEDANTIC = 69
CUBLAS_GEMM_DEFAULT = -1
STATIC_SMEM_LIMIT = 48 * 1024  # dynamic shared memory a kernel gets without opting in
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute (cuda.h)


class Runtime:
    """Where a CUDA twin runs: `xp` (its array module), kernel launches and fp32-accumulating GEMMs.

    Arrays are `xp` arrays. bfloat16 data is held as uint16 bit patterns (CuPy has no bfloat16).
    """

    xp: Any

    def launch(
        self,
        source: KernelSource,
        kernel: str,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        args: tuple,
        shared_mem: int = 0,
    ) -> None:
        """Run `kernel` of `source`: args are arrays (pointers) and NumPy scalars of the exact C types."""
        raise NotImplementedError

    def gemm(
        self,
        a: Any,
        b: Any,
        out: Any,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        alpha: float = 1.0,
        beta: float = 0.0,
    ) -> None:
        """out = alpha * op(a) @ op(b) + beta * out, row-major, op(x) = x.T when trans_x.

        a, b: 2-D with unit inner stride (rows may be strided), both float32 (fp32 products and
        sums) or both bf16 bits as uint16 (bf16 products, fp32 accumulation). out (M, N): float32,
        or with bf16 operands bf16 bits (uint16: the fp32 result rounded once, nearest-even; beta
        reads out widened); unit inner stride, rows may be strided (a block of columns of a wider
        buffer). beta = 0 never reads out (it may hold NaN).
        """
        raise NotImplementedError

    def gemm_batched(
        self,
        a: Any,
        b: Any,
        out: Any,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        alpha: float = 1.0,
        beta: float = 0.0,
    ) -> None:
        """out[i] = alpha * op(a[i]) @ op(b[i]) + beta * out[i] for every i: `gemm` on 3-D arrays
        with one leading batch axis each (any batch stride, 0 too). This default runs one `gemm`
        per matrix; the GPU's is one strided-batched cuBLAS call."""
        check_gemm_batched(a, b, out)
        for i in range(out.shape[0]):
            self.gemm(a[i], b[i], out[i], trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)

    def gemm_indexed(
        self,
        a: Any,
        b: Any,
        index: Any,
        out: Any,
        *,
        trans_b: bool = False,
        alpha: float = 1.0,
        beta: float = 0.0,
    ) -> None:
        """out[t] = alpha * a[t] @ op(b[index[t]]) + beta * out[t] for every t (op(x) = x.T when
        trans_b): a batch of products whose right operand is picked from a stack by an int32 index
        array on the device (the grouped GEMM of MoE experts over fixed-size row tiles), with no host
        read of the index. a (T, m, k) and out (T, m, n) may be row-strided views; b (E, n, k) or
        (E, k, n); operands as for `gemm` (float32, or bf16 bits with fp32 accumulation)."""
        raise NotImplementedError

    def address(self, a: Any) -> int:
        """The address of a's first element (for pointer tables and alignment checks)."""
        raise NotImplementedError

    # --- what a captured step needs: static inputs, one read, a graph --------------------------
    def upload(self, dst: Any, host: np.ndarray) -> None:
        """Copy host values into the existing device array `dst` (same shape; cast to its dtype),
        in stream order: how a captured step's static input buffers are filled before a replay."""
        raise NotImplementedError

    def read(self, *arrays: Any) -> list[np.ndarray]:
        """Host copies of device arrays: waits for the device (the one read at a step's end)."""
        return [to_host(a) for a in arrays]

    def capture(self) -> contextlib.AbstractContextManager[Graph]:
        """`with rt.capture() as graph:` records the device work issued inside (kernels, GEMMs,
        array operations, allocations from a private pool the graph keeps) instead of doing it;
        `graph.replay()` then runs it again, as often as wanted, with no host code. Inside, a host
        read or an upload is an error (CaptureError). A runtime that cannot capture raises
        CaptureError at once, saying why."""
        raise CaptureError(f"{type(self).__name__} cannot capture device work as a graph")


class CaptureError(RuntimeError):
    """Device work cannot be captured as a graph (or did something a graph cannot hold). `graph`: the
    failed capture's graph, whose `release()` gives its memory back once the work's arrays are gone
    (after the handler: the exception's frames hold them), or None."""

    def __init__(self, message: str, graph: Graph | None = None) -> None:
        super().__init__(message)
        self.graph = graph


class Graph:
    """Captured device work (`Runtime.capture`): `replay()` runs it on the runtime's stream;
    `release()` gives back what it holds (nothing replays it after)."""

    def replay(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError


def check_gemm(a: Any, b: Any, out: Any, trans_a: bool, trans_b: bool) -> tuple[int, int, int]:
    """(M, N, K) of a GEMM after checking shapes, dtypes and layouts (ValueError naming them)."""
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
        raise ValueError(f"gemm takes 2-D arrays, got {a.shape}, {b.shape} -> {out.shape}")
    M, K = (a.shape[1], a.shape[0]) if trans_a else a.shape
    K2, N = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if K != K2 or tuple(out.shape) != (M, N):
        raise ValueError(f"gemm shapes do not agree: op(a) {M}x{K}, op(b) {K2}x{N}, out {tuple(out.shape)}")
    if a.dtype != b.dtype or a.dtype.name not in ("float32", "uint16"):
        raise ValueError(
            f"gemm takes float32 or bf16 (uint16) operands of one kind, got {a.dtype}, {b.dtype}"
        )
    if out.dtype.name not in ("float32", "uint16") or (
        out.dtype.name == "uint16" and a.dtype.name != "uint16"
    ):
        raise ValueError(
            f"gemm writes float32 (or bf16 bits from bf16 operands), got {out.dtype} from {a.dtype}"
        )
    for name, x in (("a", a), ("b", b), ("out", out)):
        if x.strides[1] != x.itemsize or (x.shape[0] > 1 and x.strides[0] < x.shape[1] * x.itemsize):
            raise ValueError(f"gemm operand {name} needs unit inner stride, got strides {x.strides}")
    return int(M), int(N), int(K)


def check_gemm_batched(a: Any, b: Any, out: Any) -> int:
    """The batch count of `gemm_batched`'s operands (ValueError unless each is 3-D with the same
    first axis, out's batch contiguous); each matrix is then checked as `check_gemm` checks it."""
    if a.ndim != 3 or b.ndim != 3 or out.ndim != 3 or not (a.shape[0] == b.shape[0] == out.shape[0]):
        raise ValueError(
            f"gemm_batched takes 3-D arrays of one batch, got {a.shape}, {b.shape} -> {out.shape}"
        )
    if not out.flags.c_contiguous or out.dtype.name != "float32":
        raise ValueError(f"gemm_batched writes a C-contiguous out (float32), got {out.dtype} {out.strides}")
    return int(out.shape[0])


def check_gemm_indexed(a: Any, b: Any, index: Any, out: Any, trans_b: bool) -> tuple[int, int, int, int]:
    """(T, m, n, k) of `gemm_indexed`'s operands after checking them (ValueError naming what is wrong)."""
    if a.ndim != 3 or b.ndim != 3 or out.ndim != 3 or index.ndim != 1:
        raise ValueError(f"gemm_indexed takes a, b, out 3-D and index 1-D; got {a.shape}, {b.shape}, "
                         f"{out.shape}, {index.shape}")  # fmt: skip
    T, m, k = a.shape
    n = b.shape[1] if trans_b else b.shape[2]
    if (b.shape[2] if trans_b else b.shape[1]) != k or tuple(out.shape) != (T, m, n) or index.shape[0] != T:
        raise ValueError(f"gemm_indexed shapes do not agree: a {a.shape}, b {b.shape} (trans_b {trans_b}), "
                         f"index {index.shape}, out {out.shape}")  # fmt: skip
    if index.dtype.name != "int32":
        raise ValueError(f"gemm_indexed index must be int32, got {index.dtype}")
    for name, x in (("a", a[0]), ("b", b[0]), ("out", out[0])):
        if x.strides[1] != x.itemsize:
            raise ValueError(f"gemm_indexed operand {name} needs unit inner stride, got strides {x.strides}")
    if a.dtype != b.dtype or a.dtype.name not in ("float32", "uint16") or out.dtype.name != "float32":
        raise ValueError(f"gemm_indexed takes float32 or bf16 (uint16) operands and a float32 out; got "
                         f"{a.dtype}, {b.dtype} -> {out.dtype}")  # fmt: skip
    return int(T), int(m), int(n), int(k)


class CudaRuntime(Runtime):
    """The GPU: CuPy arrays, kernels through `get_kernel`, GEMMs through cuBLAS `cublasGemmEx` on the
    current stream (bf16 operands: CUBLAS_COMPUTE_32F, tensor cores with fp32 accumulation; fp32
    operands: CUBLAS_COMPUTE_32F_PEDANTIC, true fp32, never TF32)."""

    def __init__(self) -> None:
        import cupy

        self.xp = cupy
        self._smem_optin: dict[int, int] = {}  # id of a loaded kernel -> dynamic shared memory allowed
        self._workspace: Any = None  # cuBLAS's workspace, set once before any capture
        self._handles: dict[int, tuple[CublasLib, int]] = {}  # device -> (library, CuPy's handle)

    def upload(self, dst: Any, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host, dtype=dst.dtype)
        if host.shape != tuple(dst.shape) or not dst.flags.c_contiguous:
            raise ValueError(
                f"upload of {host.shape} into {tuple(dst.shape)} (contiguous: {dst.flags.c_contiguous})"
            )
        dst.set(host)  # an asynchronous copy on the current stream when the host memory allows

    def capture(self):
        return _cuda_capture(self)

    def launch(self, source, kernel, grid, block, args, shared_mem=0) -> None:
        if min(grid) <= 0:
            return
        fn = get_kernel(source, kernel)
        if shared_mem > STATIC_SMEM_LIMIT and self._smem_optin.get(id(fn), 0) < shared_mem:
            # above 48 KB a kernel must opt in to its dynamic shared memory, once per size
            self.xp.cuda.driver.funcSetAttribute(
                fn.ptr, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem
            )
            self._smem_optin[id(fn)] = shared_mem
        fn(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)

    def address(self, a: Any) -> int:
        return int(a.data.ptr)

    def gemm(self, a, b, out, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> None:
        M, N, K = check_gemm(a, b, out, trans_a, trans_b)
        self._cublas(a, b, out, None, M, N, K, trans_a, trans_b, alpha, beta)

    def gemm_batched(self, a, b, out, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> None:
        count = check_gemm_batched(a, b, out)
        if count == 0:
            return
        M, N, K = check_gemm(a[0], b[0], out[0], trans_a, trans_b)
        self._cublas(a, b, out, count, M, N, K, trans_a, trans_b, alpha, beta)

    def gemm_indexed(self, a, b, index, out, *, trans_b=False, alpha=1.0, beta=0.0) -> None:
        """cublasGemmBatchedEx over pointer arrays built on the device (a[t], b[index[t]], out[t]):
        asynchronous, no host read of `index`, capturable in a CUDA graph (through `cublas_lib()`,
        as `_cublas`: CuPy's binding refuses every cuBLAS call while a stream is captured)."""
        T, M, N, K = check_gemm_indexed(a, b, index, out, trans_b)
        if T == 0 or M == 0 or N == 0:
            return
        xp = self.xp
        steps = xp.arange(T, dtype=xp.int64)
        ptr_a = steps * a.strides[0] + a.data.ptr
        ptr_c = steps * out.strides[0] + out.data.ptr
        ptr_b = index.astype(xp.int64) * b.strides[0] + b.data.ptr
        bf16 = a.dtype.name == "uint16"
        dtype = CUDA_R_16BF if bf16 else CUDA_R_32F
        compute = CUBLAS_COMPUTE_32F if bf16 else CUBLAS_COMPUTE_32F_PEDANTIC
        lib, handle = self.cublas()
        lib.set_stream(handle, xp.cuda.get_current_stream().ptr)
        lib.set_pointer_mode(handle, CUBLAS_POINTER_MODE_HOST)
        alpha_h = np.array(alpha, dtype=np.float32)
        beta_h = np.array(beta, dtype=np.float32)
        ld = [x[0].strides[0] // x.itemsize for x in (b, a, out)]
        # column-major: out^T = op(b)^T a^T, as in _cublas
        lib.gemm_batched_ex(
            handle, CUBLAS_OP_T if trans_b else CUBLAS_OP_N, CUBLAS_OP_N, N, M, K,
            alpha_h.ctypes.data, ptr_b.data.ptr, dtype, ld[0], ptr_a.data.ptr, dtype, ld[1],
            beta_h.ctypes.data, ptr_c.data.ptr, CUDA_R_32F, ld[2], T, compute, CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip

    def _cublas(self, a, b, out, count, M, N, K, trans_a, trans_b, alpha, beta) -> None:
        """cublasGemmEx (count None: 2-D operands) or cublasGemmStridedBatchedEx (3-D, `count`), on
        the current stream, through `cublas_lib()` (CuPy's binding refuses any cuBLAS call while a
        stream is being captured; the library itself captures them)."""
        if M == 0 or N == 0:
            return
        if K == 0:
            if beta == 0.0:
                out.fill(0)
            else:
                out *= np.float32(beta)
            return
        bf16 = a.dtype.name == "uint16"
        dtype = CUDA_R_16BF if bf16 else CUDA_R_32F
        out_type = CUDA_R_16BF if out.dtype.name == "uint16" else CUDA_R_32F
        compute = CUBLAS_COMPUTE_32F if bf16 else CUBLAS_COMPUTE_32F_PEDANTIC
        lib, handle = self.cublas()
        lib.set_stream(handle, self.xp.cuda.get_current_stream().ptr)
        lib.set_pointer_mode(handle, CUBLAS_POINTER_MODE_HOST)  # CuPy's own calls may have changed it
        alpha_h = np.array(alpha, dtype=np.float32)
        beta_h = np.array(beta, dtype=np.float32)
        row = 0 if count is None else 1  # the axis of the matrices' rows
        ops = (CUBLAS_OP_T if trans_b else CUBLAS_OP_N, CUBLAS_OP_T if trans_a else CUBLAS_OP_N)
        # cuBLAS is column-major: out^T (N x M) = op(b)^T (N x K) @ op(a)^T (K x M), and a row-major
        # matrix is its transpose in column-major, so b goes first and each op flips
        ld = [x.strides[row] // x.itemsize for x in (b, a, out)]
        if count is None:
            lib.gemm_ex(
                handle, *ops, N, M, K, alpha_h.ctypes.data,
                b.data.ptr, dtype, ld[0], a.data.ptr, dtype, ld[1],
                beta_h.ctypes.data, out.data.ptr, out_type, ld[2], compute, CUBLAS_GEMM_DEFAULT,
            )  # fmt: skip
        else:
            st = [x.strides[0] // x.itemsize for x in (b, a, out)]
            lib.gemm_strided_batched_ex(
                handle, *ops, N, M, K, alpha_h.ctypes.data,
                b.data.ptr, dtype, ld[0], st[0], a.data.ptr, dtype, ld[1], st[1],
                beta_h.ctypes.data, out.data.ptr, out_type, ld[2], st[2], count, compute,
                CUBLAS_GEMM_DEFAULT,
            )  # fmt: skip

    def cublas(self) -> tuple[CublasLib, int]:
        """The cuBLAS library (ctypes) and CuPy's handle of the current device. GEMMs take their
        scalars in host pointer mode (alpha, beta from host memory: a captured GEMM keeps the values
        it was given)."""
        dev = self.xp.cuda.Device().id
        got = self._handles.get(dev)
        if got is None:
            handle = self.xp.cuda.device.get_cublas_handle()
            lib = cublas_lib()
            got = self._handles[dev] = (lib, handle)
        return got


CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_POINTER_MODE_HOST = 0


class CublasLib:
    """The few cuBLAS entry points the runtime calls, through ctypes on the libcublas that CuPy
    loaded (the same library, so CuPy's handle is valid here). Every call checks its status."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        vp, i, ll, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_size_t
        self._fns = {}
        sigs = {
            "cublasSetStream_v2": [vp, vp],
            "cublasSetPointerMode_v2": [vp, i],
            "cublasSetWorkspace_v2": [vp, vp, sz],
            "cublasGemmEx": [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i],
            "cublasGemmStridedBatchedEx": [
                vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll, i, i, i,
            ],
            "cublasGemmBatchedEx": [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i, i],
        }  # fmt: skip
        for name, argtypes in sigs.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:  # a cuBLAS exporting the name without its _v2 suffix
                fn = getattr(lib, name.removesuffix("_v2"))
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
            self._fns[name] = fn

    def _call(self, name: str, *args) -> None:
        status = self._fns[name](*args)
        if status != 0:
            raise EngineError(f"{name} failed with cuBLAS status {status}")

    def set_stream(self, handle: int, stream: int) -> None:
        self._call("cublasSetStream_v2", handle, stream)

    def set_pointer_mode(self, handle: int, mode: int) -> None:
        self._call("cublasSetPointerMode_v2", handle, mode)

    def set_workspace(self, handle: int, ptr: int, nbytes: int) -> None:
        self._call("cublasSetWorkspace_v2", handle, ptr, nbytes)

    def gemm_ex(self, *args) -> None:
        self._call("cublasGemmEx", *args)

    def gemm_strided_batched_ex(self, *args) -> None:
        self._call("cublasGemmStridedBatchedEx", *args)

    def gemm_batched_ex(self, *args) -> None:
        self._call("cublasGemmBatchedEx", *args)


@functools.lru_cache(maxsize=1)
def cublas_lib() -> CublasLib:
    """The libcublas mapped into this process (CuPy loaded it with its first handle; dlopen of the
    same path returns that library)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = sorted({line.split()[-1] for line in f if "/libcublas.so" in line})
    except OSError:
        paths = []
    if not paths:
        found = ctypes.util.find_library("cublas")
        paths = [found] if found else []
    if not paths:
        raise EngineError("the cuBLAS library CuPy uses was not found in this process")
    return CublasLib(ctypes.CDLL(paths[0]))


CUBLAS_WORKSPACE_BYTES = 32 << 20  # cuBLAS's workspace for captured GEMMs (it allocates none itself then)


class CudaGraph(Graph):
    """A CUDA graph captured from a private stream, with the memory pool its buffers came from
    (kept alive and used by nothing else, so no buffer the graph reads is ever handed out again)."""

    def __init__(self, graph: Any, stream: Any, pool: Any) -> None:
        self.graph, self.stream, self.pool = graph, stream, pool

    def release(self) -> None:
        """Drop the graph and give its pool's free memory back to the device: the temporaries of the
        captured work (tens of GB on a large MoE step). Dropping the pool is not enough: CuPy 14's
        pool frees its free blocks only in `free_all_blocks` (its arenas and their free chunks hold
        each other, `cupy/cuda/memory.pyx`), so a pool let go keeps them; seen as ~34 GiB still
        used after a captured 48-layer run on an H200."""
        pool, self.graph, self.pool = self.pool, None, None
        if pool is not None:
            pool.free_all_blocks()

    def replay(self) -> None:
        import cupy

        # the replay runs after what the current stream holds (the static inputs' uploads) and
        # before what comes next on it (the read of the step's scalars)
        current = cupy.cuda.get_current_stream()
        self.stream.wait_event(current.record())
        self.graph.launch(stream=self.stream)
        current.wait_event(self.stream.record())


@contextlib.contextmanager
def _cuda_capture(rt: CudaRuntime) -> Iterator[CudaGraph]:
    import cupy

    lib, handle = rt.cublas()
    if rt._workspace is None:  # its own allocation: one carved from a pool block would pin the block
        rt._workspace = cupy.cuda.Memory(CUBLAS_WORKSPACE_BYTES)
        lib.set_workspace(handle, rt._workspace.ptr, CUBLAS_WORKSPACE_BYTES)
    stream = cupy.cuda.Stream(non_blocking=True)
    current = cupy.cuda.get_current_stream()
    stream.wait_event(current.record())  # what was queued before (weights, inputs) comes first
    holder = CudaGraph(None, stream, cupy.cuda.MemoryPool())  # the one owner of the graph's pool
    try:
        with stream, cupy.cuda.using_allocator(holder.pool.malloc):
            # relaxed: a first use inside the capture (a module load, the pool growing) is not an error
            mode = getattr(cupy.cuda.runtime, "streamCaptureModeRelaxed", None)
            stream.begin_capture() if mode is None else stream.begin_capture(mode=mode)
            try:
                yield holder
            finally:
                graph = stream.end_capture()  # raises when something inside broke the capture
    except Exception as exc:  # the caller releases the graph's pool once these frames are gone
        raise CaptureError(f"{type(exc).__name__}: {exc}", holder) from exc
    holder.graph = graph
    current.wait_event(stream.record())


@functools.lru_cache(maxsize=1)
def cuda_runtime() -> CudaRuntime:
    """The GPU runtime (one per process; kernels and cuBLAS act on the current device and stream)."""
    return CudaRuntime()


def runtime_for(x: Any, op: str = "this op") -> Runtime:
    """The GPU runtime for a CuPy array; TypeError naming `op`'s NumPy reference for anything else."""
    if not type(x).__module__.startswith("cupy"):
        raise TypeError(f"{op} runs on CuPy arrays, got {type(x).__name__}; use {op}_ref for NumPy arrays")
    return cuda_runtime()


def f32_input(rt: Runtime, a: Any, what: str) -> Any:
    """`a` as a C-contiguous float32 device array (a copy only when it is not one); a host array is
    copied to the device; another dtype is a ValueError naming `what`."""
    xp = rt.xp
    a = xp.asarray(a)  # a host array goes to the device; a device array stays as it is
    if a.dtype.name != "float32":
        raise ValueError(f"{what} must be float32 on the GPU path, got {a.dtype} (shape {tuple(a.shape)})")
    return xp.ascontiguousarray(a)


def aligned16(rt: Runtime, *arrays: Any) -> bool:
    """Whether every array starts on a 16-byte boundary (float4 / uint4 loads and stores)."""
    return all(rt.address(a) % 16 == 0 for a in arrays if a is not None)
