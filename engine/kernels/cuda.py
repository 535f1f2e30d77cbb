"""Compiling and loading the engine's CUDA C++ kernels: NVRTC, the source registry, a per-device cache.

What it is:
- `KernelSource`: how a kernel module (`engine/kernels/<op>.py`) declares its CUDA C++ source and the
  `extern "C"` kernels in it, as a module-level tuple `SOURCES`; `all_sources()` collects every
  module's, so that one test compiles them all on any machine.
- `compile_ptx_or_cubin(code, name, arch)`: NVRTC, with no GPU and no driver needed. NVRTC is found
  through CuPy's own binding when CuPy is importable, else through ctypes on a `libnvrtc.so` from the
  `nvidia-cuda-nvrtc` wheels (CUDA 13: `nvidia/cu13/lib`; CUDA 12: `nvidia/cuda_nvrtc/lib`) or a
  system CUDA (`$CUDA_PATH`, `$CUDA_HOME`, `/usr/local/cuda*`). `cuda_fp16.h` and `cuda_bf16.h` come
  from the `nvidia-cuda-runtime` wheels' `include` folder or the system CUDA. Errors and warnings
  alike raise `KernelCompileError` carrying NVRTC's log (the compile test holds every source to
  that); `get_kernel`, which may meet another NVRTC version on a user's machine, logs warnings.
- `get_kernel(source, name)`: the launchable kernel on the current CUDA device, compiled once per
  device through the same `compile_ptx_or_cubin` (a cubin for the device's own architecture, or PTX
  for the driver to finish when NVRTC is older than the GPU) and loaded with CuPy's
  `cupy.cuda.function.Module`. Not `cupy.RawModule`: CuPy adds `-ftz=true` to every RawModule,
  which flushes subnormal floats to zero, and kernels here promise bit-exact float32 results.
- `Runtime`: what a CUDA twin's host code (`<op>_on(rt, ...)` in each op module) runs against: an
  array module, kernel launches, fp32-accumulating GEMMs. `CudaRuntime` (`cuda_runtime()`,
  `runtime_for(x)`) is the GPU: CuPy, `get_kernel`, cuBLAS `cublasGemmEx` (bf16 or fp32 operands);
  tests/kernels runs the same host code on NumPy with the kernels built by g++. `DEVICE_HELPERS`
  is CUDA C++ the sources share (warp and block reductions, bf16 bits).

What it is not: no kernels live here, and nothing here touches arrays. Importing this module needs
neither CuPy nor NVRTC nor a GPU; they are looked for on first use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import importlib
import importlib.util
import logging
import os
import pkgutil
import platform
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import EngineError

log = logging.getLogger(__name__)


class CudaToolkitError(EngineError):
    """NVRTC or the CUDA headers cannot be found or loaded."""


class KernelCompileError(EngineError):
    """NVRTC rejected a kernel source, or compiled it with warnings; `log` is NVRTC's own text."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message + (f"\n--- NVRTC log ---\n{log.rstrip()}" if log.strip() else ""))
        self.log = log


@dataclass(frozen=True)
class KernelSource:
    """One CUDA C++ translation unit of a kernel module, and the kernels it defines."""

    name: str  # unique across the package, e.g. "dequant"; names the NVRTC program and the cache entry
    code: str  # CUDA C++; every kernel is `extern "C" __global__` so that its name is not mangled
    kernels: tuple[str, ...]  # the kernel names `get_kernel` may be asked for
    options: tuple[str, ...] = ()  # extra NVRTC options, e.g. ("-DTILE=256",); no -arch, no -I


# ----------------------------------------------------------------------------------------------
# registry


def all_sources() -> tuple[KernelSource, ...]:
    """Every `KernelSource` that a module of `engine.kernels` declares in its `SOURCES` tuple."""
    from . import __path__ as package_path

    found: list[KernelSource] = []
    for info in sorted(pkgutil.iter_modules(package_path), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "cuda":
            continue
        module = importlib.import_module(f"{__package__}.{info.name}")
        for src in getattr(module, "SOURCES", ()):
            if not isinstance(src, KernelSource):
                raise TypeError(f"{module.__name__}.SOURCES holds {type(src).__name__}, not KernelSource")
            found.append(src)
    names = [s.name for s in found]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"kernel source names must be unique; repeated: {', '.join(dupes)}")
    return tuple(found)


# ----------------------------------------------------------------------------------------------
# finding NVRTC and the headers


