"""A linear map with an optional bias and LoRA term: y = x W^T + b + s (x A^T) B^T, never forming B A.

NumPy reference (the specification); the CUDA twin runs frozen matmuls in bf16 with fp32 accumulation.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class LoraTerm(NamedTuple):
    """One LoRA factor pair applied to a weight: y += s * (x A^T) B^T."""

    A: np.ndarray  # (r, n_in), or (E, r, n_in) for expert stacks, or (V, r) for token_embd
    B: np.ndarray  # (n_out, r), or (E, n_out, r), or (C, r) for token_embd
    s: float  # effective scale: user scale * alpha / r


class LinearCache(NamedTuple):
    x: np.ndarray  # (..., n_in) input
    has_bias: bool
    lora: LoraTerm | None
    xa: np.ndarray | None  # (..., r) x A^T when there is a LoRA term


def linear_forward_ref(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, lora: LoraTerm | None = None
):
    """y = x W^T (+ b) (+ s (x A^T) B^T); W (n_out, n_in), never forming B A."""
    y = x @ w.T  # (..., n_out)
    if b is not None:
        y = y + b
    xa = None
    if lora is not None:
        xa = x @ lora.A.T  # (..., r)
        y = y + lora.s * (xa @ lora.B.T)
    return y, LinearCache(x, b is not None, lora, xa)


def linear_backward_ref(dy: np.ndarray, cache: LinearCache, w: np.ndarray, need_dw: bool = False):
    """forward was: y = x W^T + b + s (x A^T) B^T.  Returns (dx, dW, db, dA, dB), None where not needed."""
    x, has_bias, lora, xa = cache
    n_out, n_in = w.shape
    dy2 = dy.reshape(-1, n_out)
    x2 = x.reshape(-1, n_in)
    dx = dy @ w  # (..., n_in)
    dW = dy2.T @ x2 if need_dw else None
    db = dy2.sum(axis=0) if has_bias else None
    dA = dB = None
    if lora is not None:
        r = lora.A.shape[0]
        dyB = dy2 @ lora.B  # (N, r)
        dB = lora.s * (dy2.T @ xa.reshape(-1, r))  # (n_out, r)
        dA = lora.s * (dyB.T @ x2)  # (r, n_in)
        dx = dx + lora.s * (dyB @ lora.A).reshape(dx.shape)
    return dx, dW, db, dA, dB
