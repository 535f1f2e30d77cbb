"""Rotary position embedding, llama.cpp's "norm" (adjacent pairs) and "neox" (halves) styles.

`rope_angles` and `rope_forward_ref` / `rope_backward_ref` are the NumPy reference (the
specification). `rope_forward` / `rope_backward` are the CUDA twins: one elementwise kernel that
rotates by +theta (forward) or -theta (backward), fp32, with the reference's cache. Not here: the
angles on the device (`rope_angles` is host code; its result is uploaded once per batch).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .nvrtc import KernelSource
from .runtime import Runtime, aligned16, f32_input, runtime_for


def rope_angles(
    positions: np.ndarray,
    n_rot: int,
    base: float,
    scale: float = 1.0,
    freq_factors: np.ndarray | None = None,
    dtype: Any = np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of theta_i = (pos / scale) * base^(-2i/n_rot) / ff_i, shape (*positions.shape, n_rot/2)."""
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)  # (n_rot/2,)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    theta = (positions.astype(np.float64)[..., None] / scale) * inv_freq
    return np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)


class RopeCache(NamedTuple):
    cos: np.ndarray  # (B, T, n_rot/2)
    sin: np.ndarray
    style: str  # "norm" or "neox"


def rope_forward_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str):
    """Rotate the first n_rot dims of each head. x (B, T, H, HS); cos/sin (B, T, n_rot/2).

    style "norm" pairs (x[2i], x[2i+1]); style "neox" pairs (x[i], x[i + n_rot/2]).
    """
    half = cos.shape[-1]
    n_rot = 2 * half
    c = cos[:, :, None, :]  # (B, T, 1, n_rot/2)
    s = sin[:, :, None, :]
    y = x.copy()
    if style == "norm":
        x1, x2 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        y[..., 0:n_rot:2] = x1 * c - x2 * s
        y[..., 1:n_rot:2] = x1 * s + x2 * c
    elif style == "neox":
        x1, x2 = x[..., :half], x[..., half:n_rot]
        y[..., :half] = x1 * c - x2 * s
        y[..., half:n_rot] = x1 * s + x2 * c
    else:
        raise ValueError(f"unknown RoPE style {style!r}")
    return y, RopeCache(cos, sin, style)


def rope_backward_ref(dy: np.ndarray, cache: RopeCache) -> np.ndarray:
    """forward was: y = R(theta) x, a rotation; so dx = R(-theta) dy."""
    cos, sin, style = cache
    dx, _ = rope_forward_ref(dy, cos, -sin, style)
    return dx


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract: x float32 (B, T, H, HS) on the device (contiguous), cos/sin float32 (B, T, n_rot/2)
# (a host array is uploaded); fp32 math; the cache is the reference's RopeCache(cos, sin, style).
#
# rope_v{4,1}: elementwise over "units" of a head row, a grid-stride loop over at most 65535
#   blocks of 256 threads. A unit is, for style norm, P adjacent pairs (x[2i], x[2i+1]) read as
#   one float4 (P = 2) or two floats (P = 1); for style neox, P values i..i+P-1 and their partners
#   i+half.. (two float4 for P = 4); dims past n_rot are copied, 4 or 1 at a time. The 16-byte
#   variant needs HS, n_rot (norm) or n_rot/2 (neox) multiples of 4 and aligned arrays; else the
#   scalar one runs. cos/sin rows are read by every head of a token (from cache). Floor: 8 bytes
#   per value (read x, write y) + cos/sin once per token: a (4, 4096, 32, 128) q moves 537 MB,
#   ~0.18 ms at 3 TB/s. y1 = x1 c - x2 s, y2 = x1 s + x2 c, with s negated for the backward
#   (a rotation by -theta, as the reference).


SOURCE = KernelSource.from_file("rope.cu", kernels=("rope_v4", "rope_v1"))
SOURCES = (SOURCE,)

THREADS = 256
STYLES = ("norm", "neox")


def _rope_on(rt: Runtime, x: Any, cos: Any, sin: Any, style: str, sign: float) -> Any:
    if style not in STYLES:
        raise ValueError(f"unknown RoPE style {style!r}; known: {', '.join(STYLES)}")
    x = f32_input(rt, x, "rope input x")
    cos = f32_input(rt, cos, "rope cos")
    sin = f32_input(rt, sin, "rope sin")
    if x.ndim != 4:
        raise ValueError(f"rope takes x of shape (B, T, H, HS), got {tuple(x.shape)}")
    B, T, H, HS = x.shape
    half = cos.shape[-1]
    if tuple(cos.shape) != (B, T, half) or sin.shape != cos.shape or 2 * half > HS:
        raise ValueError(
            f"rope angles of shape {tuple(cos.shape)} / {tuple(sin.shape)} do not fit x {tuple(x.shape)}: "
            f"expected ({B}, {T}, n_rot/2) with n_rot <= {HS}"
        )
    y = rt.xp.empty(x.shape, dtype=rt.xp.float32)
    neox = style == "neox"
    rot_ok = half % 4 == 0 if neox else half % 2 == 0
    v4 = HS % 4 == 0 and rot_ok and aligned16(rt, x, y)
    P = (4 if neox else 2) if v4 else 1
    units = half // P + (HS - 2 * half) // (4 if v4 else 1)
    n = B * T * H * units
    grid = max(1, min(65535, -(-n // THREADS)))
    args = (x, cos, sin, y, np.int64(B * T * H), np.int32(H), np.int32(HS), np.int32(half))
    args += (np.int32(neox), np.float32(sign))
    if n:
        rt.launch(SOURCE, "rope_v4" if v4 else "rope_v1", (grid,), (THREADS,), args)
    return y


def rope_forward_on(rt: Runtime, x: Any, cos: Any, sin: Any, style: str) -> tuple[Any, RopeCache]:
    """`rope_forward` on a runtime."""
    xp = rt.xp
    cos, sin = xp.asarray(cos), xp.asarray(sin)
    return _rope_on(rt, x, cos, sin, style, 1.0), RopeCache(cos, sin, style)


def rope_backward_on(rt: Runtime, dy: Any, cache: RopeCache) -> Any:
    """`rope_backward` on a runtime: forward was y = R(theta) x, so dx = R(-theta) dy."""
    cos, sin, style = cache
    return _rope_on(rt, dy, cos, sin, style, -1.0)


def rope_forward(x: Any, cos: Any, sin: Any, style: str) -> tuple[Any, RopeCache]:
    """CUDA twin of `rope_forward_ref`: rotate the first n_rot dims of each head of x (B, T, H, HS)."""
    return rope_forward_on(runtime_for(x, "rope_forward"), x, cos, sin, style)


def rope_backward(dy: Any, cache: RopeCache) -> Any:
    """CUDA twin of `rope_backward_ref`: the rotation by -theta."""
    return rope_backward_on(runtime_for(dy, "rope_backward"), dy, cache)
