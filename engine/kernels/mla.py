"""Multi-head latent attention's decompression (DeepSeek-V2/V3): per-head keys and values from the
compressed KV, with `attn_k_b` / `attn_v_b` as the current convert_hf_to_gguf.py writes them.

`mla_kv_forward_ref` / `mla_kv_backward_ref` are the NumPy reference (the specification). No CUDA
twin yet: on a GPU backend the dispatcher (engine.model.ops) says so. This is the "naive" form
(keys and values expanded per head); llama.cpp's absorbed form (q through attn_k_b, attention over
the compressed KV) computes the same thing up to rounding. Not here: the projections into the
compressed KV, its norm, RoPE, the attention itself.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class MlaKvCache(NamedTuple):
    c: np.ndarray  # (B, T, R) normalised compressed KV


def mla_kv_forward_ref(c: np.ndarray, w_kb: np.ndarray, w_vb: np.ndarray):
    """k_nope[h] = c @ w_kb[h]; v[h] = c @ w_vb[h]^T.

    c (B, T, R); w_kb (NH, R, NOPE) (GGUF ne [NOPE, R, NH]); w_vb (NH, HSV, R) (ne [R, HSV, NH]).
    Returns (k_nope (B, T, NH, NOPE), v (B, T, NH, HSV)), cache.
    """
    B, T, R = c.shape
    NH, _, NOPE = w_kb.shape
    HSV = w_vb.shape[1]
    c2 = c.reshape(B * T, R)
    k = c2 @ w_kb.transpose(1, 0, 2).reshape(R, NH * NOPE)  # (N, NH*NOPE)
    v = c2 @ w_vb.transpose(2, 0, 1).reshape(R, NH * HSV)  # (N, NH*HSV)
    return (k.reshape(B, T, NH, NOPE), v.reshape(B, T, NH, HSV)), MlaKvCache(c)


def mla_kv_backward_ref(dk: np.ndarray, dv: np.ndarray, cache: MlaKvCache, w_kb: np.ndarray,
                        w_vb: np.ndarray, need_dw: bool = False):  # fmt: skip
    """forward was: k_nope[h] = c w_kb[h], v[h] = c w_vb[h]^T.  Returns (dc, dw_kb or None, dw_vb or None)."""
    (c,) = cache
    B, T, R = c.shape
    NH, _, NOPE = w_kb.shape
    HSV = w_vb.shape[1]
    dk2 = dk.reshape(B * T, NH * NOPE)
    dv2 = dv.reshape(B * T, NH * HSV)
    wk = w_kb.transpose(1, 0, 2).reshape(R, NH * NOPE)
    wv = w_vb.transpose(2, 0, 1).reshape(R, NH * HSV)
    dc = dk2 @ wk.T + dv2 @ wv.T  # (N, R)
    dw_kb = dw_vb = None
    if need_dw:
        c2 = c.reshape(B * T, R)
        dw_kb = (c2.T @ dk2).reshape(R, NH, NOPE).transpose(1, 0, 2)
        dw_vb = (c2.T @ dv2).reshape(R, NH, HSV).transpose(1, 2, 0)
    return dc.reshape(B, T, R), dw_kb, dw_vb
