"""Mixture of experts: routing (softmax, top-k, renormalisation, a counting sort of token-slot pairs by
expert), the experts' grouped matmuls with per-expert LoRA (MUL_MAT_ID), the combine with routing
weights, and the backward passes (MUL_MAT_ID with transposed experts, OUT_PROD_ID).

NumPy reference (the specification).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .linear import LoraTerm
from .swiglu import SwigluCache, silu, swiglu_backward_ref


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


def route_forward_ref(logits: np.ndarray, K: int, renorm: bool):
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


def route_backward_ref(dweights: np.ndarray, cache: RouteCache) -> np.ndarray:
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


def experts_forward_ref(
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


def experts_backward_ref(dy: np.ndarray, cache: ExpertsCache, w_gate, w_up, w_down, need_dw: bool = False):
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
        dg, du = swiglu_backward_ref(dh, SwigluCache(g, u, sg))
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
