"""The CPU twin of RMSNorm: `rmsnorm_forward_cpu` / `rmsnorm_backward_cpu`, the arguments, results
and cache of `engine.kernels.norm.rmsnorm_forward_ref` / `rmsnorm_backward_ref`, each one compiled
pass over the rows (engine.kernels.jit) instead of NumPy's five or six: the forward reads x twice
(sum of squares, then xn and y written together), the backward reads dy and xn twice (the row's
dot product, then dx) and sums dw in float64 on the way. Sums are float64 (NumPy's are float32,
pairwise): within float32 rounding of the reference.

float32 inputs (x of any strides, the rest C-contiguous) only; anything else (float64 in the
gradient checks) and every call while compiled kernels are off (engine.kernels.jit) runs the
reference. The parity test is
tests/kernels/test_cpu_twins.py.
"""

from __future__ import annotations

import numpy as np

from . import jit
from .norm import NormCache, rmsnorm_backward_ref, rmsnorm_forward_ref

_NO_W = np.ones(0, np.float32)  # "no weight" for the kernels (an empty array)


@jit.kernel
def _forward(x, w, eps, y, xn, rstd):  # x, y, xn (n, C); w (C,) or empty; rstd (n,)
    n, C = x.shape
    has_w = w.size > 0
    for i in range(n):
        s = 0.0
        for j in range(C):
            v = np.float64(x[i, j])
            s += v * v
        r = np.float32(1.0 / np.sqrt(s / C + eps))
        rstd[i] = r
        for j in range(C):
            a = x[i, j] * r
            xn[i, j] = a
            y[i, j] = a * w[j] if has_w else a


@jit.kernel
def _backward(dy, xn, rstd, w, dx, dw):  # dy, xn, dx (n, C); rstd (n,); w (C,) or empty; dw (C,) f64
    n, C = dy.shape
    has_w = w.size > 0
    for i in range(n):
        s = 0.0
        for j in range(C):
            d = dy[i, j] * w[j] if has_w else dy[i, j]
            s += np.float64(d) * np.float64(xn[i, j])
        mean = np.float32(s / C)
        r = rstd[i]
        for j in range(C):
            d = dy[i, j] * w[j] if has_w else dy[i, j]
            dx[i, j] = r * (d - xn[i, j] * mean)
            if has_w:
                dw[j] += np.float64(dy[i, j]) * np.float64(xn[i, j])


def rmsnorm_forward_cpu(x: np.ndarray, w: np.ndarray | None, eps: float):
    """CPU twin of `rmsnorm_forward_ref` (same arguments and results)."""
    f32 = type(x) is np.ndarray and x.dtype == np.float32 and x.ndim >= 1
    if not (f32 and jit.f32_rows(w) and jit.enabled()):
        return rmsnorm_forward_ref(x, w, eps)
    C = x.shape[-1]
    x2 = x.reshape(-1, C)  # a view where NumPy can make one (x may be a column block), else a copy
    y = np.empty(x.shape, np.float32)
    xn = np.empty(x.shape, np.float32)
    rstd = np.empty((*x.shape[:-1], 1), np.float32)
    _forward(x2, _NO_W if w is None else w, float(eps), y.reshape(-1, C), xn.reshape(-1, C), rstd.reshape(-1))
    return y, NormCache(xn, rstd)


def rmsnorm_backward_cpu(dy: np.ndarray, cache: NormCache, w: np.ndarray | None):
    """CPU twin of `rmsnorm_backward_ref` (same arguments and results)."""
    xn, rstd = cache
    if not (jit.f32_rows(dy, xn, rstd, w) and dy.shape == xn.shape and jit.enabled()):
        return rmsnorm_backward_ref(dy, cache, w)
    C = dy.shape[-1]
    dx = np.empty_like(dy)
    dw = np.zeros(C if w is not None else 0, np.float64)
    _backward(dy.reshape(-1, C), xn.reshape(-1, C), rstd.reshape(-1), _NO_W if w is None else w,
              dx.reshape(-1, C), dw)  # fmt: skip
    return dx, (dw.astype(np.float32) if w is not None else None)
