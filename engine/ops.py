"""Forward operations of the supported transformer architectures, in NumPy.

Each op is a pure function `op_forward(...) -> (out, cache)` in the style of
llm.c: `cache` holds what a matching `op_backward(dout, cache)` needs, so that
training code can pair them; inference simply drops it. Shapes use the house
vocabulary (B batch, T tokens, C channels, NH/NKV heads, HS head size, E
experts, K experts per token, F ffn width, r LoRA rank). The functions work in
whatever float dtype they are given (float32 in use, float64 in tests).

This module knows no GGUF names and holds no state; `engine.model` wires the
ops into whole architectures.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class LoraTerm(NamedTuple):
    """One LoRA factor pair applied to a weight: y += s * (x A^T) B^T."""

    A: np.ndarray  # (r, n_in), or (E, r, n_in) for expert stacks, or (V, r) for token_embd
    B: np.ndarray  # (n_out, r), or (E, n_out, r), or (C, r) for token_embd
    s: float  # effective scale: user scale * alpha / r


# --- embedding -----------------------------------------------------------------------------------


def embedding_forward(wte: np.ndarray, tokens: np.ndarray, lora: LoraTerm | None = None):
    """x = wte[tokens] (+ s * A[tokens] B^T, llama.cpp's layout for token_embd LoRA)."""
    x = wte[tokens]  # (B, T, C)
    if lora is not None:
        x = x + lora.s * (lora.A[tokens] @ lora.B.T)
    return x, (tokens, wte.shape, lora)


# --- normalisation -------------------------------------------------------------------------------


def rmsnorm_forward(x: np.ndarray, w: np.ndarray | None, eps: float):
    """y = x / sqrt(mean(x^2) + eps) * w, over the last axis."""
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xn = x * rstd
    y = xn * w if w is not None else xn
    return y, (xn, rstd, w)


# --- linear + LoRA -------------------------------------------------------------------------------


def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, lora: LoraTerm | None = None):
    """y = x W^T (+ b) (+ s (x A^T) B^T); W (n_out, n_in), never forming B A."""
    y = x @ w.T  # (..., n_out)
    if b is not None:
        y = y + b
    xa = None
    if lora is not None:
        xa = x @ lora.A.T  # (..., r)
        y = y + lora.s * (xa @ lora.B.T)
    return y, (x, w, lora, xa)


# --- rotary position embedding --------------------------------------------------------------------


def rope_angles(
    positions: np.ndarray,
    n_rot: int,
    base: float,
    scale: float = 1.0,
    freq_factors: np.ndarray | None = None,
    dtype: Any = np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of theta_i = (pos / scale) * base^(-2i/n_rot) / ff_i, shape (*positions.shape, n_rot/2)."""
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)  # (n_rot/2,)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    theta = (positions.astype(np.float64)[..., None] / scale) * inv_freq
    return np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)


def rope_forward(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str):
    """Rotate the first n_rot dims of each head. x (B, T, H, HS); cos/sin (B, T, n_rot/2).

    style "norm" pairs (x[2i], x[2i+1]); style "neox" pairs (x[i], x[i + n_rot/2]).
    """
    half = cos.shape[-1]
    n_rot = 2 * half
    c = cos[:, :, None, :]  # (B, T, 1, n_rot/2)
    s = sin[:, :, None, :]
    y = x.copy()
    if style == "norm":
        x1, x2 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        y[..., 0:n_rot:2] = x1 * c - x2 * s
        y[..., 1:n_rot:2] = x1 * s + x2 * c
    elif style == "neox":
        x1, x2 = x[..., :half], x[..., half:n_rot]
        y[..., :half] = x1 * c - x2 * s
        y[..., half:n_rot] = x1 * s + x2 * c
    else:
        raise ValueError(f"unknown RoPE style {style!r}")
    return y, (cos, sin, style)


# --- attention -----------------------------------------------------------------------------------


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


def attention_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float):
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
    return y, (qg, kt, vt, p, scale)


# --- feed-forward --------------------------------------------------------------------------------


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def swiglu_forward(g: np.ndarray, u: np.ndarray):
    """h = silu(g) * u."""
    sg = silu(g)
    return sg * u, (g, u, sg)


# --- mixture of experts --------------------------------------------------------------------------


class Routing(NamedTuple):
    """Top-k routing of N tokens over E experts, with tokens sorted by expert once."""

    probs: np.ndarray  # (N, E) softmax of the router logits
    topk: np.ndarray  # (N, K) chosen expert ids, best first
    weights: np.ndarray  # (N, K) mixing weights (renormalised when asked)
    order: np.ndarray  # (N*K,) token-slot pairs sorted by expert: pair p = (order[p] // K, order[p] % K)
    offsets: np.ndarray  # (E+1,) pairs of expert e are order[offsets[e]:offsets[e+1]]


def route_forward(logits: np.ndarray, K: int, renorm: bool):
    """Softmax over E, top-k by probability, optional renormalisation, counting sort by expert."""
    N, E = logits.shape
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)  # (N, E)
    # top-k, best first (stable on ties: lower expert id first, as a sort by -p)
    topk = np.argsort(-p, axis=-1, kind="stable")[:, :K]  # (N, K)
    w = np.take_along_axis(p, topk, axis=-1)  # (N, K)
    wsum = None
    if renorm:
        wsum = w.sum(axis=-1, keepdims=True)
        w = w / wsum
    flat = topk.reshape(-1)  # (N*K,)
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=E)
    offsets = np.zeros(E + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    routing = Routing(p, topk, w, order, offsets)
    return routing, (routing, wsum, renorm)


def experts_forward(
    x: np.ndarray,
    routing: Routing,
    w_gate: np.ndarray,
    w_up: np.ndarray,
    w_down: np.ndarray,
    lora_gate: LoraTerm | None = None,
    lora_up: LoraTerm | None = None,
    lora_down: LoraTerm | None = None,
):
    """y_n = sum_k w_nk * down_e(silu(gate_e(x_n)) * up_e(x_n)), e = topk[n, k].

    x (N, C); w_gate/w_up (E, F, C); w_down (E, C, F); expert LoRA A (E, r, n_in), B (E, n_out, r).
    Each expert runs once on the rows routed to it (the MUL_MAT_ID pattern).
    """
    N, C = x.shape
    K = routing.topk.shape[1]
    E = w_gate.shape[0]
    pair_out = np.zeros((N * K, C), dtype=x.dtype)  # expert output per (token, slot) pair, unweighted
    for e in range(E):
        lo, hi = routing.offsets[e], routing.offsets[e + 1]
        if lo == hi:
            continue
        pairs = routing.order[lo:hi]
        xe = x[pairs // K]  # (n_e, C)
        g = xe @ w_gate[e].T  # (n_e, F)
        u = xe @ w_up[e].T
        if lora_gate is not None:
            g = g + lora_gate.s * ((xe @ lora_gate.A[e].T) @ lora_gate.B[e].T)
        if lora_up is not None:
            u = u + lora_up.s * ((xe @ lora_up.A[e].T) @ lora_up.B[e].T)
        h = silu(g) * u
        ye = h @ w_down[e].T  # (n_e, C)
        if lora_down is not None:
            ye = ye + lora_down.s * ((h @ lora_down.A[e].T) @ lora_down.B[e].T)
        pair_out[pairs] = ye
    y = np.einsum("nkc,nk->nc", pair_out.reshape(N, K, C), routing.weights.astype(x.dtype))
    return y, (x, routing, pair_out)


# --- output --------------------------------------------------------------------------------------


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)
