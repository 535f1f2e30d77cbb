"""The CPU twin of the gated activation: `glu_forward_cpu` / `glu_backward_cpu`, the arguments,
results and cache of `engine.kernels.glu.glu_forward_ref` / `glu_backward_ref`, one compiled pass
each for "silu" (SwiGLU) and "swiglu_oai" (gpt-oss's clamped SwiGLU): the forward writes silu(g)
and h together, the backward dg and du together (NumPy makes five to eight passes and as many
temporaries). "gelu" (Gemma's GEGLU through ggml's fp16 table) runs the reference.

The arithmetic is the reference's, in its order, in float32, with `jit.exp32` for exp (within 1 ulp
of the exact value; NumPy's own within 2), so results may differ from the reference in the last
bits. float32 inputs of any strides (column blocks of the gate/up group's product, the MoE experts'
transposed products); anything else, and every call while compiled kernels are off
(engine.kernels.jit), runs the reference. The parity test is tests/kernels/test_cpu_twins.py.
"""

from __future__ import annotations

import numpy as np

from . import jit
from .glu import OAI_ALPHA, OAI_LIMIT, GluCache, glu_backward_ref, glu_forward_ref

_KINDS = {"silu": 0, "swiglu_oai": 1}
_ALPHA = np.float32(OAI_ALPHA)
_LIMIT = np.float32(OAI_LIMIT)
_EMPTY = np.zeros((0, 0), np.float32)


@jit.kernel
def _forward(g, u, kind, alpha, limit, a, h):  # (n, F) float32, any strides; a: silu(g), or empty
    one = np.float32(1.0)
    n, F = g.shape
    for r in range(n):
        for i in range(F):
            gi = g[r, i]
            if kind == 0:
                ai = gi / (one + jit.exp32(-gi))
                a[r, i] = ai
                h[r, i] = ai * u[r, i]
            else:
                gc = min(gi, limit)
                uc = min(max(u[r, i], -limit), limit)
                s = one / (one + jit.exp32(-(alpha * gc)))
                h[r, i] = gc * s * (uc + one)


@jit.kernel
def _backward(dh, g, u, a, kind, alpha, limit, dg, du):  # (n, F) float32, any strides
    one = np.float32(1.0)
    zero = np.float32(0.0)
    n, F = g.shape
    for r in range(n):
        for i in range(F):
            gi = g[r, i]
            d = dh[r, i]
            if kind == 0:
                sig = one / (one + jit.exp32(-gi))
                dg[r, i] = d * u[r, i] * (sig * (one + gi * (one - sig)))
                du[r, i] = d * a[r, i]
            else:
                ui = u[r, i]
                gc = min(gi, limit)
                uc = min(max(ui, -limit), limit)
                s = one / (one + jit.exp32(-(alpha * gc)))
                dgc = d * (uc + one) * (s + alpha * gc * s * (one - s))
                dg[r, i] = dgc if gi < limit else zero
                du[r, i] = d * gc * s if abs(ui) < limit else zero


def _rows(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The arrays as 2-D (rows, F) views where NumPy can make them (else copies)."""
    return tuple(a.reshape(-1, a.shape[-1]) if a.ndim != 2 else a for a in arrays)


def _f32(*arrays) -> bool:
    return all(type(a) is np.ndarray and a.dtype == np.float32 and a.ndim >= 1 for a in arrays)


def glu_forward_cpu(g: np.ndarray, u: np.ndarray, act: str = "silu", table: bool | None = None):
    """CPU twin of `glu_forward_ref` (same arguments, results and cache)."""
    kind = _KINDS.get(act)
    if kind is None or not _f32(g, u) or g.shape != u.shape or not jit.enabled():
        return glu_forward_ref(g, u, act, table)
    h = np.empty_like(g)  # g's memory order (the MoE experts' transposed products: Fortran)
    a = np.empty_like(g) if kind == 0 else None
    g2, u2, h2 = _rows(g, u, h)
    _forward(g2, u2, kind, _ALPHA, _LIMIT, _rows(a)[0] if a is not None else _EMPTY, h2)
    return h, GluCache(g, u, a, act)


def glu_backward_cpu(dh: np.ndarray, cache: GluCache):
    """CPU twin of `glu_backward_ref` (same arguments and results): dg and du are the two halves of
    one (..., 2F) array, which the gate/up group's backward reads as one (engine.kernels.linear_cpu)."""
    g, u, a, act, _table = cache
    kind = _KINDS.get(act)
    fits = kind is not None and _f32(dh, g, u) and dh.shape == g.shape == u.shape
    if kind == 0:
        fits = fits and a is not None and _f32(a) and a.shape == g.shape
    if not (fits and jit.enabled()):
        return glu_backward_ref(dh, cache)
    F = g.shape[-1]
    if g.ndim == 2 and g.flags.f_contiguous and not g.flags.c_contiguous:  # the experts' transposed layout
        dg, du = np.empty_like(g), np.empty_like(g)
    else:
        dgu = np.empty((*g.shape[:-1], 2 * F), np.float32)
        dg, du = dgu[..., :F], dgu[..., F:]
    dh2, g2, u2, dg2, du2 = _rows(dh, g, u, dg, du)
    _backward(dh2, g2, u2, _rows(a)[0] if kind == 0 else _EMPTY, kind, _ALPHA, _LIMIT, dg2, du2)
    return dg, du
