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
from .linear_cpu import joined_columns

_KINDS = {"silu": 0, "swiglu_oai": 1}
_ALPHA = np.float32(OAI_ALPHA)
_LIMIT = np.float32(OAI_LIMIT)
_EMPTY = np.zeros(0, np.float32)


# Kernels index flat arrays with unsigned offsets: numba wraps a negative signed index around, and that
# select on every computed index (row offset + i) kept LLVM from vectorising the loops (4x slower).


@jit.kernel
def _forward(gs, gld, gc, us, uld, uc, n, F, kind, alpha, limit, a, h):
    """h = act(g, u) for n rows of F values: g row r at gs[r gld + gc ...], u at us[r uld + uc ...] (flat
    C-contiguous sources: g and u may be the two halves of one product); h and a (silu(g), silu only,
    else empty) flat (n F,)."""
    one = np.float32(1.0)
    for r in range(n):
        go, uo, ho = np.uint64(r * gld + gc), np.uint64(r * uld + uc), np.uint64(r * F)
        if kind == 0:
            for i in range(np.uint64(F)):
                gi = gs[go + i]
                ai = gi / (one + jit.exp32(-gi))
                a[ho + i] = ai
                h[ho + i] = ai * us[uo + i]
        else:
            for i in range(np.uint64(F)):
                gcl = min(gs[go + i], limit)
                ucl = min(max(us[uo + i], -limit), limit)
                s = one / (one + jit.exp32(-(alpha * gcl)))
                h[ho + i] = gcl * s * (ucl + one)


@jit.kernel
def _backward(dh, gs, gld, gc, us, uld, uc, n, F, a, kind, alpha, limit, dgs, dgld, dgc, dus, duld, duc):
    """dg, du (rows at dgs[r dgld + dgc ...], dus[r duld + duc ...]) from dh (flat (n F,)) and g, u as in
    `_forward`. dg and du are written in two loops per row: one loop storing into two halves of one
    array was not vectorised (its runtime overlap check fails), 10x slower."""
    one = np.float32(1.0)
    zero = np.float32(0.0)
    for r in range(n):
        go, uo, ho = np.uint64(r * gld + gc), np.uint64(r * uld + uc), np.uint64(r * F)
        dgo, duo = np.uint64(r * dgld + dgc), np.uint64(r * duld + duc)
        if kind == 0:
            for i in range(np.uint64(F)):
                gi = gs[go + i]
                sig = one / (one + jit.exp32(-gi))
                dgs[dgo + i] = dh[ho + i] * us[uo + i] * (sig * (one + gi * (one - sig)))
            for i in range(np.uint64(F)):
                dus[duo + i] = dh[ho + i] * a[ho + i]
        else:
            for i in range(np.uint64(F)):
                gi = gs[go + i]
                gcl = min(gi, limit)
                ucl = min(max(us[uo + i], -limit), limit)
                s = one / (one + jit.exp32(-(alpha * gcl)))
                dgcl = dh[ho + i] * (ucl + one) * (s + alpha * gcl * s * (one - s))
                dgs[dgo + i] = dgcl if gi < limit else zero
            for i in range(np.uint64(F)):
                ui = us[uo + i]
                gcl = min(gs[go + i], limit)
                s = one / (one + jit.exp32(-(alpha * gcl)))
                dus[duo + i] = dh[ho + i] * gcl * s if abs(ui) < limit else zero


def _sources(g: np.ndarray, u: np.ndarray):
    """((gs, gld, gc), (us, uld, uc), n, F, transposed): flat C-contiguous arrays, row strides and
    offsets (in values) holding g and u as `_forward` reads them, or None. Two halves of one product
    (the gate/up group's output); two C-contiguous arrays; or two Fortran-ordered 2-D arrays (the MoE
    experts' transposed products), taken transposed (transposed True: every array of the call is)."""
    if g.flags.c_contiguous and u.flags.c_contiguous:
        F = g.shape[-1]
        return (g.reshape(-1), F, 0), (u.reshape(-1), F, 0), g.size // max(F, 1), F, False
    if g.ndim == 2 and g.flags.f_contiguous and u.flags.f_contiguous:
        rows, length = g.shape[1], g.shape[0]  # g.T is C-contiguous (rows, length)
        return (g.T.reshape(-1), length, 0), (u.T.reshape(-1), length, 0), rows, length, True
    whole = joined_columns([g, u])
    if whole is not None:
        F, ld = g.shape[-1], whole.shape[1]
        flat = whole.reshape(-1)
        return (flat, ld, 0), (flat, ld, F), whole.shape[0], F, False
    return None


def _f32(*arrays) -> bool:
    return all(type(a) is np.ndarray and a.dtype == np.float32 and a.ndim >= 1 for a in arrays)


def glu_forward_cpu(g: np.ndarray, u: np.ndarray, act: str = "silu", table: bool | None = None):
    """CPU twin of `glu_forward_ref` (same arguments, results and cache)."""
    kind = _KINDS.get(act)
    src = _sources(g, u) if kind is not None and _f32(g, u) and g.shape == u.shape else None
    if src is None or not jit.enabled():
        return glu_forward_ref(g, u, act, table)
    gsrc, usrc, n, F, transposed = src
    h = np.empty_like(g, order="F" if transposed else "C")
    a = np.empty_like(h) if kind == 0 else None
    flat = (lambda x: x.T.reshape(-1)) if transposed else (lambda x: x.reshape(-1))
    _forward(*gsrc, *usrc, n, F, kind, _ALPHA, _LIMIT, flat(a) if a is not None else _EMPTY, flat(h))
    return h, GluCache(g, u, a, act)


def glu_backward_cpu(dh: np.ndarray, cache: GluCache):
    """CPU twin of `glu_backward_ref` (same arguments and results): dg and du are the two halves of
    one (..., 2F) array, which the gate/up group's backward reads as one (engine.kernels.linear_cpu)."""
    g, u, a, act, _table = cache
    kind = _KINDS.get(act)
    fits = kind is not None and _f32(dh, g, u) and dh.shape == g.shape == u.shape
    if kind == 0:
        fits = fits and a is not None and _f32(a) and a.shape == g.shape
    src = _sources(g, u) if fits else None
    if src is None or not jit.enabled():
        return glu_backward_ref(dh, cache)
    gsrc, usrc, n, F, transposed = src
    if transposed:  # the experts' layout: dg, du Fortran-ordered, written as their C-ordered transposes
        dgT, duT = np.empty((n, F), np.float32), np.empty((n, F), np.float32)
        aT = a.T.reshape(-1) if a is not None else _EMPTY
        dhT = np.ascontiguousarray(dh.T).reshape(-1)
        _backward(
            dhT, *gsrc, *usrc, n, F, aT, kind, _ALPHA, _LIMIT, dgT.reshape(-1), F, 0, duT.reshape(-1), F, 0
        )
        return dgT.T, duT.T
    dgu = np.empty((*g.shape[:-1], 2 * F), np.float32)
    d = dgu.reshape(-1)
    a1 = a.reshape(-1) if a is not None else _EMPTY
    dh1 = np.ascontiguousarray(dh).reshape(-1)
    _backward(dh1, *gsrc, *usrc, n, F, a1, kind, _ALPHA, _LIMIT, d, 2 * F, 0, d, 2 * F, F)
    return dgu[..., :F], dgu[..., F:]
