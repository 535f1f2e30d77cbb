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
def _forward(x, n, C, w, eps, y, xn, rstd):  # x, y, xn flat (n C,); w (C,) or empty; rstd (n,)
    has_w = w.size > 0
    acc = np.empty(16, np.float64)
    for i in range(n):
        o = np.uint64(i * C)
        r = np.float32(1.0 / np.sqrt(jit.row_dot(x, o, x, o, C, acc) / C + eps))
        rstd[i] = r
        if has_w:
            for j in range(np.uint64(C)):
                a = x[o + j] * r
                xn[o + j] = a
            for j in range(np.uint64(C)):
                y[o + j] = xn[o + j] * w[j]
        else:
            for j in range(np.uint64(C)):
                a = x[o + j] * r
                xn[o + j] = a
                y[o + j] = a


@jit.kernel
def _backward(
    dy, xn, n, C, rstd, w, dx, dw
):  # dy, xn, dx flat (n C,); rstd (n,); w (C,) or empty; dw (C,) f64
    has_w = w.size > 0
    acc = np.empty(16, np.float64)
    dxn = np.empty(C, np.float32)
    zero = np.uint64(0)
    for i in range(n):
        o = np.uint64(i * C)
        if has_w:
            for j in range(np.uint64(C)):
                dxn[j] = dy[o + j] * w[j]
            for j in range(np.uint64(C)):
                dw[j] += np.float64(dy[o + j]) * np.float64(xn[o + j])
        else:
            for j in range(np.uint64(C)):
                dxn[j] = dy[o + j]
        mean = np.float32(jit.row_dot(dxn, zero, xn, o, C, acc) / C)
        r = rstd[i]
        for j in range(np.uint64(C)):
            dx[o + j] = r * (dxn[j] - xn[o + j] * mean)


def rmsnorm_forward_cpu(x: np.ndarray, w: np.ndarray | None, eps: float):
    """CPU twin of `rmsnorm_forward_ref` (same arguments and results)."""
    f32 = type(x) is np.ndarray and x.dtype == np.float32 and x.ndim >= 1
    if not (f32 and jit.f32_rows(w) and jit.enabled()):
        return rmsnorm_forward_ref(x, w, eps)
    C = x.shape[-1]
    x1 = np.ascontiguousarray(x).reshape(-1)  # x may be a column block of a product: one copy then
    y = np.empty(x.shape, np.float32)
    xn = np.empty(x.shape, np.float32)
    rstd = np.empty((*x.shape[:-1], 1), np.float32)
    n = x1.size // max(C, 1)
    _forward(x1, n, C, _NO_W if w is None else w, float(eps), y.reshape(-1), xn.reshape(-1), rstd.reshape(-1))
    return y, NormCache(xn, rstd)


def rmsnorm_backward_cpu(dy: np.ndarray, cache: NormCache, w: np.ndarray | None):
    """CPU twin of `rmsnorm_backward_ref` (same arguments and results)."""
    xn, rstd = cache
    if not (jit.f32_rows(dy, xn, rstd, w) and dy.shape == xn.shape and jit.enabled()):
        return rmsnorm_backward_ref(dy, cache, w)
    C = dy.shape[-1]
    dx = np.empty(dy.shape, np.float32)
    dw = np.zeros(C if w is not None else 0, np.float64)
    n = dy.size // max(C, 1)
    _backward(
        dy.reshape(-1), xn.reshape(-1), n, C, rstd.reshape(-1), _NO_W if w is None else w, dx.reshape(-1), dw
    )
    return dx, (dw.astype(np.float32) if w is not None else None)
