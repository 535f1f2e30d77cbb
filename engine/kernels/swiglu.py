"""The SwiGLU feed-forward activation h = silu(g) * u, and silu / sigmoid.

NumPy reference (the specification).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class SwigluCache(NamedTuple):
    g: np.ndarray  # (..., F) gate pre-activation
    u: np.ndarray  # (..., F) up projection
    sg: np.ndarray  # (..., F) silu(g)


def swiglu_forward_ref(g: np.ndarray, u: np.ndarray):
    """h = silu(g) * u."""
    sg = silu(g)
    return sg * u, SwigluCache(g, u, sg)


def swiglu_backward_ref(dh: np.ndarray, cache: SwigluCache):
    """forward was: h = silu(g) * u.  Returns (dg, du)."""
    g, u, sg = cache
    sig = sigmoid(g)
    dg = dh * u * (sig * (1.0 + g * (1.0 - sig)))
    du = dh * sg
    return dg, du
