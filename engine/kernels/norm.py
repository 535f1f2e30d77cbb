"""RMSNorm over the last axis: y = x / sqrt(mean(x^2) + eps) * w.

NumPy reference (the specification).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class NormCache(NamedTuple):
    xn: np.ndarray  # (..., C) normalised input
    rstd: np.ndarray  # (..., 1) 1 / rms


def rmsnorm_forward_ref(x: np.ndarray, w: np.ndarray | None, eps: float):
    """y = x / sqrt(mean(x^2) + eps) * w, over the last axis."""
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xn = x * rstd
    y = xn * w if w is not None else xn
    return y, NormCache(xn, rstd)


def rmsnorm_backward_ref(dy: np.ndarray, cache: NormCache, w: np.ndarray | None):
    """forward was: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).  Returns (dx, dw or None)."""
    xn, rstd = cache
    dxn = dy * w if w is not None else dy
    dw = (dy * xn).reshape(-1, w.shape[-1]).sum(axis=0) if w is not None else None
    dx = rstd * (dxn - xn * np.mean(dxn * xn, axis=-1, keepdims=True))
    return dx, dw
