"""Compiled CPU kernels through numba, an optional dependency: the `cpu` extra (`pip install
'tune-studio[cpu]'`; the README's test command installs it, so CI runs every parity test).

A CPU twin (`engine.kernels.*_cpu`) calls its compiled kernel only when `enabled()`: numba imports,
and `TUNE_NO_JIT` is not set in the environment (a way to run the NumPy reference path on a machine
that has numba, for a bench or a bug hunt). Otherwise it runs the NumPy reference, which stays the
specification and the fallback; the first twin to ask logs once why (numba missing, or turned off).

`kernel(fn)` marks a plain Python function as a compiled kernel: numba compiles it on its first call
(`njit(cache=True, nogil=True)`), never at import, so importing the engine does not import numba.
`cache=True` keeps each compiled function on disk for the next process: in `__pycache__` beside the
source when that folder is writable (a checkout, CI), else numba's user-wide cache folder, or
`NUMBA_CACHE_DIR` when set; a test run compiles each kernel once (about 0.2-1 s each), later runs
load them in milliseconds. `nogil=True`: kernels let go of the interpreter lock, so CPU workers
(engine.kernels.cpu_workers) run them side by side. No `fastmath`: every float32 operation rounds as
NumPy's does, in the order the kernel writes it (no contraction into FMAs, no reassociation), which
is what lets a twin equal its reference bit for bit where it keeps the reference's order (AdamW,
dequantization). The one exception is asked for by name: `kernel(fn, reassociate=True)` lets LLVM
reorder a kernel's sums and contract its multiply-adds (numba's "reassoc" and "contract" flags, no
others), which a product's reduction needs to vectorise; such a kernel's sums, like a BLAS product's,
have no order of their own to keep (engine.kernels.blockq_cpu).

Not here: the kernels themselves (each `*_cpu` module), or which twin runs (engine.model.ops).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

OFF_VARIABLE = "TUNE_NO_JIT"  # set (to anything but "" or "0"): the NumPy reference kernels run
INSTALL_HINT = "pip install 'tune-studio[cpu]'"

# math the kernels share (engine.kernels.jit_math), set once numba has imported; kernels call
# `jit.exp32(x)` and the others, which numba resolves when it compiles them
exp32: Callable = None  # type: ignore[assignment]
row_max: Callable = None  # type: ignore[assignment]
row_exp_sum: Callable = None  # type: ignore[assignment]
row_dot: Callable = None  # type: ignore[assignment]

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "numba": the module or None, "why": the reason it is off, "said": logged


def _turned_off() -> bool:
    return os.environ.get(OFF_VARIABLE, "") not in ("", "0")


def _numba():
    """The numba module, or None (with the reason kept for `status`)."""
    with _lock:
        if "numba" not in _state:
            if _turned_off():
                _state["numba"], _state["why"] = None, f"off ({OFF_VARIABLE} is set): NumPy reference kernels"
            else:
                try:
                    import numba
                except ImportError as exc:  # numba is optional
                    _state["numba"] = None
                    _state["why"] = f"numba is not installed ({exc}): NumPy reference kernels; {INSTALL_HINT}"
                else:
                    from . import jit_math  # the kernels' shared math (imports numba itself)

                    shared = ("exp32", "row_max", "row_exp_sum", "row_dot")
                    globals().update({name: getattr(jit_math, name) for name in shared})
                    _state["numba"], _state["why"] = numba, None
        return _state["numba"]


def enabled() -> bool:
    """Whether compiled CPU kernels run (numba importable and not turned off); the first call that
    finds them off logs why, once per process."""
    on = _numba() is not None
    if not on and not _state.get("said"):
        _state["said"] = True
        log.warning("compiled CPU kernels are off: %s (CPU training runs slower)", _state["why"])
    return on


def status() -> str:
    """One line for benches and logs: numba's version, or why the kernels are off."""
    nb = _numba()
    return f"numba {nb.__version__}" if nb is not None else str(_state["why"])


def reset() -> None:
    """Forget what was found (tests that turn the kernels off and on again)."""
    with _lock:
        _state.clear()


class Kernel:
    """A Python function compiled by numba on its first call (see the module docstring)."""

    def __init__(self, fn: Callable, reassociate: bool = False) -> None:
        self.py = fn  # the plain Python function (what a test may call without numba)
        self.reassociate = reassociate
        self._compiled: Callable | None = None
        functools.update_wrapper(self, fn)

    def dispatcher(self):
        """numba's dispatcher of the function (made on first use; RuntimeError without numba)."""
        fn = self._compiled
        if fn is None:
            nb = _numba()
            if nb is None:
                raise RuntimeError(f"{self.py.__name__}: numba is not available ({status()})")
            with _lock:
                if self._compiled is None:
                    flags = {"fastmath": {"reassoc", "contract"}} if self.reassociate else {}
                    self._compiled = nb.njit(cache=True, nogil=True, error_model="numpy", **flags)(self.py)
                fn = self._compiled
        return fn

    @property
    def _numba_type_(self):
        """How numba sees a kernel that another kernel calls: as its dispatcher."""
        from numba import types

        return types.Dispatcher(self.dispatcher())

    def __call__(self, *args):
        return self.dispatcher()(*args)


def kernel(fn: Callable | None = None, *, reassociate: bool = False):
    """`fn` as a compiled kernel (numba.njit(cache=True, nogil=True) on its first call); as
    `@kernel(reassociate=True)`, one whose sums LLVM may reorder (see the module docstring)."""
    if fn is None:
        return lambda f: Kernel(f, reassociate)
    return Kernel(fn, reassociate)


def f32_rows(*arrays: Any) -> bool:
    """Whether every array given (None is skipped) is a C-contiguous float32 NumPy array: what the
    compiled kernels take; anything else (float64 in the gradient checks, strided views, CuPy
    arrays) runs the reference."""
    for a in arrays:
        if a is None:
            continue
        if type(a) is not _ndarray() or a.dtype != _f32() or not a.flags.c_contiguous:
            return False
    return True


@functools.lru_cache(maxsize=1)
def _ndarray():
    import numpy as np

    return np.ndarray


@functools.lru_cache(maxsize=1)
def _f32():
    import numpy as np

    return np.dtype(np.float32)


__all__ = ["INSTALL_HINT", "OFF_VARIABLE", "Kernel", "enabled", "f32_rows", "kernel", "reset", "status"]
