"""Multi-head latent attention's decompression (DeepSeek-V2/V3): per-head keys and values from the
compressed KV, with `attn_k_b` / `attn_v_b` as the current convert_hf_to_gguf.py writes them.

`mla_kv_forward_ref` / `mla_kv_backward_ref` are the NumPy reference (the specification);
`mla_kv_forward_on` / `mla_kv_backward_on` (and `mla_kv_forward` / `mla_kv_backward` on CuPy arrays)
the CUDA twin: the same products as the reference's, one cuBLAS GEMM each (see the CUDA section).
This is the "naive" form
(keys and values expanded per head); llama.cpp's absorbed form (q through attn_k_b, attention over
the compressed KV) computes the same thing up to rounding. Not here: the projections into the
compressed KV, its norm, RoPE, the attention itself.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .linear import matmul_into, weight_operand
from .runtime import Runtime, f32_input, runtime_for


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


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract (CuPy arrays): c (B, T, R) float32; w_kb (NH, R, NOPE) and w_vb (NH, HSV, R) float32, or
# bf16 bit patterns (uint16) as the device weight store gives them. The per-head weights are laid out
# once per call as the reference's 2-D views, Wk (R, NH*NOPE) and Wv (R, NH*HSV) (a transposed copy of
# each: NH R (NOPE + HSV) values, a layer's weights, against the N R (NOPE + HSV) products), so that
# each product is one cuBLAS GEMM over every head: k = c Wk, v = c Wv; dc = dk Wk^T + dv Wv^T (the
# second accumulated, beta = 1); dW (need_dw) = c^T dk, c^T dv in fp32, laid back out per head. A bf16
# weight takes c (and dk, dv) rounded to bf16, fp32 accumulation, as `linear.py`'s frozen weights do;
# a float32 weight runs in true fp32. Deterministic (cuBLAS GEMMs, no atomics).


def _heads_2d(rt: Runtime, w: Any, perm: tuple[int, int, int], what: str) -> Any:
    """A per-head weight (NH, a, b) as the 2-D (rows, NH*cols) view the products take, contiguous."""
    w = rt.xp.asarray(w)
    if w.ndim != 3:
        raise ValueError(f"{what} must be 3-D (NH, ...), got shape {tuple(w.shape)}")
    t = rt.xp.ascontiguousarray(w.transpose(perm))
    return weight_operand(rt, t.reshape(t.shape[0], -1), what)


def _check(c_shape, w_kb, w_vb) -> tuple[int, int, int, int]:
    R = c_shape[-1]
    NH, Rk, NOPE = w_kb.shape
    if Rk != R or w_vb.ndim != 3 or w_vb.shape[0] != NH or w_vb.shape[2] != R:
        raise ValueError(
            f"MLA weights must be w_kb (NH, R={R}, NOPE) and w_vb (NH, HSV, R={R}); "
            f"got {tuple(w_kb.shape)} and {tuple(w_vb.shape)}"
        )
    return R, NH, NOPE, w_vb.shape[1]


def mla_kv_forward_on(rt: Runtime, c: Any, w_kb: Any, w_vb: Any):
    """`mla_kv_forward` on a runtime."""
    xp = rt.xp
    c = f32_input(rt, c, "MLA compressed KV c")
    R, NH, NOPE, HSV = _check(c.shape, w_kb, w_vb)
    B, T = c.shape[:2]
    c2 = c.reshape(-1, R)
    wk = _heads_2d(rt, w_kb, (1, 0, 2), "attn_k_b")  # (R, NH*NOPE)
    wv = _heads_2d(rt, w_vb, (2, 0, 1), "attn_v_b")  # (R, NH*HSV)
    k = xp.empty((c2.shape[0], NH * NOPE), dtype=xp.float32)
    v = xp.empty((c2.shape[0], NH * HSV), dtype=xp.float32)
    cb = matmul_into(rt, c2, wk, k, trans_w=False)
    matmul_into(rt, c2, wv, v, trans_w=False, x_bf16=cb)
    return (k.reshape(B, T, NH, NOPE), v.reshape(B, T, NH, HSV)), MlaKvCache(c)


def mla_kv_backward_on(rt: Runtime, dk: Any, dv: Any, cache: MlaKvCache, w_kb: Any, w_vb: Any,
                       need_dw: bool = False):  # fmt: skip
    """`mla_kv_backward` on a runtime."""
    xp = rt.xp
    (c,) = cache
    R, NH, NOPE, HSV = _check(c.shape, w_kb, w_vb)
    B, T = c.shape[:2]
    c2 = c.reshape(-1, R)
    dk2 = f32_input(rt, dk, "MLA key gradient dk").reshape(-1, NH * NOPE)
    dv2 = f32_input(rt, dv, "MLA value gradient dv").reshape(-1, NH * HSV)
    if dk2.shape[0] != c2.shape[0] or dv2.shape[0] != c2.shape[0]:
        raise ValueError(
            f"MLA gradients have {dk2.shape[0]} and {dv2.shape[0]} rows, the forward {c2.shape[0]}"
        )
    wk = _heads_2d(rt, w_kb, (1, 0, 2), "attn_k_b")
    wv = _heads_2d(rt, w_vb, (2, 0, 1), "attn_v_b")
    dc = xp.empty((c2.shape[0], R), dtype=xp.float32)
    matmul_into(rt, dk2, wk, dc, trans_w=True)  # dc = dk Wk^T
    matmul_into(rt, dv2, wv, dc, trans_w=True, beta=1.0)  # dc += dv Wv^T
    dw_kb = dw_vb = None
    if need_dw:
        gk = xp.empty((R, NH * NOPE), dtype=xp.float32)
        gv = xp.empty((R, NH * HSV), dtype=xp.float32)
        rt.gemm(c2, dk2, gk, trans_a=True)  # c^T dk
        rt.gemm(c2, dv2, gv, trans_a=True)  # c^T dv
        dw_kb = xp.ascontiguousarray(gk.reshape(R, NH, NOPE).transpose(1, 0, 2))
        dw_vb = xp.ascontiguousarray(gv.reshape(R, NH, HSV).transpose(1, 2, 0))
    return dc.reshape(B, T, R), dw_kb, dw_vb


def mla_kv_forward(c: Any, w_kb: Any, w_vb: Any):
    """CUDA twin of `mla_kv_forward_ref`: ((k_nope, v), MlaKvCache), float32 CuPy arrays."""
    return mla_kv_forward_on(runtime_for(c, "mla_kv_forward"), c, w_kb, w_vb)


def mla_kv_backward(dk: Any, dv: Any, cache: MlaKvCache, w_kb: Any, w_vb: Any, need_dw: bool = False):
    """CUDA twin of `mla_kv_backward_ref`: (dc, dw_kb or None, dw_vb or None)."""
    return mla_kv_backward_on(runtime_for(dk, "mla_kv_backward"), dk, dv, cache, w_kb, w_vb, need_dw)
