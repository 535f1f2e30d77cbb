"""Forward operations of the supported transformer architectures, in NumPy.

Each op is a pure function `op_forward(...) -> (out, cache)` in the style of
llm.c: `cache` holds what a matching `op_backward(dout, cache)` needs, so that
training code can pair them; inference simply drops it. Shapes use the house
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
    return y, (x, w, b is not None, lora, xa)


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
    Each expert runs once on the rows routed to it (the MUL_MAT_ID pattern), in the order of
    `routing.order`, which the backward pass reuses.
    """
    N, C = x.shape
    K = routing.topk.shape[1]
    E = w_gate.shape[0]
    pair_out = np.zeros((N * K, C), dtype=x.dtype)  # expert output per (token, slot) pair, unweighted
    per_expert = []  # (e, pairs, g, u, sg, h, x A_gate^T, x A_up^T, h A_down^T) for the backward pass
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
        per_expert.append((e, pairs, g, u, sg, h, xa_g, xa_u, ha_d))
    y = np.einsum("nkc,nk->nc", pair_out.reshape(N, K, C), routing.weights.astype(x.dtype))
    return y, (x, routing, pair_out, per_expert, (w_gate, w_up, w_down), (lora_gate, lora_up, lora_down))


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


def embedding_backward(dx: np.ndarray, cache, need_dw: bool = False):
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


def rmsnorm_backward(dy: np.ndarray, cache):
    """forward was: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).  Returns (dx, dw or None)."""
    xn, rstd, w = cache
    dxn = dy * w if w is not None else dy
    dw = (dy * xn).reshape(-1, w.shape[-1]).sum(axis=0) if w is not None else None
    dx = rstd * (dxn - xn * np.mean(dxn * xn, axis=-1, keepdims=True))
    return dx, dw


def linear_backward(dy: np.ndarray, cache, need_dw: bool = False):
    """forward was: y = x W^T + b + s (x A^T) B^T.  Returns (dx, dW, db, dA, dB), None where not needed."""
    x, w, has_bias, lora, xa = cache
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


def rope_backward(dy: np.ndarray, cache) -> np.ndarray:
    """forward was: y = R(theta) x, a rotation; so dx = R(-theta) dy."""
    cos, sin, style = cache
    dx, _ = rope_forward(dy, cos, -sin, style)
    return dx


def attention_backward(dy: np.ndarray, cache):
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


def swiglu_backward(dh: np.ndarray, cache):
    """forward was: h = silu(g) * u.  Returns (dg, du)."""
    g, u, sg = cache
    sig = sigmoid(g)
    dg = dh * u * (sig * (1.0 + g * (1.0 - sig)))
    du = dh * sg
    return dg, du


def route_backward(dweights: np.ndarray, cache) -> np.ndarray:
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


def experts_backward(dy: np.ndarray, cache, need_dw: bool = False):
    """forward was: y_n = sum_k w_nk * down_e(silu(gate_e(x_n)) * up_e(x_n)).

    Returns (dx, dweights (N, K), dW or None, dlora): dW maps "gate"/"up"/"down" to (E, ...) arrays and
    dlora maps them to (dA, dB).
    Activations go back through each expert's transposed weights (MUL_MAT_ID backward); weight and LoRA
    factor gradients are per-expert sums of outer products over the tokens routed to it (OUT_PROD_ID).
    """
    x, routing, pair_out, per_expert, (w_gate, w_up, w_down), loras = cache
    lora_gate, lora_up, lora_down = loras
    N, C = x.shape
    K = routing.topk.shape[1]
    dweights = np.einsum("nkc,nc->nk", pair_out.reshape(N, K, C), dy)
    do = (dy[:, None, :] * routing.weights[:, :, None].astype(dy.dtype)).reshape(N * K, C)
    dx_pairs = np.zeros((N * K, C), dtype=dy.dtype)
    dW = (
        {k: np.zeros_like(w) for k, w in (("gate", w_gate), ("up", w_up), ("down", w_down))}
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
        sig = sigmoid(g)
        dg = dh * u * (sig * (1.0 + g * (1.0 - sig)))
        du = dh * sg
        dxe = dg @ w_gate[e] + du @ w_up[e]
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


def lm_head_loss(
    h: np.ndarray,
    w: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray,
    *,
    lora: LoraTerm | None = None,
    tied_lora: LoraTerm | None = None,
    need_dw: bool = False,
    chunk: int = 256,
    ref_logits=None,
    kl_coef: float = 0.0,
    backward: bool = True,
):
    """Output projection fused with cross-entropy, in chunks of rows (full logits are never stored).

    forward: z = h W^T (+ s (h A^T) B^T; + s (h B) A^T for a tied token_embd adapter);
    loss = sum_t weights_t * (-log softmax(z_t)[targets_t])  (+ kl_coef * sum_t |w_t| KL(p_t || q_t)).
    Only rows with targets >= 0 are computed. `ref_logits(rows) -> z_ref` gives a reference model's
    logits for those rows (for the KL term). With backward=False only the loss is computed (dh and
    grads come back as zeros/None). Returns (loss, stats, dh, grads) where grads holds
    "W" (when need_dw), "lora" (dA, dB) and "tied_lora" (dA, dB); stats = (sum of ce, label tokens).
    """
    N, C = h.shape
    rows_all = np.flatnonzero(targets >= 0)
    dh = np.zeros_like(h)
    dW = np.zeros_like(w) if need_dw else None
    dl = (np.zeros_like(lora.A), np.zeros_like(lora.B)) if lora is not None else None
    dt = (np.zeros_like(tied_lora.A), np.zeros_like(tied_lora.B)) if tied_lora is not None else None
    loss = 0.0
    ce_sum = 0.0
    for start in range(0, rows_all.size, chunk):
        rows = rows_all[start : start + chunk]
        hc = h[rows]  # (n, C)
        z = hc @ w.T  # (n, V)
        if lora is not None:
            ha = hc @ lora.A.T  # (n, r)
            z += lora.s * (ha @ lora.B.T)
        if tied_lora is not None:
            hb = hc @ tied_lora.B  # (n, r)
            z += tied_lora.s * (hb @ tied_lora.A.T)
        z = z - z.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        tgt = targets[rows]
        wt = weights[rows].astype(h.dtype)
        ce = -logp[np.arange(rows.size), tgt]
        loss += float((wt * ce).sum())
        ce_sum += float(ce.sum())
        p = np.exp(logp)
        if kl_coef and ref_logits is not None:
            zr = ref_logits(rows)
            zr = zr - zr.max(axis=-1, keepdims=True)
            logq = zr - np.log(np.exp(zr).sum(axis=-1, keepdims=True))
            kl = (p * (logp - logq)).sum(axis=-1)  # (n,)
            aw = np.abs(wt)
            loss += kl_coef * float((aw * kl).sum())
        if not backward:
            continue
        dz = p * wt[:, None]
        dz[np.arange(rows.size), tgt] -= wt
        if kl_coef and ref_logits is not None:
            # d KL(p||q) / dz = p * (log p - log q - KL)
            dz += (kl_coef * aw)[:, None] * p * (logp - logq - kl[:, None])
        dhc = dz @ w
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
        if need_dw:
            dW += dz.T @ hc
        dh[rows] = dhc
    grads = {"W": dW, "lora": dl, "tied_lora": dt}
    return loss, (ce_sum, int(rows_all.size)), dh, grads
