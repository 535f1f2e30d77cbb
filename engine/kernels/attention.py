"""Causal grouped-query attention with a block-diagonal mask for packed samples.

NumPy reference (the specification).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def attention_mask(
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    q_seg: np.ndarray | None = None,
    k_seg: np.ndarray | None = None,
) -> np.ndarray:
    """Boolean (B, T, S): query t sees key s when k_pos <= q_pos (and both lie in the same packed sample)."""
    allowed = k_pos[:, None, :] <= q_pos[:, :, None]
    if q_seg is not None and k_seg is not None:
        allowed &= k_seg[:, None, :] == q_seg[:, :, None]
    return allowed


class AttentionCache(NamedTuple):
    qg: np.ndarray  # (B, NKV, G, T, HS) queries grouped by their key/value head
    kt: np.ndarray  # (B, NKV, 1, HS, S) keys, transposed
    vt: np.ndarray  # (B, NKV, 1, S, HS) values
    p: np.ndarray  # (B, NKV, G, T, S) attention probabilities (0 where masked)
    scale: float


def attention_forward_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float):
    """Grouped-query attention. q (B, T, NH, HS); k, v (B, S, NKV, HS); mask (B, T, S) bool.

    Query head h reads key/value head h // (NH / NKV). Returns (B, T, NH*HS).
    """
    B, T, NH, HS = q.shape
    NKV = k.shape[2]
    G = NH // NKV
    qg = q.reshape(B, T, NKV, G, HS).transpose(0, 2, 3, 1, 4)  # (B, NKV, G, T, HS)
    kt = k.transpose(0, 2, 3, 1)[:, :, None]  # (B, NKV, 1, HS, S)
    att = (qg @ kt) * scale  # (B, NKV, G, T, S)
    m = mask[:, None, None]  # (B, 1, 1, T, S)
    att = np.where(m, att, -np.inf)
    att = att - att.max(axis=-1, keepdims=True)
    p = np.exp(att)
    p /= p.sum(axis=-1, keepdims=True)  # (B, NKV, G, T, S)
    vt = v.transpose(0, 2, 1, 3)[:, :, None]  # (B, NKV, 1, S, HS)
    out = p @ vt  # (B, NKV, G, T, HS)
    y = out.transpose(0, 3, 1, 2, 4).reshape(B, T, NH * HS)
    return y, AttentionCache(qg, kt, vt, p, scale)


def attention_backward_ref(dy: np.ndarray, cache: AttentionCache):
    """forward was: y = softmax(mask(q k^T * scale)) v, per KV group.  Returns (dq, dk, dv)."""
    qg, kt, vt, p, scale = cache
    B, NKV, G, T, HS = qg.shape
    do = dy.reshape(B, T, NKV, G, HS).transpose(0, 2, 3, 1, 4)  # (B, NKV, G, T, HS)
    dp = do @ vt.swapaxes(-1, -2)  # (B, NKV, G, T, S)
    dv = (p.swapaxes(-1, -2) @ do).sum(axis=2)  # (B, NKV, S, HS)
    datt = p * (dp - (dp * p).sum(axis=-1, keepdims=True))  # softmax backward; masked p = 0
    datt *= scale
    dqg = datt @ kt.swapaxes(-1, -2)  # (B, NKV, G, T, HS)
    dk = (datt.swapaxes(-1, -2) @ qg).sum(axis=2)  # (B, NKV, S, HS)
    dq = dqg.transpose(0, 3, 1, 2, 4).reshape(B, T, NKV * G, HS)
    return dq, dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3)
