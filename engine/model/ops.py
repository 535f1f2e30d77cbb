"""Forward operations of the supported transformer architectures, in NumPy.

Each op is a pure function `op_forward(...) -> (out, cache)` in the style of
llm.c: `cache` (a named tuple) holds the activations a matching
`op_backward(dout, cache, ...)` needs, so that training code can pair them;
inference simply drops it. Caches never hold weights: a backward is given the
weights it needs (llm.c's `matmul_backward(..., weight, ...)`), so the weight
store may drop a dequantized layer between its forward and its backward.

Weights are NumPy arrays, or the weight store's lazy views: an expert stack is
anything indexable by expert id giving that expert's (n_out, n_in) matrix; the
embedding and the output head accept a view with `take(rows)` and
`row_chunks()` (see `take_rows` and `row_chunks`), so that a large vocabulary
is dequantized a block of rows at a time. Shapes use the house
vocabulary (B batch, T tokens, C channels, NH/NKV heads, HS head size, E
experts, K experts per token, F ffn width, r LoRA rank). The functions work in
whatever float dtype they are given (float32 in use, float64 in tests).

This module knows no GGUF names and holds no state; `engine.model.model` wires the
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


def take_rows(w, idx: np.ndarray) -> np.ndarray:
    """w[idx] for an array, or only those rows dequantized for a lazy view (get_rows)."""
    take = getattr(w, "take_rows", None)
    return take(idx) if take is not None else w[idx]


def row_chunks(w):
    """(lo, hi, rows lo..hi) blocks covering a (V, C) weight: one block for an array."""
    chunks = getattr(w, "row_chunks", None)
    return chunks() if chunks is not None else ((0, w.shape[0], w),)


class EmbeddingCache(NamedTuple):
    tokens: np.ndarray  # (B, T) ids
    shape: tuple[int, int]  # (V, C) of the embedding
    lora: LoraTerm | None


def embedding_forward(wte, tokens: np.ndarray, lora: LoraTerm | None = None):
    """x = wte[tokens] (+ s * A[tokens] B^T, llama.cpp's layout for token_embd LoRA)."""
    x = take_rows(wte, tokens)  # (B, T, C)
    if lora is not None:
        x = x + lora.s * (lora.A[tokens] @ lora.B.T)
    return x, EmbeddingCache(tokens, tuple(wte.shape), lora)


# --- normalisation -------------------------------------------------------------------------------


class NormCache(NamedTuple):
    xn: np.ndarray  # (..., C) normalised input
    rstd: np.ndarray  # (..., 1) 1 / rms


def rmsnorm_forward(x: np.ndarray, w: np.ndarray | None, eps: float):
    """y = x / sqrt(mean(x^2) + eps) * w, over the last axis."""
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xn = x * rstd
    y = xn * w if w is not None else xn
    return y, NormCache(xn, rstd)


# --- linear + LoRA -------------------------------------------------------------------------------


class LinearCache(NamedTuple):
    x: np.ndarray  # (..., n_in) input
    has_bias: bool
    lora: LoraTerm | None
    xa: np.ndarray | None  # (..., r) x A^T when there is a LoRA term


def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, lora: LoraTerm | None = None):
    """y = x W^T (+ b) (+ s (x A^T) B^T); W (n_out, n_in), never forming B A."""
    y = x @ w.T  # (..., n_out)
    if b is not None:
        y = y + b
    xa = None
    if lora is not None:
        xa = x @ lora.A.T  # (..., r)
        y = y + lora.s * (xa @ lora.B.T)
    return y, LinearCache(x, b is not None, lora, xa)


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


class RopeCache(NamedTuple):
    cos: np.ndarray  # (B, T, n_rot/2)
    sin: np.ndarray
    style: str  # "norm" or "neox"


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
    return y, RopeCache(cos, sin, style)


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


class AttentionCache(NamedTuple):
    qg: np.ndarray  # (B, NKV, G, T, HS) queries grouped by their key/value head
    kt: np.ndarray  # (B, NKV, 1, HS, S) keys, transposed
    vt: np.ndarray  # (B, NKV, 1, S, HS) values
    p: np.ndarray  # (B, NKV, G, T, S) attention probabilities (0 where masked)
    scale: float


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
    return y, AttentionCache(qg, kt, vt, p, scale)


