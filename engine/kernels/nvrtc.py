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

What it is not: no kernels live here, and nothing here touches arrays (`engine.kernels.runtime` runs
the twins). Importing this module needs neither CuPy nor NVRTC nor a GPU; they are looked for on
first use.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
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
    """One CUDA C++ translation unit of a kernel module, and the kernels it defines.

    A kernel module reads its source from `engine/kernels/cuda/<name>.cu` with `from_file`; `code`
    as text serves tests and one-off kernels.
    """

    name: str  # unique across the package, e.g. "dequant"; names the NVRTC program and the cache entry
    code: str  # CUDA C++; every kernel is `extern "C" __global__` so that its name is not mangled
    kernels: tuple[str, ...]  # the kernel names `get_kernel` may be asked for
    options: tuple[str, ...] = ()  # extra NVRTC options, e.g. ("-DTILE=256",); no -arch, no -I

    @classmethod
    def from_file(
        cls, filename: str, kernels: Sequence[str], defines: Mapping[str, object] | None = None
    ) -> KernelSource:
        """The source in `engine/kernels/cuda/<filename>` (see `read_cuda_source`), named after the
        file, with each of `defines` given to NVRTC as `-DNAME=value`: the numbers the host code
        launches with (block and tile sizes) stay defined once, in the op module."""
        options = tuple(f"-D{k}={v}" for k, v in (defines or {}).items())
        return cls(os.path.splitext(filename)[0], read_cuda_source(filename), tuple(kernels), options)


# ----------------------------------------------------------------------------------------------
# the .cu files

CUDA_DIR = "cuda"  # engine/kernels/cuda: the .cu sources and the .cuh headers they share (package data)
_LOCAL_INCLUDE = re.compile(r'[ \t]*#include[ \t]+"([\w.-]+)"[ \t]*')


def read_cuda_source(filename: str) -> str:
    """The text of `engine/kernels/cuda/<filename>`, each `#include "<header>"` line replaced by the
    text of that header (from the same folder; once per header, as `#pragma once` would), between
    `#line` directives, so that NVRTC's messages name the file and line an editor shows.

    NVRTC and the tests' g++ emulators then get one translation unit and need no include path.
    """
    return _expand(filename, set())


def _expand(filename: str, seen: set[str]) -> str:
    text = (resources.files(__package__) / CUDA_DIR / filename).read_text(encoding="utf-8")
    out: list[str] = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        m = _LOCAL_INCLUDE.fullmatch(line.rstrip("\r\n"))
        if m is None:
            out.append(line)
        elif m.group(1) not in seen:
            seen.add(m.group(1))
            body = _expand(m.group(1), seen)
            out.append(f'#line 1 "{m.group(1)}"\n{body}#line {number + 1} "{filename}"\n')
    return "".join(out)


# ----------------------------------------------------------------------------------------------
# registry

_NOT_OP_MODULES = ("nvrtc", "runtime")  # modules of engine.kernels that declare no SOURCES


def all_sources() -> tuple[KernelSource, ...]:
    """Every `KernelSource` that a module of `engine.kernels` declares in its `SOURCES` tuple."""
    found: list[KernelSource] = []
    # the op modules are found on disk and imported by name: an import of the package from here
    # would be a cycle (the op modules import this one)
    here = os.path.dirname(os.path.abspath(__file__))
    for info in sorted(pkgutil.iter_modules([here]), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in _NOT_OP_MODULES:
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


_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers")


def ptxas_report(src: KernelSource, arch: str = "sm_90") -> dict[str, dict[str, int]]:
    """What ptxas says of each kernel of `src` for `arch` (`-Xptxas -v`): {kernel: {"registers",
    "stack", "spill_stores", "spill_loads"}}. Needs NVRTC, no GPU; KernelCompileError on an error."""
    nv = _nvrtc()
    include = cuda_include_dir(nv.version[0])
    if include is None:
        raise CudaToolkitError("the CUDA headers (cuda_bf16.h) were not found")
    opts = [f"--gpu-architecture={arch}", f"-I{include}", *src.options, "-Xptxas", "-v"]
    ok, text, _ = nv.compile(src.code, f"{src.name}.cu", opts, cubin=True)
    if not ok:
        raise KernelCompileError(f"kernel source {src.name!r} for {arch} does not compile", text)
    report: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            current = report.setdefault(m.group(1), {})
        elif current is not None and (m := _PTXAS_SPILL.search(line)):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif current is not None and (m := _PTXAS_USED.search(line)):
            current["registers"] = int(m.group(1))
    return report


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
