"""The CPU twin of RoPE: `rope_forward_cpu` / `rope_backward_cpu`, the arguments, results and cache
of `engine.kernels.rope.rope_forward_ref` / `rope_backward_ref`, one compiled pass that writes the
rotated heads (the reference copies x, then reads it again through strided views, with a temporary
per product). The same float32 products and sums in the same order as the reference: equal to it
bit for bit.

float32 x (B, T, H, HS) of any strides (q, k: column blocks of the q/k/v group's product) and
C-contiguous cos/sin (B, T, n_rot/2) only; anything else, and every call
while compiled kernels are off (engine.kernels.jit), runs the reference. The parity test is
tests/kernels/test_cpu_twins.py.
"""

from __future__ import annotations

import numpy as np

from . import jit
from .rope import STYLES, RopeCache, rope_backward_ref, rope_forward_ref


@jit.kernel
def _rotate(x, cos, sin, neox, sign, y):  # x, y (B, T, H, HS); cos, sin (B, T, half)
    B, T, H, HS = x.shape
    half = cos.shape[2]
    for b in range(B):
        for t in range(T):
            for h in range(H):
                for i in range(half):
                    c = cos[b, t, i]
                    s = sin[b, t, i] * sign
                    if neox:  # unsigned: numba then skips its wrap-around of negative indices
                        i1, i2 = np.uint64(i), np.uint64(i + half)
                    else:
                        i1, i2 = np.uint64(2 * i), np.uint64(2 * i + 1)
                    x1 = x[b, t, h, i1]
                    x2 = x[b, t, h, i2]
                    y[b, t, h, i1] = x1 * c - x2 * s
                    y[b, t, h, i2] = x1 * s + x2 * c
                for j in range(2 * half, HS):
                    y[b, t, h, j] = x[b, t, h, j]


def _fits(x, cos, sin, style) -> bool:
    return (
        style in STYLES
        and jit.f32_rows(cos, sin)
        and type(x) is np.ndarray
        and x.dtype == np.float32
        and x.ndim == 4
        and cos.shape == sin.shape == (*x.shape[:2], cos.shape[-1])
        and 2 * cos.shape[-1] <= x.shape[3]
        and jit.enabled()
    )


def rope_forward_cpu(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str):
    """CPU twin of `rope_forward_ref` (same arguments and results)."""
    if not _fits(x, cos, sin, style):
        return rope_forward_ref(x, cos, sin, style)
    y = np.empty(x.shape, np.float32)
    _rotate(x, cos, sin, style == "neox", np.float32(1.0), y)
    return y, RopeCache(cos, sin, style)


def rope_backward_cpu(dy: np.ndarray, cache: RopeCache) -> np.ndarray:
    """CPU twin of `rope_backward_ref`: the rotation by -theta."""
    cos, sin, style = cache
    if not _fits(dy, cos, sin, style):
        return rope_backward_ref(dy, cache)
    dx = np.empty(dy.shape, np.float32)
    _rotate(dy, cos, sin, style == "neox", np.float32(-1.0), dx)
    return dx