# --- feed-forward --------------------------------------------------------------------------------


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class SwigluCache(NamedTuple):
    g: np.ndarray  # (..., F) gate pre-activation
    u: np.ndarray  # (..., F) up projection
    sg: np.ndarray  # (..., F) silu(g)


def swiglu_forward(g: np.ndarray, u: np.ndarray):
    """h = silu(g) * u."""
    sg = silu(g)
    return sg * u, SwigluCache(g, u, sg)


# --- mixture of experts --------------------------------------------------------------------------


class Routing(NamedTuple):
    """Top-k routing of N tokens over E experts, with tokens sorted by expert once."""

    probs: np.ndarray  # (N, E) softmax of the router logits
    topk: np.ndarray  # (N, K) chosen expert ids, best first
    weights: np.ndarray  # (N, K) mixing weights (renormalised when asked)
    order: np.ndarray  # (N*K,) token-slot pairs sorted by expert: pair p = (order[p] // K, order[p] % K)
    offsets: np.ndarray  # (E+1,) pairs of expert e are order[offsets[e]:offsets[e+1]]


class RouteCache(NamedTuple):
    routing: Routing
    wsum: np.ndarray | None  # (N, 1) sum of the chosen probabilities, when renormalised
    renorm: bool


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
    return routing, RouteCache(routing, wsum, renorm)


class ExpertActs(NamedTuple):
    """What one expert's forward computed on the n_e token-slot pairs routed to it."""

    e: int  # expert id
    pairs: np.ndarray  # (n_e,) token-slot pair ids (token = pair // K)
    g: np.ndarray  # (n_e, F) gate pre-activation
    u: np.ndarray  # (n_e, F) up projection
    sg: np.ndarray  # (n_e, F) silu(g)
    h: np.ndarray  # (n_e, F) silu(g) * u, the down projection's input
    xa_gate: np.ndarray | None  # (n_e, r) x A_gate^T (gate LoRA)
    xa_up: np.ndarray | None  # (n_e, r) x A_up^T (up LoRA)
    ha_down: np.ndarray | None  # (n_e, r) h A_down^T (down LoRA)


class ExpertsCache(NamedTuple):
    x: np.ndarray  # (N, C) input tokens
    routing: Routing
    pair_out: np.ndarray  # (N*K, C) each pair's expert output, before the routing weight
    per_expert: list[ExpertActs]  # experts that received tokens, in id order
    loras: tuple[LoraTerm | None, LoraTerm | None, LoraTerm | None]  # gate, up, down


