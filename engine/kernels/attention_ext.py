"""Grouped-query attention with what engine.kernels.attention does not take: a value head size of its
own (DeepSeek's multi-head latent attention, decompressed) and per-head attention sinks (gpt-oss).

`attention_ext_forward_ref` / `attention_ext_backward_ref` are the NumPy reference (the
specification; it stores the probabilities, as the plain reference does). No CUDA twin yet: on a GPU
backend the dispatcher (engine.model.ops) says so. Sliding windows need nothing here: they are a
mask (engine.model.forward builds it). Not here: RoPE, the projections, the KV cache.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class AttentionExtCache(NamedTuple):
    qg: np.ndarray  # (B, NKV, G, T, HS) queries grouped by their key/value head
    kt: np.ndarray  # (B, NKV, 1, HS, S) keys, transposed
    vt: np.ndarray  # (B, NKV, 1, S, HSV) values
    p: np.ndarray  # (B, NKV, G, T, S) attention probabilities (0 where masked)
    p_sink: np.ndarray | None  # (B, NKV, G, T, 1) the probability mass each row gave its sink
    scale: float


def attention_ext_forward_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
                              sinks: np.ndarray | None = None):  # fmt: skip
    """q (B, T, NH, HS); k (B, S, NKV, HS); v (B, S, NKV, HSV); mask (B, T, S) bool; sinks (NH,) or None.

    z = q k^T * scale (masked); with sinks, head h's softmax has one more logit, sinks[h] (not
    scaled), whose value is zero: p = exp(z - m) / (sum exp(z - m) + exp(sink - m)). Returns
    (B, T, NH*HSV).
    """
    B, T, NH, HS = q.shape
    NKV, HSV = k.shape[2], v.shape[3]
    G = NH // NKV
    qg = q.reshape(B, T, NKV, G, HS).transpose(0, 2, 3, 1, 4)  # (B, NKV, G, T, HS)
    kt = k.transpose(0, 2, 3, 1)[:, :, None]  # (B, NKV, 1, HS, S)
    att = (qg @ kt) * scale  # (B, NKV, G, T, S)
    att = np.where(mask[:, None, None], att, -np.inf)
    m = att.max(axis=-1, keepdims=True)  # (B, NKV, G, T, 1)
    p_sink = None
    if sinks is not None:
        s = sinks.astype(q.dtype).reshape(1, NKV, G, 1, 1)
        m = np.maximum(m, s)
    p = np.exp(att - m)
    denom = p.sum(axis=-1, keepdims=True)
    if sinks is not None:
        e_sink = np.exp(s - m)
        denom = denom + e_sink
        p_sink = e_sink / denom
    p /= denom
    vt = v.transpose(0, 2, 1, 3)[:, :, None]  # (B, NKV, 1, S, HSV)
    out = p @ vt  # (B, NKV, G, T, HSV)
    y = out.transpose(0, 3, 1, 2, 4).reshape(B, T, NH * HSV)
    return y, AttentionExtCache(qg, kt, vt, p, p_sink, scale)


def attention_ext_backward_ref(dy: np.ndarray, cache: AttentionExtCache):
    """forward was: y = softmax([z, sink]) [v, 0], z = mask(q k^T * scale).  Returns (dq, dk, dv, dsinks),
    dsinks None without sinks."""
    qg, kt, vt, p, p_sink, scale = cache
    B, NKV, G, T, HS = qg.shape
    HSV = vt.shape[-1]
    do = dy.reshape(B, T, NKV, G, HSV).transpose(0, 2, 3, 1, 4)  # (B, NKV, G, T, HSV)
    dp = do @ vt.swapaxes(-1, -2)  # (B, NKV, G, T, S)
    dv = (p.swapaxes(-1, -2) @ do).sum(axis=2)  # (B, NKV, S, HSV)
    D = (dp * p).sum(axis=-1, keepdims=True)  # the sink's value is 0: it adds p_sink * 0
    datt = p * (dp - D)
    dsinks = None
    if p_sink is not None:
        dsinks = (-(p_sink * D)).sum(axis=(0, 3, 4)).reshape(NKV * G)  # (NH,)
    datt *= scale
    dqg = datt @ kt.swapaxes(-1, -2)  # (B, NKV, G, T, HS)
    dk = (datt.swapaxes(-1, -2) @ qg).sum(axis=2)  # (B, NKV, S, HS)
    dq = dqg.transpose(0, 3, 1, 2, 4).reshape(B, T, NKV * G, HS)
    return dq, dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3), dsinks
