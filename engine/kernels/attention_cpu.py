"""The CPU twin of attention: `attention_forward_cpu` / `attention_backward_cpu`, the arguments,
results and cache of `engine.kernels.attention.attention_forward_ref` / `attention_backward_ref`.
The products (q k^T, p v and the backward's four) stay NumPy's batched matmuls; what runs compiled
(engine.kernels.jit) is the softmax between them, in place over the score buffer the product wrote:
scale, mask, row max (the sink included), exp, sum and division in one kernel (the reference makes
six passes and four (B, NKV, G, T, S) temporaries), and in the backward D = rowsum(dp p) and
datt = p (dp - D) scale in one more, in place over dp.

Same float32 operations as the reference per element (sums in float64): within float32 rounding of
it. float32 inputs only; anything else, and every call while compiled kernels are off, runs the
reference. The parity test is tests/kernels/test_cpu_twins.py.
"""

from __future__ import annotations

import numpy as np

from . import jit
from .attention import AttentionCache, attention_backward_ref, attention_forward_ref

_NO_SINKS = np.zeros(0, np.float32)
_NO_P_SINK = np.zeros((0, 0, 0, 0), np.float32)


@jit.kernel
def _softmax_rows(att, mask, scale, sinks, p_sink):
    """att (B, NKV, G, T, S) scores -> probabilities in place; mask (B, T, S) bool; sinks (NKV*G,) or
    empty; p_sink (B, NKV, G, T) the sink's probability (written when there are sinks)."""
    B, NKV, G, T, S = att.shape
    has_sinks = sinks.size > 0
    ninf = np.float32(-np.inf)
    x = att.reshape(-1)
    mk = mask.reshape(-1)
    lanes = np.empty(16, np.float32)
    acc = np.empty(16, np.float64)
    for b in range(B):
        for kv in range(NKV):
            for g in range(G):
                for t in range(T):
                    off = np.uint64((((b * NKV + kv) * G + g) * T + t) * S)
                    moff = np.uint64((b * T + t) * S)
                    for s in range(np.uint64(S)):
                        x[off + s] = x[off + s] * scale if mk[moff + s] else ninf
                    m = jit.row_max(x, off, S, lanes)
                    if has_sinks:
                        sk = sinks[kv * G + g]
                        if sk > m:
                            m = sk
                    total = jit.row_exp_sum(x, off, S, m, acc)
                    e_sink = np.float32(0.0)
                    if has_sinks:
                        e_sink = jit.exp32(sinks[kv * G + g] - m)
                        total += np.float64(e_sink)
                    denom = np.float32(total)
                    for s in range(np.uint64(S)):
                        x[off + s] = x[off + s] / denom
                    if has_sinks:
                        p_sink[b, kv, g, t] = e_sink / denom


@jit.kernel
def _softmax_backward_rows(dp, p, scale, D):
    """dp (B, NKV, G, T, S) -> datt = p (dp - D) scale in place; D (B, NKV, G, T) = rowsum(dp p)."""
    B, NKV, G, T, S = dp.shape
    x = dp.reshape(-1)
    y = p.reshape(-1)
    d_flat = D.reshape(-1)
    acc = np.empty(16, np.float64)
    for row in range(B * NKV * G * T):
        off = np.uint64(row * S)
        d = np.float32(jit.row_dot(x, off, y, off, S, acc))
        d_flat[row] = d
        for s in range(np.uint64(S)):
            x[off + s] = y[off + s] * (x[off + s] - d) * scale


def attention_forward_cpu(q, k, v, mask, scale: float, sinks=None):
    """CPU twin of `attention_forward_ref` (same arguments, results and cache)."""
    f32 = jit.f32_rows(sinks) and all(type(a) is np.ndarray and a.dtype == np.float32 for a in (q, k, v))
    if not (f32 and mask.dtype == np.bool_ and jit.enabled()):
        return attention_forward_ref(q, k, v, mask, scale, sinks)
    B, T, NH, HS = q.shape
    NKV, HSV = k.shape[2], v.shape[3]
    G = NH // NKV
    qg = q.reshape(B, T, NKV, G, HS).transpose(0, 2, 3, 1, 4)  # (B, NKV, G, T, HS)
    kt = k.transpose(0, 2, 3, 1)[:, :, None]  # (B, NKV, 1, HS, S)
    att = np.ascontiguousarray(qg @ kt)  # (B, NKV, G, T, S), a fresh array
    p_sink = np.empty((B, NKV, G, T), np.float32) if sinks is not None else None
    sink_args = (_NO_SINKS, _NO_P_SINK) if sinks is None else (sinks, p_sink)
    _softmax_rows(att, np.ascontiguousarray(mask), np.float32(scale), *sink_args)
    vt = v.transpose(0, 2, 1, 3)[:, :, None]  # (B, NKV, 1, S, HSV)
    out = att @ vt  # (B, NKV, G, T, HSV)
    y = out.transpose(0, 3, 1, 2, 4).reshape(B, T, NH * HSV)
    cache = AttentionCache(qg, kt, vt, att, scale, None if p_sink is None else p_sink[..., None])
    return y, cache


def attention_backward_cpu(dy, cache: AttentionCache):
    """CPU twin of `attention_backward_ref` (same arguments and results)."""
    qg, kt, vt, p, scale, p_sink = cache
    if not (type(dy) is np.ndarray and dy.dtype == np.float32 and jit.f32_rows(p) and jit.enabled()):
        return attention_backward_ref(dy, cache)
    B, NKV, G, T, HS = qg.shape
    HSV = vt.shape[-1]
    do = dy.reshape(B, T, NKV, G, HSV).transpose(0, 2, 3, 1, 4)  # (B, NKV, G, T, HSV)
    dp = np.ascontiguousarray(do @ vt.swapaxes(-1, -2))  # (B, NKV, G, T, S)
    dv = (p.swapaxes(-1, -2) @ do).sum(axis=2)  # (B, NKV, S, HSV)
    D = np.empty((B, NKV, G, T), np.float32)
    _softmax_backward_rows(dp, np.ascontiguousarray(p), np.float32(scale), D)  # dp becomes datt
    dsinks = None
    if p_sink is not None:
        dsinks = (-(p_sink * D[..., None])).sum(axis=(0, 3, 4)).reshape(NKV * G)
    dqg = dp @ kt.swapaxes(-1, -2)  # (B, NKV, G, T, HS)
    dk = (dp.swapaxes(-1, -2) @ qg).sum(axis=2)  # (B, NKV, S, HS)
    dq = dqg.transpose(0, 3, 1, 2, 4).reshape(B, T, NKV * G, HS)
    return dq, dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3), dsinks
