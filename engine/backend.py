"""Where the engine computes: NumPy on the CPU or CuPy on a CUDA GPU, chosen once per session.

`select_backend("auto" | "cpu" | "cuda:N")` returns a `Backend`: the array module `xp` that model
code is written against, the kernels' `Runtime` (engine.kernels.runtime) for a GPU, and the few
operations that cross the host/device boundary (`asarray`, `to_host`, `synchronize`).
`with backend.active():` makes the backend's device current and routes every op of
`engine.model.ops` to its CUDA twin on that runtime; on the CPU it does nothing.
`available_devices()` lists every device with whether it is
usable and, when it is not, why (CuPy not installed, no driver, no GPU, GPU too old), so the app
and the CLI can say it in plain words.

"auto" picks the first usable GPU, else the CPU. Asking for a GPU explicitly never falls back to
the CPU silently: an unusable device is an `EngineError` naming the reason. CuPy is optional:
this module imports on any machine, and a CuPy that imports without a driver or GPU means CPU.

It sits just above `engine.kernels` (whose runtime it holds and enters) and below the files, the
model and training (the model and the trainer take a `Backend`); `array_module` and `to_host` are
the kernels' own, offered here to the code above.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from .errors import EngineError
from .kernels.nvrtc import nvrtc_version
from .kernels.runtime import array_module, cuda_runtime, to_host, use_runtime

__all__ = [
    "CPU", "Backend", "Device", "array_module", "available_devices", "gpu_training_available",
    "gpu_unavailable_reason", "parse_device", "select_backend", "to_host",
]  # fmt: skip

log = logging.getLogger(__name__)

MIN_COMPUTE_CAPABILITY = (8, 0)  # bf16 tensor cores (Ampere and newer)


@dataclass(frozen=True)
class Device:
    """One place the engine could run, and whether it can."""

    name: str  # "cpu" or "cuda:N"
    label: str  # for people: "CPU (NumPy)", "NVIDIA H100 80GB HBM3 (79.1 GiB)"
    usable: bool  # False: `reason` says why
    reason: str = ""  # why it cannot be used ("" when usable)
    memory_bytes: int = 0  # total device memory (0 for the CPU)
    compute_capability: tuple[int, int] | None = None  # CUDA only


@dataclass(frozen=True)
class Backend:
    """The array module of one session and the host/device crossings."""

    device: str  # "cpu" or "cuda:N" (tests: "emulated", the kernels run by g++ on the CPU)
    xp: ModuleType  # numpy or cupy (the runtime's array module)
    reason: str = ""  # why this device was chosen ("auto" resolved to the CPU: why no GPU)
    runtime: Any = None  # engine.kernels.runtime.Runtime of a GPU backend; None on the CPU

    @property
    def is_gpu(self) -> bool:
        return self.runtime is not None

    @property
    def device_index(self) -> int | None:
        return int(self.device.split(":")[1]) if self.device.startswith("cuda:") else None

    def _device(self):
        index = self.device_index
        if index is None or not hasattr(self.xp, "cuda"):
            return contextlib.nullcontext()
        return self.xp.cuda.Device(index)

    @contextlib.contextmanager
    def active(self) -> Iterator[Backend]:
        """Within it, this backend's device is current and model ops run on its runtime."""
        if self.runtime is None:
            yield self
            return
        with self._device(), use_runtime(self.runtime):
            yield self

    def asarray(self, a: Any, dtype: Any = None):
        """`a` on this backend's device (no copy when it is already there with that dtype)."""
        if self.is_gpu:
            with self._device():
                return self.xp.asarray(a, dtype=dtype)
        return np.asarray(a, dtype=dtype)

    def zeros(self, shape, dtype=np.float32):
        with self._device():
            return self.xp.zeros(shape, dtype=dtype)

    def to_host(self, a: Any) -> np.ndarray:
        """A NumPy array of `a` (a device array is copied to the host)."""
        return to_host(a)

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on the CPU)."""
        if self.is_gpu and hasattr(self.xp, "cuda"):
            with self._device():
                self.xp.cuda.get_current_stream().synchronize()


CPU = Backend("cpu", np)


def _import_cupy() -> tuple[ModuleType | None, str]:
    try:
        import cupy
    except ImportError:
        return None, "CuPy is not installed (pip install -e '.[cuda]')"
    except Exception as exc:  # noqa: BLE001 - a broken CUDA install can raise anything at import
        return None, f"CuPy cannot be imported ({type(exc).__name__}: {exc})"
    return cupy, ""


@functools.lru_cache(maxsize=1)
def available_devices() -> tuple[Device, ...]:
    """The CPU and every CUDA device, each with whether it is usable and why not."""
    cpu = Device("cpu", "CPU (NumPy)", True)
    cupy, why = _import_cupy()
    if cupy is None:
        return (cpu, Device("cuda:0", "CUDA GPU", False, why))
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError without a driver, ...
        reason = _plain_cuda_error(exc)
        return (cpu, Device("cuda:0", "CUDA GPU", False, reason))
    if n == 0:
        return (cpu, Device("cuda:0", "CUDA GPU", False, "no CUDA GPU is present"))
    out = [cpu]
    for i in range(n):
        try:
            props = cupy.cuda.runtime.getDeviceProperties(i)
            name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            cc = (int(props["major"]), int(props["minor"]))
            mem = int(props["totalGlobalMem"])
        except Exception as exc:  # noqa: BLE001
            out.append(Device(f"cuda:{i}", f"CUDA GPU {i}", False, _plain_cuda_error(exc)))
            continue
        label = f"{name} ({mem / 2**30:.1f} GiB)"
        if cc < MIN_COMPUTE_CAPABILITY:
            reason = (
                f"compute capability {cc[0]}.{cc[1]} is below the {MIN_COMPUTE_CAPABILITY[0]}."
                f"{MIN_COMPUTE_CAPABILITY[1]} the bf16 kernels need"
            )
            out.append(Device(f"cuda:{i}", label, False, reason, mem, cc))
        else:
            out.append(Device(f"cuda:{i}", label, True, "", mem, cc))
    return tuple(out)


def _plain_cuda_error(exc: Exception) -> str:
    text = str(exc)
    if "cudaErrorInsufficientDriver" in text or "CUDA driver version is insufficient" in text:
        return "the NVIDIA driver is older than this CuPy's CUDA version"
    if "cudaErrorNoDevice" in text or "no CUDA-capable device" in text:
        return "no CUDA GPU is present"
    if re.search(r"libcuda|cudaErrorInitializationError|driver", text, re.I):
        return f"no usable NVIDIA driver ({text})"
    return f"CUDA is not usable ({type(exc).__name__}: {text})"


def parse_device(device: str) -> str:
    """'auto', 'cpu' or 'cuda:N' (also 'cuda', 'gpu' for cuda:0); EngineError otherwise."""
    d = (device or "auto").strip().lower()
    if d in ("auto", "cpu"):
        return d
    if d in ("cuda", "gpu"):
        return "cuda:0"
    if re.fullmatch(r"cuda:\d{1,3}", d):
        return d
    raise EngineError(f"unknown device {device!r}; use auto, cpu or cuda:N (e.g. cuda:0)")


def select_backend(device: str = "auto") -> Backend:
    """The backend for `device`. 'auto': the first usable GPU, else the CPU (with the reason)."""
    d = parse_device(device)
    if d == "cpu":
        return CPU
    devices = available_devices()
    gpus = [x for x in devices if x.name != "cpu"]
    if d == "auto":
        for x in gpus:
            if x.usable and gpu_training_available():
                return _cuda_backend(x)
        reasons = "; ".join(f"{x.name}: {x.reason}" for x in gpus if not x.usable)
        if not reasons and gpus:
            reasons = gpu_unavailable_reason()
        log.info("device auto -> cpu (%s)", reasons or "no GPU")
        return Backend("cpu", np, reasons or "no GPU")
    match = [x for x in gpus if x.name == d]
    if not match:
        have = ", ".join(x.name for x in gpus if x.usable) or "none"
        raise EngineError(f"device {d} does not exist (usable CUDA devices: {have})")
    if not match[0].usable:
        raise EngineError(f"device {d} cannot be used: {match[0].reason}")
    if not gpu_training_available():
        raise EngineError(f"device {d} cannot be used: {gpu_unavailable_reason()}")
    return _cuda_backend(match[0])


def gpu_training_available() -> bool:
    """Whether the engine's GPU path can run here: the CUDA compiler (NVRTC) the kernels are built
    with at run time must be importable beside CuPy."""
    return gpu_unavailable_reason() == ""


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str:
    try:
        nvrtc_version()
    except Exception as exc:  # noqa: BLE001 - CudaToolkitError, or a broken toolkit
        return f"the CUDA compiler (NVRTC) the kernels need is not usable ({exc})"
    return ""


def _cuda_backend(dev: Device) -> Backend:
    import cupy

    return Backend(dev.name, cupy, "", cuda_runtime())
