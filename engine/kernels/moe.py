"""Mixture of experts: routing (the gating function, top-k with an optional selection bias and group
limits, renormalisation and scale, a counting sort of token-slot pairs by expert), the experts'
grouped matmuls with biases, per-expert LoRA and a gated activation (MUL_MAT_ID), the combine with
routing weights, and the backward passes (MUL_MAT_ID with transposed experts, OUT_PROD_ID).

Every architecture's router and experts are this one op, its variants arguments, as llama.cpp's
build_moe_ffn has them:
- gating: "softmax" over all experts, "sigmoid" (DeepSeek-V3) or "softmax_selected" (gpt-oss: a
  softmax over the chosen logits only); `bias`, an expert-selection bias that changes which experts
  are chosen but not their weights (V3's exp_probs_b); group-limited routing (V3: only experts of the
  best `group_used` of `n_group` groups, a group scored by its two best experts); renormalisation
  and a scale on the weights (expert_weights_scale);
- experts: biases on the gate, up and down projections (gpt-oss) and the activation, "silu"
  (SwiGLU) or "swiglu_oai" (gpt-oss's clamped SwiGLU; engine.kernels.glu).

`route_forward_ref`, `route_backward_ref`, `experts_forward_ref` and `experts_backward_ref` are the
NumPy reference (the specification: each expert's rows, one expert after another), and this module
holds nothing else. Their twins, with the same signatures and held to these by parity tests: on the
CPU `engine.kernels.moe_cpu` (the experts side by side on CPU workers, in the layout OpenBLAS runs
fastest), on a GPU `engine.kernels.moe_cuda` (every expert at once in grouped kernels).

Not here: choosing or dequantizing expert weights (the weight store), the router's own linear layer
(its bias included: engine.kernels.linear), shared experts (engine.model.layers).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .glu import GluCache, glu_backward_ref, glu_forward_ref
from .linear import LoraTerm

GATINGS = ("softmax", "sigmoid", "softmax_selected")
EXPERT_ACTS = ("silu", "swiglu_oai")
MIN_WEIGHT_SUM = 6.103515625e-5  # llama.cpp clamps the sum of the chosen weights before renormalising


class Routing(NamedTuple):
    """Top-k routing of N tokens over E experts, with tokens sorted by expert once."""

    probs: np.ndarray  # (N, E) the gating function of the router logits (softmax_selected: the logits)
    topk: np.ndarray  # (N, K) chosen expert ids, best first
    weights: np.ndarray  # (N, K) mixing weights (renormalised and scaled when asked)
    order: np.ndarray  # (N*K,) token-slot pairs sorted by expert: pair p = (order[p] // K, order[p] % K)
    offsets: np.ndarray  # (E+1,) pairs of expert e are order[offsets[e]:offsets[e+1]]


class RouteCache(NamedTuple):
    routing: Routing
    gating: str
    w_sel: np.ndarray | None  # (N, K) the chosen weights before renormalisation and scale
    wsum: np.ndarray | None  # (N, 1) their (clamped) sum when renormalised
    clamped: np.ndarray | None  # (N, 1) where the sum was clamped (its gradient is then 0)
    scale: float


def check_routing_options(E: int, K: int, gating: str, n_group: int, group_used: int) -> None:
    """ValueError naming what a routing's options get wrong."""
    if gating not in GATINGS:
        raise ValueError(f"unknown gating {gating!r}; expected one of {', '.join(GATINGS)}")
    if not 1 <= K <= E:
        raise ValueError(f"need 1 <= K <= E; got K={K}, E={E}")
    if n_group > 1:
        if E % n_group or not 1 <= group_used <= n_group or group_used * (E // n_group) < K:
            raise ValueError(
                f"group-limited routing needs E={E} a multiple of n_group={n_group} and 1 <= group_used "
                f"<= n_group with group_used * E / n_group >= K={K}; got group_used={group_used}"
            )


def route_forward_ref(
    logits: np.ndarray,
    K: int,
    renorm: bool,
    gating: str = "softmax",
    scale: float = 1.0,
    bias: np.ndarray | None = None,
    n_group: int = 0,
    group_used: int = 0,
):
    """Choose K of E experts per token and their weights, as llama.cpp's build_moe_ffn does.

    p = softmax(logits) | sigmoid(logits) | logits (gating "softmax_selected"); the selection score is
    p + bias; with n_group > 1 only experts of the group_used best groups (each scored by the sum of
    its two best selection scores) can be chosen; top-K by selection score (ties: the lower expert id
    first); w = p[chosen] (softmax over them for "softmax_selected"), / their sum (clamped below at
    MIN_WEIGHT_SUM) when `renorm`, * scale. Then the counting sort of the token-slot pairs by expert.
    """
    N, E = logits.shape
    check_routing_options(E, K, gating, n_group, group_used)
    if gating == "softmax":
        z = logits - logits.max(axis=-1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=-1, keepdims=True)  # (N, E)
    elif gating == "sigmoid":
        p = 1.0 / (1.0 + np.exp(-logits))
    else:
        p = logits
    sel = p if bias is None else p + bias.astype(p.dtype)
    if n_group > 1:
        groups = sel.reshape(N, n_group, E // n_group)
        best = np.sort(groups, axis=-1)[..., -min(2, E // n_group) :]
        score = best.sum(axis=-1)  # (N, n_group)
        keep = np.argsort(-score, axis=-1, kind="stable")[:, :group_used]
        allowed = np.zeros((N, n_group), dtype=bool)
        np.put_along_axis(allowed, keep, True, axis=-1)
        sel = np.where(np.repeat(allowed, E // n_group, axis=-1), sel, -np.inf)
    topk = np.argsort(-sel, axis=-1, kind="stable")[:, :K]  # (N, K) best first
    w = np.take_along_axis(p, topk, axis=-1)
    if gating == "softmax_selected":
        w = np.exp(w - w.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
    w_sel = w
    wsum = clamped = None
    if renorm:
        raw = w.sum(axis=-1, keepdims=True)
        clamped = raw < MIN_WEIGHT_SUM
        wsum = np.maximum(raw, MIN_WEIGHT_SUM)
        w = w / wsum
    if scale != 1.0:
        w = w * scale
    flat = topk.reshape(-1)  # (N*K,)
    order = np.argsort(flat, kind="stable")
    offsets = np.zeros(E + 1, dtype=np.int64)
    np.cumsum(np.bincount(flat, minlength=E), out=offsets[1:])
    routing = Routing(p, topk, w, order, offsets)
    return routing, RouteCache(routing, gating, w_sel, wsum, clamped, float(scale))


def route_backward_ref(dweights: np.ndarray, cache: RouteCache) -> np.ndarray:
    """forward was: w = scale * renorm(g(p[topk])), p = gate(logits).  Returns dlogits (N, E).

    The choice of experts (bias and groups included) is piecewise constant: the gradient flows
    through the chosen weights only, and the selection bias gets none.
    """
    routing, gating, w_sel, wsum, clamped, scale = cache
    p, topk = routing.probs, routing.topk
    dw = dweights.astype(p.dtype) * scale
    if wsum is not None:
        wn = w_sel / wsum
        dw = (dw - np.where(clamped, 0.0, (dw * wn).sum(axis=-1, keepdims=True))) / wsum
    dlogits = np.zeros_like(p)
    if gating == "softmax_selected":
        dsel = w_sel * (dw - (dw * w_sel).sum(axis=-1, keepdims=True))
        np.put_along_axis(dlogits, topk, dsel, axis=-1)
    elif gating == "sigmoid":
        ps = np.take_along_axis(p, topk, axis=-1)
        np.put_along_axis(dlogits, topk, dw * ps * (1.0 - ps), axis=-1)
    else:
        dp = np.zeros_like(p)
        np.put_along_axis(dp, topk, dw, axis=-1)
        dlogits = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return dlogits


class ExpertActs(NamedTuple):
    """What one expert's forward computed on the n_e token-slot pairs routed to it."""

    e: int  # expert id
    pairs: np.ndarray  # (n_e,) token-slot pair ids (token = pair // K)
    g: np.ndarray  # (n_e, F) gate projection (its bias included)
    u: np.ndarray  # (n_e, F) up projection (its bias included)
    a: np.ndarray | None  # (n_e, F) the activation's saved factor (GluCache.a: silu(g); None for swiglu_oai)
    h: np.ndarray  # (n_e, F) act(g, u), the down projection's input
    xa_gate: np.ndarray | None  # (n_e, r) x A_gate^T (gate LoRA)
    xa_up: np.ndarray | None  # (n_e, r) x A_up^T (up LoRA)
    ha_down: np.ndarray | None  # (n_e, r) h A_down^T (down LoRA)


class ExpertsCache(NamedTuple):
    x: np.ndarray  # (N, C) input tokens
    routing: Routing
    pair_out: np.ndarray  # (N*K, C) each pair's expert output (down bias included), before its weight
    per_expert: Any  # list[ExpertActs] of the experts that received tokens, in id order (GPU: PackedActs)
    loras: tuple[LoraTerm | None, LoraTerm | None, LoraTerm | None]  # gate, up, down
    biases: tuple[bool, bool, bool] = (False, False, False)  # which of gate, up, down have a bias
    act: str = "silu"


def check_expert_act(act: str) -> None:
    if act not in EXPERT_ACTS:
        raise ValueError(f"unknown expert activation {act!r}; expected one of {', '.join(EXPERT_ACTS)}")


def _expert_linear_ref(xe: np.ndarray, w, lora: LoraTerm | None, e: int):
    """Expert e's projection of its rows: (xe W_e^T (+ s (xe A_e^T) B_e^T), xa = xe A_e^T or None)."""
    y = xe @ w[e].T
    if lora is None:
        return y, None
    xa = xe @ lora.A[e].T  # (n_e, r)
    return y + lora.s * (xa @ lora.B[e].T), xa


def experts_forward_ref(
    x: np.ndarray,
    routing: Routing,
    w_gate,
    w_up,
    w_down,
    lora_gate: LoraTerm | None = None,
    lora_up: LoraTerm | None = None,
    lora_down: LoraTerm | None = None,
    *,
    b_gate: np.ndarray | None = None,
    b_up: np.ndarray | None = None,
    b_down: np.ndarray | None = None,
    act: str = "silu",
):
    """y_n = sum_k w_nk (down_e(act(gate_e(x_n) + b_g[e], up_e(x_n) + b_u[e])) + b_d[e]), e = topk[n, k].

    x (N, C); w_gate/w_up (E, F, C); w_down (E, C, F), each an array or a lazy stack that gives one
    expert's matrix for `w[e]` (only the experts that receive tokens are read); each projection with
    its expert LoRA term (A (E, r, n_in), B (E, n_out, r)), then its bias (b_gate/b_up (E, F), b_down
    (E, C)); act "silu" or "swiglu_oai". Each expert runs once on the rows routed to it (the
    MUL_MAT_ID pattern), in the order of `routing.order`, which the backward pass reuses.
    """
    check_expert_act(act)
    N, C = x.shape
    K = routing.topk.shape[1]
    E = routing.offsets.shape[0] - 1
    pair_out = np.zeros((N * K, C), dtype=x.dtype)  # expert output per (token, slot) pair, unweighted
    per_expert = []
    for e in range(E):
        pairs = routing.order[routing.offsets[e] : routing.offsets[e + 1]]
        if not len(pairs):
            continue
        xe = x[pairs // K]  # (n_e, C)
        g, xa_g = _expert_linear_ref(xe, w_gate, lora_gate, e)  # (n_e, F)
        u, xa_u = _expert_linear_ref(xe, w_up, lora_up, e)
        if b_gate is not None:
            g = g + b_gate[e]
        if b_up is not None:
            u = u + b_up[e]
        h, c_act = glu_forward_ref(g, u, act)
        ye, ha_d = _expert_linear_ref(h, w_down, lora_down, e)  # (n_e, C)
        if b_down is not None:
            ye = ye + b_down[e]
        pair_out[pairs] = ye
        per_expert.append(ExpertActs(e, pairs, g, u, c_act.a, h, xa_g, xa_u, ha_d))
    y = np.einsum("nkc,nk->nc", pair_out.reshape(N, K, C), routing.weights.astype(x.dtype))
    biases = (b_gate is not None, b_up is not None, b_down is not None)
    loras = (lora_gate, lora_up, lora_down)
    return y, ExpertsCache(x, routing, pair_out, per_expert, loras, biases, act)


def zero_grads(stacks, loras, biases, need_dw: bool, need_db: bool, dtype):
    """The zeroed gradients an experts backward fills: (dW or None, dlora, db or None), keyed "gate",
    "up", "down" (dlora: the adapted ones, as (dA, dB); db: the biased ones, (E, n_out))."""
    keys = ("gate", "up", "down")
    dW = {k: np.zeros(w.shape, dtype) for k, w in zip(keys, stacks, strict=True)} if need_dw else None
    dlora = {
        k: (np.zeros_like(lo.A), np.zeros_like(lo.B))
        for k, lo in zip(keys, loras, strict=True)
        if lo is not None
    }
    db = None
    if need_db:
        db = {k: np.zeros(w.shape[:2], dtype) for k, w, b in zip(keys, stacks, biases, strict=True) if b}
    return dW, dlora, db


def experts_backward_ref(dy: np.ndarray, cache: ExpertsCache, w_gate, w_up, w_down, need_dw: bool = False,
                         need_db: bool = False):  # fmt: skip
    """forward was: y_n = sum_k w_nk (down_e(act(gate_e(x_n) + b_g, up_e(x_n) + b_u)) + b_d).

    The expert weights are given again (arrays or lazy stacks, as in the forward). Returns
    (dx, dweights (N, K), dW or None, dlora, db or None): dW (need_dw) maps "gate"/"up"/"down" to
    (E, ...) arrays, dlora maps the adapted ones to (dA, dB), db (need_db) maps the biased ones to
    (E, F) / (E, C) arrays. Activations go back through each expert's transposed weights (MUL_MAT_ID
    backward); weight, bias and LoRA factor gradients are per-expert sums over the tokens routed to
    it (OUT_PROD_ID).
    """
    x, routing, pair_out, per_expert, loras, biases, act = cache
    lora_gate, lora_up, lora_down = loras
    N, C = x.shape
    K = routing.topk.shape[1]
    dweights = np.einsum("nkc,nc->nk", pair_out.reshape(N, K, C), dy)
    do = (dy[:, None, :] * routing.weights[:, :, None].astype(dy.dtype)).reshape(N * K, C)
    dx_pairs = np.zeros((N * K, C), dtype=dy.dtype)
    dW, dlora, db = zero_grads((w_gate, w_up, w_down), loras, biases, need_dw, need_db, dy.dtype)

    def lora_back(d, xin, xa, lo, e, key):  # forward was: y = xin W_e^T + s (xin A_e^T) B_e^T
        if lo is None:
            return 0.0
        dB = d @ lo.B[e]  # (n_e, r)
        dlora[key][0][e] = lo.s * (dB.T @ xin)
        dlora[key][1][e] = lo.s * (d.T @ xa)
        return lo.s * (dB @ lo.A[e])

    for e, pairs, g, u, a, h, xa_g, xa_u, ha_d in per_expert:
        xe = x[pairs // K]  # (n_e, C)
        do_e = do[pairs]  # (n_e, C)
        dh = do_e @ w_down[e] + lora_back(do_e, h, ha_d, lora_down, e, "down")  # (n_e, F)
        dg, du = glu_backward_ref(dh, GluCache(g, u, a, act))
        dxe = dg @ w_gate[e] + du @ w_up[e]
        dxe = dxe + lora_back(dg, xe, xa_g, lora_gate, e, "gate") + lora_back(du, xe, xa_u, lora_up, e, "up")
        if need_dw:
            dW["down"][e] = do_e.T @ h
            dW["gate"][e] = dg.T @ xe
            dW["up"][e] = du.T @ xe
        if db is not None:
            for key, d in (("gate", dg), ("up", du), ("down", do_e)):
                if key in db:
                    db[key][e] = d.sum(axis=0)
        dx_pairs[pairs] = dxe
    dx = dx_pairs.reshape(N, K, C).sum(axis=1)
    return dx, dweights, dW, dlora, db