def _nvidia_wheel_dirs() -> list[str]:
    """The folders of the `nvidia` namespace package the CUDA wheels install into (may be several)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [p for p in spec.submodule_search_locations if os.path.isdir(p)]


def _system_cuda_roots() -> list[str]:
    roots = [os.environ.get("CUDA_PATH", ""), os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    roots += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    out: list[str] = []
    for r in roots:
        if r and os.path.isdir(r) and os.path.realpath(r) not in {os.path.realpath(o) for o in out}:
            out.append(r)
    return out


def _nvrtc_library_candidates() -> list[str]:
    """Paths of libnvrtc to try with ctypes, the pip wheels first (newest CUDA first), then the system."""
    paths: list[str] = []
    for base in _nvidia_wheel_dirs():
        # CUDA 13 wheels share nvidia/cu13/lib; CUDA 12 wheels have nvidia/cuda_nvrtc/lib
        for sub in ("cu13/lib", "cu13/bin", "cuda_nvrtc/lib", "cuda_nvrtc/bin"):
            paths += sorted(glob.glob(os.path.join(base, sub, "libnvrtc.so.*")), reverse=True)
            paths += sorted(glob.glob(os.path.join(base, sub, "nvrtc64_*.dll")), reverse=True)
    for root in _system_cuda_roots():
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib", "bin"):
            paths += sorted(glob.glob(os.path.join(root, sub, "libnvrtc.so*")), reverse=True)
            paths += sorted(glob.glob(os.path.join(root, sub, "nvrtc64_*.dll")), reverse=True)
    found = ctypes.util.find_library("nvrtc")
    if found:
        paths.append(found)
    # builtins and the .alt variant are helper libraries, not the API
    keep = [p for p in paths if "builtins" not in os.path.basename(p) and ".alt." not in p]
    return list(dict.fromkeys(keep))


def _header_major(include_dir: str) -> int | None:
    """The CUDA major version of a header folder, from CUDART_VERSION in cuda_runtime_api.h."""
    try:
        with open(os.path.join(include_dir, "cuda_runtime_api.h"), encoding="utf-8", errors="replace") as f:
            m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    return int(m.group(1)) // 1000 if m else None


def _include_dir_candidates() -> list[str]:
    dirs: list[str] = []
    for base in _nvidia_wheel_dirs():
        dirs += [os.path.join(base, "cu13", "include"), os.path.join(base, "cuda_runtime", "include")]
    for root in _system_cuda_roots():
        dirs += [os.path.join(root, "include"), os.path.join(root, "targets", "x86_64-linux", "include")]
    return [d for d in dict.fromkeys(dirs) if os.path.isfile(os.path.join(d, "cuda_bf16.h"))]


def cuda_include_dir(major: int | None = None) -> str | None:
    """A folder holding cuda_fp16.h and cuda_bf16.h, preferring CUDA `major`; None when there is none."""
    dirs = _include_dir_candidates()
    if major is not None:
        for d in dirs:
            if _header_major(d) == major:
                return d
    return dirs[0] if dirs else None


class _CtypesNvrtc:
    """NVRTC's C API through ctypes."""

    def __init__(self, path: str):
        self.path = path
        self._lib = lib = ctypes.CDLL(path)
        vp, sz, ci = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        lib.nvrtcCreateProgram.argtypes = [
            ctypes.POINTER(vp),
            ctypes.c_char_p,
            ctypes.c_char_p,
            ci,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_char_p),
        ]
        lib.nvrtcCompileProgram.argtypes = [vp, ci, ctypes.POINTER(ctypes.c_char_p)]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(vp)]
        for fn in ("nvrtcGetProgramLogSize", "nvrtcGetPTXSize", "nvrtcGetCUBINSize"):
            getattr(lib, fn).argtypes = [vp, ctypes.POINTER(sz)]
        for fn in ("nvrtcGetProgramLog", "nvrtcGetPTX", "nvrtcGetCUBIN"):
            getattr(lib, fn).argtypes = [vp, ctypes.c_char_p]
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ci(), ci()
        self._check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)
        n = ci()
        self._check(lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
        archs = (ci * n.value)()
        self._check(lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
        self.archs = tuple(int(a) for a in archs)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            text = self._lib.nvrtcGetErrorString(status) or b"?"
            raise CudaToolkitError(f"{what} failed in {self.path}: {text.decode()} ({status})")

    def _get(self, prog: ctypes.c_void_p, size_fn: str, get_fn: str) -> bytes:
        n = ctypes.c_size_t()
        self._check(getattr(self._lib, size_fn)(prog, ctypes.byref(n)), size_fn)
        buf = ctypes.create_string_buffer(n.value)
        self._check(getattr(self._lib, get_fn)(prog, buf), get_fn)
        return buf.raw[: n.value]

    def compile(self, code: str, name: str, options: Sequence[str], cubin: bool) -> tuple[bool, str, bytes]:
        prog = ctypes.c_void_p()
        self._check(
            self._lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), name.encode(), 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            opts = [o.encode() for o in options]
            arr = (ctypes.c_char_p * len(opts))(*opts)
            status = self._lib.nvrtcCompileProgram(prog, len(opts), arr)
            text = self._get(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
            text_s = text.rstrip(b"\0").decode("utf-8", errors="replace")
            if status != 0:
                return False, text_s, b""
            if cubin:
                return True, text_s, self._get(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
            return True, text_s, self._get(prog, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0")
        finally:
            self._lib.nvrtcDestroyProgram(ctypes.byref(prog))


class _CupyNvrtc:
    """NVRTC through CuPy's binding (`cupy_backends.cuda.libs.nvrtc`): the library CuPy itself uses."""

    def __init__(self, module: Any):
        self._m = module
        self.path = f"cupy_backends ({getattr(module, '__file__', '?')})"
        self.version = tuple(module.getVersion())  # loads the library: raises when it is missing
        self.archs = tuple(int(a) for a in module.getSupportedArchs())

    def compile(self, code: str, name: str, options: Sequence[str], cubin: bool) -> tuple[bool, str, bytes]:
        m = self._m
        prog = m.createProgram(code, name, (), ())
        try:
            try:
                m.compileProgram(prog, list(options))
                ok = True
            except m.NVRTCError:
                ok = False
            text = m.getProgramLog(prog)
            if not ok:
                return False, text, b""
            out = m.getCUBIN(prog) if cubin else m.getPTX(prog)
            return True, text, out.encode() if isinstance(out, str) else bytes(out)
        finally:
            m.destroyProgram(prog)


@functools.lru_cache(maxsize=1)
def _nvrtc() -> _CtypesNvrtc | _CupyNvrtc:
    tried: list[str] = []
    try:
        from cupy_backends.cuda.libs import nvrtc as cupy_nvrtc  # type: ignore[import-not-found]

        return _CupyNvrtc(cupy_nvrtc)
    except ImportError:
        tried.append("CuPy's NVRTC binding (CuPy is not installed)")
    except Exception as exc:  # noqa: BLE001 - CuPy without its NVRTC raises its own errors
        tried.append(f"CuPy's NVRTC binding ({type(exc).__name__}: {exc})")
    for path in _nvrtc_library_candidates():
        try:
            return _CtypesNvrtc(path)
        except (OSError, AttributeError, CudaToolkitError) as exc:
            tried.append(f"{path} ({exc})")
    raise CudaToolkitError(
        "NVRTC (the CUDA runtime compiler) was not found; install it with "
        "`pip install nvidia-cuda-nvrtc nvidia-cuda-runtime` (CUDA 13) or "
        "`pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12` (CUDA 12). Tried: " + "; ".join(tried)
    )


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC that `compile_ptx_or_cubin` uses; CudaToolkitError when there is none."""
    return _nvrtc().version  # type: ignore[return-value]


def nvrtc_location() -> str:
    """Where the NVRTC in use was loaded from (a path, or CuPy's binding), for messages and reports."""
    return _nvrtc().path


# ----------------------------------------------------------------------------------------------
# compiling


_ARCH = re.compile(r"(sm|compute)_(\d{2,3})[af]?")


def compile_ptx_or_cubin(
    source: str,
    name: str,
    arch: str = "sm_90",
    options: Sequence[str] = (),
    warnings_as_errors: bool = True,
) -> bytes:
    """Compile CUDA C++ `source` with NVRTC: a cubin for `arch="sm_XX"`, PTX text for "compute_XX".

    Needs no GPU. Raises KernelCompileError with NVRTC's log when the source has an error, or a
    warning (`warnings_as_errors=False` logs warnings instead), CudaToolkitError when NVRTC or the
    CUDA headers cannot be found, ValueError for an `arch` that is neither form.
    """
    if not _ARCH.fullmatch(arch):
        raise ValueError(f"arch {arch!r} is not an NVRTC target; use sm_XX (cubin) or compute_XX (PTX)")
    nv = _nvrtc()
    include = cuda_include_dir(nv.version[0])
    if include is None:
        raise CudaToolkitError(
            "the CUDA headers (cuda_fp16.h, cuda_bf16.h) were not found; install them with "
            "`pip install nvidia-cuda-runtime` (CUDA 13) or `pip install nvidia-cuda-runtime-cu12`"
        )
    opts = [f"--gpu-architecture={arch}", f"-I{include}", *options]
    ok, text, out = nv.compile(source, f"{name}.cu", opts, cubin=arch.startswith("sm_"))
    where = f"kernel source {name!r} for {arch} (NVRTC {nv.version[0]}.{nv.version[1]})"
    if not ok:
        raise KernelCompileError(f"{where} does not compile", text)
    if text.strip():
        if warnings_as_errors:
            raise KernelCompileError(f"{where} compiles with warnings", text)
        log.warning("%s compiles with warnings:\n%s", where, text.rstrip())
    if not out:
        raise KernelCompileError(f"{where}: NVRTC returned no code", text)
    return out


def compile_source(src: KernelSource, arch: str = "sm_90") -> bytes:
    """`compile_ptx_or_cubin` for a registered source, with its own options."""
    return compile_ptx_or_cubin(src.code, src.name, arch, src.options)


# ----------------------------------------------------------------------------------------------
# loading on the GPU


def get_kernel(source: KernelSource, kernel_name: str) -> Any:
    """`kernel_name` of `source`, compiled and loaded for the current CUDA device (cached per device).

    Returns CuPy's `cupy.cuda.function.Function`: call it as
    `kernel(grid, block, args, shared_mem=0, stream=None)` (stream None: the current stream), with
    NumPy scalars of the exact C types in `args`. Only for a GPU backend: it imports CuPy.
    """
    if kernel_name not in source.kernels:
        raise KeyError(
            f"kernel {kernel_name!r} is not declared by source {source.name!r}; "
            f"it declares: {', '.join(source.kernels)}"
        )
    import cupy

    return _device_kernels(source, cupy.cuda.Device().id)[kernel_name]


def device_target(compute_capability: int, nvrtc_archs: Sequence[int]) -> str:
    """The NVRTC target for a GPU: its own sm_XX when NVRTC knows it (a cubin, which also runs on a
    driver older than NVRTC), else compute_YY for the newest YY below it (PTX the driver compiles)."""
    if compute_capability in nvrtc_archs:
        return f"sm_{compute_capability}"
    older = [a for a in nvrtc_archs if a < compute_capability]
    if not older:
        raise CudaToolkitError(
            f"NVRTC supports architectures {min(nvrtc_archs)}..{max(nvrtc_archs)}, "
            f"none at or below this GPU's {compute_capability}"
        )
    return f"compute_{max(older)}"


@functools.cache
def _device_kernels(source: KernelSource, device: int) -> dict[str, Any]:
    import cupy
    from cupy.cuda import function as cupy_function

    with cupy.cuda.Device(device) as dev:
        target = device_target(int(dev.compute_capability), _nvrtc().archs)
        code = compile_ptx_or_cubin(
            source.code, source.name, target, source.options, warnings_as_errors=False
        )
        module = cupy_function.Module()
        module.load(code if target.startswith("sm_") else code + b"\0")
        kernels = {k: module.get_function(k) for k in source.kernels}
    log.debug("loaded %s on cuda:%d as %s (%d kernels)", source.name, device, target, len(kernels))
    return kernels


def platform_has_nvrtc_wheels() -> bool:
    """Whether NVIDIA publishes NVRTC wheels for this platform (Linux or Windows on x86-64/arm64)."""
    return sys.platform.startswith(("linux", "win")) and platform.machine().lower() in (
        "x86_64",
        "amd64",
        "aarch64",
        "arm64",
    )


# ----------------------------------------------------------------------------------------------
# where a CUDA twin runs
#
# Every op module writes its CUDA twin's host side once, as `<op>_on(rt, ...)`, against a
# `Runtime`: the array module, kernel launches and matrix products. `CudaRuntime` is the GPU
# (CuPy, NVRTC kernels, cuBLAS); the public twin `<op>(...)` is `<op>_on(runtime_for(x), ...)`.
# tests/kernels gives the same host code a runtime that is NumPy with the kernels built by g++
# (tests/kernels/emulate.py), so the whole twin (buffers, launch shapes, argument order and
# types, chunking loops) runs on a machine without a GPU.

# device-side helpers the kernel sources share (prepended to a source's code where it uses them)
DEVICE_HELPERS = r"""
#include <cuda_bf16.h>
#ifndef INFINITY
#define INFINITY __uint_as_float(0x7f800000u)
#endif
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// sum over the block, given to every thread; blockDim.x a multiple of 32; scratch: 32 floats of
// shared memory; deterministic (fixed order for a given block size)
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // the scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_sum(lane < nw ? scratch[lane] : 0.0f);
}
__device__ __forceinline__ double block_sum_d(double v, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_sum_d(lane < nw ? scratch[lane] : 0.0);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_max(lane < nw ? scratch[lane] : -INFINITY);
}
__device__ __forceinline__ float bf16_bits_to_f32(unsigned short b) {
    return __uint_as_float((unsigned)b << 16);
}
__device__ __forceinline__ unsigned short f32_to_bf16_bits(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
"""

# cudaDataType and cublasComputeType_t values (cuda_runtime library_types.h, cublas_api.h)
CUDA_R_32F = 0
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_PEDANTIC = 69
CUBLAS_GEMM_DEFAULT = -1


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

        out: float32 (M, N), C-contiguous. a, b: 2-D with unit inner stride (rows may be strided),
        both float32 (fp32 products and sums) or both bf16 bits as uint16 (bf16 products,
        fp32 accumulation). beta = 0 never reads out (it may hold NaN).
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

    def address(self, a: Any) -> int:
        """The address of a's first element (for pointer tables and alignment checks)."""
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
    if out.dtype.name != "float32" or not out.flags.c_contiguous:
        raise ValueError(f"gemm writes a C-contiguous float32 out, got {out.dtype} strides {out.strides}")
    for name, x in (("a", a), ("b", b)):
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
    if not out.flags.c_contiguous:
        raise ValueError(f"gemm_batched writes a C-contiguous out, got strides {out.strides}")
    return int(out.shape[0])


class CudaRuntime(Runtime):
    """The GPU: CuPy arrays, kernels through `get_kernel`, GEMMs through cuBLAS `cublasGemmEx` on the
    current stream (bf16 operands: CUBLAS_COMPUTE_32F, tensor cores with fp32 accumulation; fp32
    operands: CUBLAS_COMPUTE_32F_PEDANTIC, true fp32, never TF32)."""

    def __init__(self) -> None:
        import cupy

        self.xp = cupy

    def launch(self, source, kernel, grid, block, args, shared_mem=0) -> None:
        if min(grid) <= 0:
            return
        get_kernel(source, kernel)(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)

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

    def _cublas(self, a, b, out, count, M, N, K, trans_a, trans_b, alpha, beta) -> None:
        """cublasGemmEx (count None: 2-D operands) or cublasGemmStridedBatchedEx (3-D, `count`)."""
        import numpy as np
        from cupy_backends.cuda.libs import cublas  # type: ignore[import-not-found]

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
        compute = CUBLAS_COMPUTE_32F if bf16 else CUBLAS_COMPUTE_32F_PEDANTIC
        handle = self.xp.cuda.device.get_cublas_handle()
        cublas.setStream(handle, self.xp.cuda.get_current_stream().ptr)
        alpha_h = np.array(alpha, dtype=np.float32)
        beta_h = np.array(beta, dtype=np.float32)
        mode = cublas.getPointerMode(handle)
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        row = 0 if count is None else 1  # the axis of the matrices' rows
        ops = (
            cublas.CUBLAS_OP_T if trans_b else cublas.CUBLAS_OP_N,
            cublas.CUBLAS_OP_T if trans_a else cublas.CUBLAS_OP_N,
        )
        try:
            # cuBLAS is column-major: out^T (N x M) = op(b)^T (N x K) @ op(a)^T (K x M), and a row-major
            # matrix is its transpose in column-major, so b goes first and each op flips
            ld = [x.strides[row] // x.itemsize for x in (b, a, out)]
            if count is None:
                cublas.gemmEx(
                    handle, *ops, N, M, K, alpha_h.ctypes.data,
                    b.data.ptr, dtype, ld[0], a.data.ptr, dtype, ld[1],
                    beta_h.ctypes.data, out.data.ptr, CUDA_R_32F, ld[2], compute, CUBLAS_GEMM_DEFAULT,
                )  # fmt: skip
            else:
                st = [x.strides[0] // x.itemsize for x in (b, a, out)]
                cublas.gemmStridedBatchedEx(
                    handle, *ops, N, M, K, alpha_h.ctypes.data,
                    b.data.ptr, dtype, ld[0], st[0], a.data.ptr, dtype, ld[1], st[1],
                    beta_h.ctypes.data, out.data.ptr, CUDA_R_32F, ld[2], st[2], count, compute,
                    CUBLAS_GEMM_DEFAULT,
                )  # fmt: skip
        finally:
            cublas.setPointerMode(handle, mode)


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
