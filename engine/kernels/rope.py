"""Rotary position embedding, llama.cpp's "norm" (adjacent pairs) and "neox" (halves) styles.

NumPy reference (the specification).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


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