def experts_forward(
    x: np.ndarray,
    routing: Routing,
    w_gate,
    w_up,
    w_down,
    lora_gate: LoraTerm | None = None,
    lora_up: LoraTerm | None = None,
    lora_down: LoraTerm | None = None,
):
    """y_n = sum_k w_nk * down_e(silu(gate_e(x_n)) * up_e(x_n)), e = topk[n, k].

    x (N, C); w_gate/w_up (E, F, C); w_down (E, C, F), each an array or a lazy stack that gives
    one expert's matrix for `w[e]` (only the experts that receive tokens are read); expert LoRA
    A (E, r, n_in), B (E, n_out, r). Each expert runs once on the rows routed to it (the MUL_MAT_ID
    pattern), in the order of `routing.order`, which the backward pass reuses.
    """
    N, C = x.shape
    K = routing.topk.shape[1]
    E = len(routing.offsets) - 1
    pair_out = np.zeros((N * K, C), dtype=x.dtype)  # expert output per (token, slot) pair, unweighted
    per_expert = []
    for e in range(E):
        lo, hi = routing.offsets[e], routing.offsets[e + 1]
        if lo == hi:
            continue
        pairs = routing.order[lo:hi]
        xe = x[pairs // K]  # (n_e, C)
        g = xe @ w_gate[e].T  # (n_e, F)
        u = xe @ w_up[e].T
        xa_g = xa_u = ha_d = None
        if lora_gate is not None:
            xa_g = xe @ lora_gate.A[e].T  # (n_e, r)
            g = g + lora_gate.s * (xa_g @ lora_gate.B[e].T)
        if lora_up is not None:
            xa_u = xe @ lora_up.A[e].T
            u = u + lora_up.s * (xa_u @ lora_up.B[e].T)
        sg = silu(g)
        h = sg * u
        ye = h @ w_down[e].T  # (n_e, C)
        if lora_down is not None:
            ha_d = h @ lora_down.A[e].T
            ye = ye + lora_down.s * (ha_d @ lora_down.B[e].T)
        pair_out[pairs] = ye
        per_expert.append(ExpertActs(e, pairs, g, u, sg, h, xa_g, xa_u, ha_d))
    y = np.einsum("nkc,nk->nc", pair_out.reshape(N, K, C), routing.weights.astype(x.dtype))
    return y, ExpertsCache(x, routing, pair_out, per_expert, (lora_gate, lora_up, lora_down))


# --- output --------------------------------------------------------------------------------------


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


# === backward passes ==============================================================================
#
# Each `op_backward(dout, cache, ...)` returns the gradients of the op's inputs (and of its weights
# when asked: frozen weights need none). LoRA factor gradients come back as (dA, dB).


def scatter_add_rows(dst: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> None:
    """dst[idx[i]] += rows[i] for repeated indices, without np.add.at's slowness (sort + reduceat)."""
    idx = idx.reshape(-1)
    rows = rows.reshape(idx.size, -1)
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    uniq, starts = np.unique(sorted_idx, return_index=True)
    dst[uniq] += np.add.reduceat(rows[order], starts, axis=0).reshape(len(uniq), *dst.shape[1:])


def embedding_backward(dx: np.ndarray, cache: EmbeddingCache, need_dw: bool = False):
    """forward was: x = W[t] + s A[t] B^T.  Returns (dW or None, dA or None, dB or None)."""
    tokens, shape, lora = cache
    C = shape[1]
    dx2 = dx.reshape(-1, C)
    dW = None
    if need_dw:
        dW = np.zeros(shape, dtype=dx.dtype)
        scatter_add_rows(dW, tokens, dx2)
    dA = dB = None
    if lora is not None:
        At = lora.A[tokens.reshape(-1)]  # (N, r)
        dB = lora.s * (dx2.T @ At)  # (C, r)
        dA = np.zeros_like(lora.A)
        scatter_add_rows(dA, tokens, lora.s * (dx2 @ lora.B))
    return dW, dA, dB


def rmsnorm_backward(dy: np.ndarray, cache: NormCache, w: np.ndarray | None):
    """forward was: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).  Returns (dx, dw or None)."""
    xn, rstd = cache
    dxn = dy * w if w is not None else dy
    dw = (dy * xn).reshape(-1, w.shape[-1]).sum(axis=0) if w is not None else None
    dx = rstd * (dxn - xn * np.mean(dxn * xn, axis=-1, keepdims=True))
    return dx, dw


def linear_backward(dy: np.ndarray, cache: LinearCache, w: np.ndarray, need_dw: bool = False):
    """forward was: y = x W^T + b + s (x A^T) B^T.  Returns (dx, dW, db, dA, dB), None where not needed."""
    x, has_bias, lora, xa = cache
    n_out, n_in = w.shape
    dy2 = dy.reshape(-1, n_out)
    x2 = x.reshape(-1, n_in)
    dx = dy @ w  # (..., n_in)
    dW = dy2.T @ x2 if need_dw else None
    db = dy2.sum(axis=0) if has_bias else None
    dA = dB = None
    if lora is not None:
        r = lora.A.shape[0]
        dyB = dy2 @ lora.B  # (N, r)
        dB = lora.s * (dy2.T @ xa.reshape(-1, r))  # (n_out, r)
        dA = lora.s * (dyB.T @ x2)  # (r, n_in)
        dx = dx + lora.s * (dyB @ lora.A).reshape(dx.shape)
    return dx, dW, db, dA, dB


def rope_backward(dy: np.ndarray, cache: RopeCache) -> np.ndarray:
    """forward was: y = R(theta) x, a rotation; so dx = R(-theta) dy."""
    cos, sin, style = cache
    dx, _ = rope_forward(dy, cos, -sin, style)
    return dx


def attention_backward(dy: np.ndarray, cache: AttentionCache):
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


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def swiglu_backward(dh: np.ndarray, cache: SwigluCache):
    """forward was: h = silu(g) * u.  Returns (dg, du)."""
    g, u, sg = cache
    sig = sigmoid(g)
    dg = dh * u * (sig * (1.0 + g * (1.0 - sig)))
    du = dh * sg
    return dg, du


def route_backward(dweights: np.ndarray, cache: RouteCache) -> np.ndarray:
    """forward was: p = softmax(logits); w = p[topk] (/ sum p[topk] when renormalised).  Returns dlogits.

    The choice of the top k is piecewise constant, so the gradient flows through the chosen weights only.
    """
    routing, wsum, renorm = cache
    p, w = routing.probs, routing.weights
    if renorm:
        dsel = (dweights - (dweights * w).sum(axis=-1, keepdims=True)) / wsum
    else:
        dsel = dweights
    dp = np.zeros_like(p)
    np.put_along_axis(dp, routing.topk, dsel.astype(p.dtype), axis=-1)
    return p * (dp - (dp * p).sum(axis=-1, keepdims=True))


def experts_backward(dy: np.ndarray, cache: ExpertsCache, w_gate, w_up, w_down, need_dw: bool = False):
    """forward was: y_n = sum_k w_nk * down_e(silu(gate_e(x_n)) * up_e(x_n)).

    The expert weights are given again (arrays or lazy stacks, as in the forward).
    Returns (dx, dweights (N, K), dW or None, dlora): dW maps "gate"/"up"/"down" to (E, ...) arrays and
    dlora maps them to (dA, dB).
    Activations go back through each expert's transposed weights (MUL_MAT_ID backward); weight and LoRA
    factor gradients are per-expert sums of outer products over the tokens routed to it (OUT_PROD_ID).
    """
    x, routing, pair_out, per_expert, loras = cache
    lora_gate, lora_up, lora_down = loras
    N, C = x.shape
    K = routing.topk.shape[1]
    dweights = np.einsum("nkc,nc->nk", pair_out.reshape(N, K, C), dy)
    do = (dy[:, None, :] * routing.weights[:, :, None].astype(dy.dtype)).reshape(N * K, C)
    dx_pairs = np.zeros((N * K, C), dtype=dy.dtype)
    dW = (
        {k: np.zeros(w.shape, dy.dtype) for k, w in (("gate", w_gate), ("up", w_up), ("down", w_down))}
        if need_dw
        else None
    )
    dlora = {}
    for name, lora in (("gate", lora_gate), ("up", lora_up), ("down", lora_down)):
        if lora is not None:
            dlora[name] = (np.zeros_like(lora.A), np.zeros_like(lora.B))
    for e, pairs, g, u, sg, h, xa_g, xa_u, ha_d in per_expert:
        xe = x[pairs // K]  # (n_e, C)
        do_e = do[pairs]  # (n_e, C)
        dh = do_e @ w_down[e]  # (n_e, F)
        if lora_down is not None:
            doB = do_e @ lora_down.B[e]  # (n_e, r)
            dh += lora_down.s * (doB @ lora_down.A[e])
            dlora["down"][0][e] = lora_down.s * (doB.T @ h)
            dlora["down"][1][e] = lora_down.s * (do_e.T @ ha_d)
        dg, du = swiglu_backward(dh, SwigluCache(g, u, sg))
        dxe = dg @ w_gate[e]
        dxe += du @ w_up[e]
        for name, lora, d, xa in (("gate", lora_gate, dg, xa_g), ("up", lora_up, du, xa_u)):
            if lora is not None:
                dB_ = d @ lora.B[e]  # (n_e, r)
                dxe += lora.s * (dB_ @ lora.A[e])
                dlora[name][0][e] = lora.s * (dB_.T @ xe)
                dlora[name][1][e] = lora.s * (d.T @ xa)
        if need_dw:
            dW["down"][e] = do_e.T @ h
            dW["gate"][e] = dg.T @ xe
            dW["up"][e] = du.T @ xe
        dx_pairs[pairs] = dxe
    dx = dx_pairs.reshape(N, K, C).sum(axis=1)
    return dx, dweights, dW, dlora


def project(h: np.ndarray, w) -> np.ndarray:
    """Logits h W^T for h (..., C) and an output weight (V, C) given as an array or in row blocks."""
    V = w.shape[0]
    out = np.empty((*h.shape[:-1], V), dtype=h.dtype)
    for lo, hi, wc in row_chunks(w):
        out[..., lo:hi] = h @ wc.T
    return out


def _log_softmax_rows(z: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in place."""
    z -= z.max(axis=-1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return z


def _softmax_inplace_pair(z: np.ndarray) -> np.ndarray:
    """Turn logits z (n, V) into log-probabilities in place; return the probabilities (one new array)."""
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    s = p.sum(axis=-1, keepdims=True)
    z -= np.log(s)
    p /= s
    return p


def _is_one_block(w) -> bool:
    """Whether the output weight is in memory as one array (else it is read in row blocks)."""
    if isinstance(w, np.ndarray):
        return True
    fits = getattr(w, "fits_in_memory", None)
    return bool(fits()) if fits is not None else False


def lm_head_loss(
    h: np.ndarray,
    w,
    targets: np.ndarray,
    weights: np.ndarray,
    *,
    lora: LoraTerm | None = None,
    tied_lora: LoraTerm | None = None,
    need_dw: bool = False,
    max_logits_bytes: int = 16 << 20,
    min_rows: int = 128,
    h_ref: np.ndarray | None = None,
    w_ref=None,
    kl_coef: float = 0.0,
    backward: bool = True,
):
    """Output projection fused with cross-entropy; full logits of all rows are never stored.

    forward: z = h W^T (+ s (h A^T) B^T; + s (h B) A^T for a tied token_embd adapter);
    loss = sum_t weights_t * (-log softmax(z_t)[targets_t])  (+ kl_coef * sum_t |w_t| KL(p_t || q_t)).
    Only rows with targets >= 0 are computed. For the KL term, q = softmax(h_ref W_ref^T) is the
    reference model's distribution (its own hidden states and output weight, without adapters).
    W (V, C) is an array or a lazy view: when it is in memory as one array, logits are computed
    for blocks of label rows (`max_logits_bytes` of logits, but at least `min_rows` rows: fewer
    rows per matmul read the whole head once per block and run at half speed, measured on a
    152k vocabulary); when it is read in blocks of
    vocabulary rows (`row_chunks`, a large quantized head), the loss streams over the vocabulary
    twice (online log-sum-exp, then the gradients), so the head is never dequantized whole.
    With backward=False only the loss is computed. Returns (loss, stats, dh, grads) where grads
    holds "W" (when need_dw), "lora" (dA, dB) and "tied_lora" (dA, dB); stats = (sum of ce,
    label tokens).
    """
    if not _is_one_block(w) and not need_dw:
        return _lm_head_loss_streamed(
            h, w, targets, weights, lora, tied_lora, max_logits_bytes, h_ref, w_ref, kl_coef, backward
        )
    N, C = h.shape
    V = w.shape[0]
    kl = bool(kl_coef) and h_ref is not None
    rows_all = np.flatnonzero(targets >= 0)
    chunk = max(1, min_rows, int(max_logits_bytes // (V * h.itemsize)))
    dh = np.zeros_like(h)
    dW = np.zeros(w.shape, h.dtype) if need_dw else None
    dl = (np.zeros_like(lora.A), np.zeros_like(lora.B)) if lora is not None else None
    dt = (np.zeros_like(tied_lora.A), np.zeros_like(tied_lora.B)) if tied_lora is not None else None
    loss = 0.0
    ce_sum = 0.0
    for start in range(0, rows_all.size, chunk):
        rows = rows_all[start : start + chunk]
        n = rows.size
        hc = h[rows]  # (n, C)
        logp = project(hc, w)  # (n, V) logits, then log-probabilities in place
        ha = hb = None
        if lora is not None:
            ha = hc @ lora.A.T  # (n, r)
            logp += (lora.s * ha) @ lora.B.T
        if tied_lora is not None:
            hb = hc @ tied_lora.B  # (n, r)
            logp += (tied_lora.s * hb) @ tied_lora.A.T
        p = _softmax_inplace_pair(logp)  # logp becomes log-probabilities, p the probabilities
        tgt = targets[rows]
        wt = weights[rows].astype(h.dtype)
        ce = -logp[np.arange(n), tgt]
        loss += float((wt * ce).sum())
        ce_sum += float(ce.sum())
        if kl:
            logq = _log_softmax_rows(project(h_ref[rows], w_ref))
            klv = (p * (logp - logq)).sum(axis=-1)  # (n,)
            aw = np.abs(wt)
            loss += kl_coef * float((aw * klv).sum())
        if not backward:
            continue
        dz = p
        if kl:
            # d KL(p||q) / dz = p * (log p - log q - KL)
            logp -= logq
            logp -= klv[:, None]
            logp *= p
            logp *= (kl_coef * aw)[:, None]
        dz *= wt[:, None]
        dz[np.arange(n), tgt] -= wt
        if kl:
            dz += logp
        dhc = np.zeros((n, C), h.dtype)
        for lo, hi, wc in row_chunks(w):
            dhc += dz[:, lo:hi] @ wc
            if need_dw:
                dW[lo:hi] += dz[:, lo:hi].T @ hc
        if lora is not None:
            dzB = dz @ lora.B  # (n, r)
            dhc += lora.s * (dzB @ lora.A)
            dl[0][...] += lora.s * (dzB.T @ hc)
            dl[1][...] += lora.s * (dz.T @ ha)
        if tied_lora is not None:
            dzA = dz @ tied_lora.A  # (n, r)
            dhc += tied_lora.s * (dzA @ tied_lora.B.T)
            dt[0][...] += tied_lora.s * (dz.T @ hb)  # dA (V, r)
            dt[1][...] += tied_lora.s * (hc.T @ dzA)  # dB (C, r)
        dh[rows] = dhc
    grads = {"W": dW, "lora": dl, "tied_lora": dt}
    return loss, (ce_sum, int(rows_all.size)), dh, grads


def _lm_head_loss_streamed(h, w, targets, weights, lora, tied_lora, max_logits_bytes, h_ref, w_ref,
                           kl_coef, backward):  # fmt: skip
    """`lm_head_loss` for an output weight read in blocks of vocabulary rows (see there).

    Pass 1 walks the vocabulary once: per label row the running maximum m and sum
    s = sum_v exp(z_v - m) (online log-sum-exp), the target's logit, and for the KL term the same
    for the reference logits plus E_p[z] and E_p[z_ref] (rescaled like s), which give
    KL(p||q) = E_p[z] - lse(z) - E_p[z_ref] + lse(z_ref). Pass 2 walks it again to form each
    block's dz = w_t (p - onehot) + kl_coef |w_t| p (log p - log q - KL) and push it back.
    """
    N, C = h.shape
    dtype = h.dtype
    kl = bool(kl_coef) and h_ref is not None
    rows = np.flatnonzero(targets >= 0)
    n = rows.size
    hc = h[rows]  # (n, C)
    tgt = targets[rows]
    wt = weights[rows].astype(dtype)
    ha = hc @ lora.A.T if lora is not None else None  # (n, r)
    hb = hc @ tied_lora.B if tied_lora is not None else None  # (n, r)
    hr = h_ref[rows] if kl else None

    def block_logits(lo, hi, wc):
        z = hc @ wc.T  # (n, hi - lo)
        if lora is not None:
            z += lora.s * (ha @ lora.B[lo:hi].T)
        if tied_lora is not None:
            z += tied_lora.s * (hb @ tied_lora.A[lo:hi].T)
        return z

    # a streamed head is a frozen base tensor, so the reference model's head is the same tensor
    assert not kl or getattr(w_ref, "name", None) == getattr(w, "name", ""), "reference head differs"
    # pass 1: log-sum-exp of the policy (and reference) logits, target logits, KL moments
    m = np.full(n, -np.inf, dtype)
    s = np.zeros(n, dtype)
    z_t = np.zeros(n, dtype)
    if kl:
        mr = np.full(n, -np.inf, dtype)
        sr = np.zeros(n, dtype)
        ez = np.zeros(n, dtype)  # sum exp(z - m) z
        ezr = np.zeros(n, dtype)  # sum exp(z - m) z_ref
    for lo, hi, wc in row_chunks(w):
        z = block_logits(lo, hi, wc)
        inside = (tgt >= lo) & (tgt < hi)
        z_t[inside] = z[inside, tgt[inside] - lo]
        m_new = np.maximum(m, z.max(axis=1))
        rescale = np.exp(m - m_new)
        e = np.exp(z - m_new[:, None])
        s = s * rescale + e.sum(axis=1)
        if kl:
            zr = hr @ wc.T
            ez = ez * rescale + (e * z).sum(axis=1)
            ezr = ezr * rescale + (e * zr).sum(axis=1)
            mr_new = np.maximum(mr, zr.max(axis=1))
            sr = sr * np.exp(mr - mr_new) + np.exp(zr - mr_new[:, None]).sum(axis=1)
            mr = mr_new
        m = m_new
    lse = m + np.log(s)
    ce = lse - z_t
    loss = float((wt * ce).sum())
    ce_sum = float(ce.sum())
    if kl:
        lse_r = mr + np.log(sr)
        klv = ez / s - lse - ezr / s + lse_r  # (n,)
        aw = np.abs(wt)
        loss += kl_coef * float((aw * klv).sum())
    dh = np.zeros_like(h)
    dl = (np.zeros_like(lora.A), np.zeros_like(lora.B)) if lora is not None else None
    dt = (np.zeros_like(tied_lora.A), np.zeros_like(tied_lora.B)) if tied_lora is not None else None
    if backward and n:
        # pass 2: dz block by block, pushed back into dh and the LoRA factors
        dhc = np.zeros((n, C), dtype)
        dzB = np.zeros((n, lora.B.shape[1]), dtype) if lora is not None else None
        dzA = np.zeros((n, tied_lora.A.shape[1]), dtype) if tied_lora is not None else None
        for lo, hi, wc in row_chunks(w):
            logp = block_logits(lo, hi, wc)
            logp -= lse[:, None]
            p = np.exp(logp)
            dz = p * wt[:, None]
            inside = np.flatnonzero((tgt >= lo) & (tgt < hi))
            dz[inside, tgt[inside] - lo] -= wt[inside]
            if kl:
                logq = hr @ wc.T
                logq -= lse_r[:, None]
                # d KL(p||q) / dz = p * (log p - log q - KL)
                dz += (kl_coef * aw)[:, None] * p * (logp - logq - klv[:, None])
            dhc += dz @ wc
            if lora is not None:
                dzB += dz @ lora.B[lo:hi]
                dl[1][lo:hi] += lora.s * (dz.T @ ha)
            if tied_lora is not None:
                dzA += dz @ tied_lora.A[lo:hi]
                dt[0][lo:hi] += tied_lora.s * (dz.T @ hb)
        if lora is not None:
            dhc += lora.s * (dzB @ lora.A)
            dl[0][...] += lora.s * (dzB.T @ hc)
        if tied_lora is not None:
            dhc += tied_lora.s * (dzA @ tied_lora.B.T)
            dt[1][...] += tied_lora.s * (hc.T @ dzA)
        dh[rows] = dhc
    grads = {"W": None, "lora": dl, "tied_lora": dt}
    return loss, (ce_sum, int(n)), dh, grads
