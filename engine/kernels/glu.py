"""Gated activations besides SwiGLU: GEGLU (Gemma) with ggml's fp16 GELU table, and gpt-oss's clamped
SwiGLU. Each a forward/backward pair on the gate g and up projection u, elementwise.

`geglu_forward_ref` / `geglu_backward_ref` and `swiglu_oai_forward_ref` / `swiglu_oai_backward_ref`
are the NumPy references (the specification). They have no CUDA twins yet: on a GPU backend the
dispatcher (engine.model.ops) says so. Not here: the projections around the activation
(engine.kernels.linear, engine.kernels.moe_ext).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = 0.7978845608028654
GELU_TABLE_LIMIT = 10.0  # ggml: gelu(x) = 0 for x <= -10, x for x >= 10, the fp16 table between
OAI_ALPHA = 1.702  # gpt-oss's clamped SwiGLU: constants in llama.cpp, not GGUF keys
OAI_LIMIT = 7.0


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), in x's dtype."""
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


def gelu_tanh_grad(x: np.ndarray) -> np.ndarray:
    """d gelu_tanh(x) / dx."""
    inner = SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)
    t = np.tanh(inner)
    dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_COEF_A * x * x)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner


def gelu_ggml(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU of float32 values (GGML_GELU_FP16): x rounded to fp16 (nearest even) indexes a
    table of fp16(gelu_tanh(h)) for -10 < x < 10; 0 below, x above."""
    h = x.astype(np.float16).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # |h| beyond the table's range is replaced below
        t = gelu_tanh(h).astype(np.float16).astype(x.dtype)
    return np.where(x <= -GELU_TABLE_LIMIT, 0, np.where(x >= GELU_TABLE_LIMIT, x, t)).astype(x.dtype)


class GegluCache(NamedTuple):
    g: np.ndarray  # (..., F) gate pre-activation
    u: np.ndarray  # (..., F) up projection
    a: np.ndarray  # (..., F) gelu(g), as the forward used it


def geglu_forward_ref(g: np.ndarray, u: np.ndarray, table: bool | None = None):
    """h = gelu(g) * u, GELU in its tanh form.

    table: through ggml's fp16 table (what llama.cpp computes on the CPU), or exactly. None: the
    table for float32 inputs (matching llama.cpp), exact for float64 (the precision gradient checks
    differentiate in; the table is piecewise constant). The backward differentiates the exact
    tanh form either way (a straight-through estimate across the table's steps).
    """
    if table is None:
        table = g.dtype != np.float64
    a = gelu_ggml(g) if table else gelu_tanh(g)
    return a * u, GegluCache(g, u, a)


def geglu_backward_ref(dh: np.ndarray, cache: GegluCache):
    """forward was: h = gelu(g) * u.  Returns (dg, du)."""
    g, u, a = cache
    return dh * u * gelu_tanh_grad(g), dh * a


class SwigluOaiCache(NamedTuple):
    g: np.ndarray  # (..., F) gate pre-activation (before the clamp)
    u: np.ndarray  # (..., F) up projection (before the clamp)


def swiglu_oai_forward_ref(g: np.ndarray, u: np.ndarray, alpha: float = OAI_ALPHA, limit: float = OAI_LIMIT):
    """gpt-oss: g' = min(g, limit), u' = clamp(u, -limit, limit), h = g' sigmoid(alpha g') (u' + 1)."""
    gc = np.minimum(g, limit)
    uc = np.clip(u, -limit, limit)
    s = 1.0 / (1.0 + np.exp(-alpha * gc))
    return gc * s * (uc + 1.0), SwigluOaiCache(g, u)


def swiglu_oai_backward_ref(dh: np.ndarray, cache: SwigluOaiCache, alpha: float = OAI_ALPHA,
                            limit: float = OAI_LIMIT):  # fmt: skip
    """forward was: h = min(g, L) sigmoid(alpha min(g, L)) (clamp(u, -L, L) + 1).  Returns (dg, du);
    no gradient flows where a clamp holds."""
    g, u = cache
    gc = np.minimum(g, limit)
    uc = np.clip(u, -limit, limit)
    s = 1.0 / (1.0 + np.exp(-alpha * gc))
    dgc = dh * (uc + 1.0) * (s + alpha * gc * s * (1.0 - s))
    dg = np.where(g < limit, dgc, 0.0).astype(dh.dtype)
    du = np.where(np.abs(u) < limit, dh * gc * s, 0.0).astype(dh.dtype)
    return dg, du
