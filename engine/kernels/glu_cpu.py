"""The CPU twin of the gated activation: `glu_forward_cpu` / `glu_backward_cpu`, the arguments,
results and cache of `engine.kernels.glu.glu_forward_ref` / `glu_backward_ref`, one compiled pass
each for "silu" (SwiGLU) and "swiglu_oai" (gpt-oss's clamped SwiGLU): the forward writes silu(g)
and h together, the backward dg and du together (NumPy makes five to eight passes and as many
temporaries). "gelu" (Gemma's GEGLU through ggml's fp16 table) runs the reference.

The arithmetic is the reference's, in its order, in float32; `exp` is the C library's expf where
NumPy has its own vectorised one, so results may differ from the reference in the last bit.
float32 inputs of one layout (both C-contiguous, or both Fortran-ordered 2-D: the MoE experts'
transposed products) only; anything else, and every call while compiled kernels are off
(engine.kernels.jit), runs the reference. The parity test is tests/kernels/test_cpu_twins.py.
"""

from __future__ import annotations

import numpy as np

from . import jit
from .glu import OAI_ALPHA, OAI_LIMIT, GluCache, glu_backward_ref, glu_forward_ref

_KINDS = {"silu": 0, "swiglu_oai": 1}
_ALPHA = np.float32(OAI_ALPHA)
_LIMIT = np.float32(OAI_LIMIT)
_EMPTY = np.zeros(0, np.float32)


@jit.kernel
def _forward(g, u, kind, alpha, limit, a, h):  # flat (n,) float32; a: silu(g) (silu only, else empty)
    one = np.float32(1.0)
    for i in range(g.size):
        gi = g[i]
        if kind == 0:
            ai = gi / (one + jit.exp32(-gi))
            a[i] = ai
            h[i] = ai * u[i]
        else:
            gc = min(gi, limit)
            uc = min(max(u[i], -limit), limit)
            s = one / (one + jit.exp32(-(alpha * gc)))
            h[i] = gc * s * (uc + one)


@jit.kernel
def _backward(dh, g, u, a, kind, alpha, limit, dg, du):  # flat (n,) float32
    one = np.float32(1.0)
    zero = np.float32(0.0)
    for i in range(g.size):
        gi = g[i]
        d = dh[i]
        if kind == 0:
            sig = one / (one + jit.exp32(-gi))
            dg[i] = d * u[i] * (sig * (one + gi * (one - sig)))
            du[i] = d * a[i]
        else:
            ui = u[i]
            gc = min(gi, limit)
            uc = min(max(ui, -limit), limit)
            s = one / (one + jit.exp32(-(alpha * gc)))
            dgc = d * (uc + one) * (s + alpha * gc * s * (one - s))
            dg[i] = dgc if gi < limit else zero
            du[i] = d * gc * s if abs(ui) < limit else zero


def _flat(*arrays: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """The arrays as flat (n,) views in one memory order (C, or Fortran for 2-D), or None."""
    if all(a.flags.c_contiguous for a in arrays):
        return tuple(a.reshape(-1) for a in arrays)
    if all(a.ndim == 2 and a.flags.f_contiguous for a in arrays):
        return tuple(a.T.reshape(-1) for a in arrays)
    return None


def _f32(*arrays) -> bool:
    return all(type(a) is np.ndarray and a.dtype == np.float32 for a in arrays)


def glu_forward_cpu(g: np.ndarray, u: np.ndarray, act: str = "silu", table: bool | None = None):
    """CPU twin of `glu_forward_ref` (same arguments, results and cache)."""
    kind = _KINDS.get(act)
    if kind is None or not _f32(g, u) or g.shape != u.shape or not jit.enabled():
        return glu_forward_ref(g, u, act, table)
    order = "F" if not g.flags.c_contiguous else "C"
    h = np.empty(g.shape, np.float32, order=order)
    a = np.empty(g.shape, np.float32, order=order) if kind == 0 else None
    flat = _flat(g, u, h, *(() if a is None else (a,)))
    if flat is None:
        return glu_forward_ref(g, u, act, table)
    gf, uf, hf = flat[:3]
    _forward(gf, uf, kind, _ALPHA, _LIMIT, flat[3] if a is not None else _EMPTY, hf)
    return h, GluCache(g, u, a, act)


def glu_backward_cpu(dh: np.ndarray, cache: GluCache):
    """CPU twin of `glu_backward_ref` (same arguments and results)."""
    g, u, a, act, _table = cache
    kind = _KINDS.get(act)
    fits = kind is not None and _f32(dh, g, u) and dh.shape == g.shape == u.shape
    if kind == 0:
        fits = fits and a is not None and _f32(a) and a.shape == g.shape
    if not (fits and jit.enabled()):
        return glu_backward_ref(dh, cache)
    order = "F" if not g.flags.c_contiguous else "C"
    dg = np.empty(g.shape, np.float32, order=order)
    du = np.empty(g.shape, np.float32, order=order)
    flat = _flat(dh, g, u, dg, du, *((a,) if kind == 0 else ()))
    if flat is None:
        return glu_backward_ref(dh, cache)
    dhf, gf, uf, dgf, duf = flat[:5]
    _backward(dhf, gf, uf, flat[5] if kind == 0 else _EMPTY, kind, _ALPHA, _LIMIT, dgf, duf)
    return dg, du
