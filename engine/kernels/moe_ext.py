"""Mixture-of-experts routing and experts beyond engine.kernels.moe's softmax / SwiGLU pair:

- `route_ext`: the gating functions of llama.cpp's build_moe_ffn: softmax over all experts, sigmoid
  (DeepSeek-V3), or a softmax over the selected logits only (gpt-oss); an expert-selection bias that
  changes which experts are chosen but not their weights (V3's exp_probs_b); group-limited routing
  (V3: only the experts of the best `group_used` of `n_group` groups, a group scored by its two best
  experts); optional renormalisation and a scale on the weights (expert_weights_scale).
- `experts_ext`: experts with biases on the gate, up and down projections and a choice of
  activation: "silu" (SwiGLU) or "swiglu_oai" (gpt-oss's clamped SwiGLU).

`route_ext_forward_ref` / `route_ext_backward_ref` and `experts_ext_forward_ref` /
`experts_ext_backward_ref` are the NumPy reference (the specification). They return the same
`Routing` as engine.kernels.moe, so the tokens are sorted by expert once per layer either way. No
CUDA twins yet: on a GPU backend the dispatcher (engine.model.ops) says so. Not here: the router's
own linear layer (its bias included: engine.kernels.linear), shared experts (engine.model.layers).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .cpu_workers import run_each
from .glu import SwigluOaiCache, swiglu_oai_backward_ref, swiglu_oai_forward_ref
from .linear import LoraTerm
from .moe import Routing, expert_linear, expert_linear_backward, experts_in_line, routed_experts
from .swiglu import SwigluCache, swiglu_backward_ref, swiglu_forward_ref

GATINGS = ("softmax", "sigmoid", "softmax_selected")
EXPERT_ACTS = ("silu", "swiglu_oai")
MIN_WEIGHT_SUM = 6.103515625e-5  # llama.cpp clamps the sum of the chosen weights before renormalising


class RouteExtCache(NamedTuple):
    routing: Routing
    gating: str
    w_sel: np.ndarray  # (N, K) the chosen weights before renormalisation and scale
    wsum: np.ndarray | None  # (N, 1) their (clamped) sum when renormalised
    clamped: np.ndarray | None  # (N, 1) where the sum was clamped (its gradient is then 0)
    scale: float


def route_ext_forward_ref(
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
    its two best selection scores) can be chosen; top-K by selection score; w = p[chosen] (softmax
    over them for "softmax_selected"), / their sum when `renorm`, * scale.
    """
    N, E = logits.shape
    if gating == "softmax":
        z = logits - logits.max(axis=-1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=-1, keepdims=True)
    elif gating == "sigmoid":
        p = 1.0 / (1.0 + np.exp(-logits))
    elif gating == "softmax_selected":
        p = logits
    else:
        raise ValueError(f"unknown gating {gating!r}; expected one of {GATINGS}")
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
    flat = topk.reshape(-1)
    order = np.argsort(flat, kind="stable")
    offsets = np.zeros(E + 1, dtype=np.int64)
    np.cumsum(np.bincount(flat, minlength=E), out=offsets[1:])
    routing = Routing(p, topk, w, order, offsets)
    return routing, RouteExtCache(routing, gating, w_sel, wsum, clamped, float(scale))


def route_ext_backward_ref(dweights: np.ndarray, cache: RouteExtCache) -> np.ndarray:
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


class ExpertExtActs(NamedTuple):
    """What one expert's forward computed on the n_e token-slot pairs routed to it."""

    e: int  # expert id
    pairs: np.ndarray  # (n_e,) token-slot pair ids (token = pair // K)
    act: SwigluCache | SwigluOaiCache  # gate and up projections (biases included)
    h: np.ndarray  # (n_e, F) the down projection's input
    xa_gate: np.ndarray | None  # (n_e, r) x A_gate^T (gate LoRA)
    xa_up: np.ndarray | None  # (n_e, r) x A_up^T (up LoRA)
    ha_down: np.ndarray | None  # (n_e, r) h A_down^T (down LoRA)


class ExpertsExtCache(NamedTuple):
    x: np.ndarray  # (N, C) input tokens
    routing: Routing
    pair_out: np.ndarray  # (N*K, C) each pair's expert output (down bias included), before its weight
    per_expert: list[ExpertExtActs]  # experts that received tokens, in id order
    loras: tuple[LoraTerm | None, LoraTerm | None, LoraTerm | None]  # gate, up, down
    biases: tuple[bool, bool, bool]  # which of gate, up, down have a bias
    act: str


def _acts(act: str):
    if act == "silu":
        return swiglu_forward_ref, swiglu_backward_ref
    if act == "swiglu_oai":
        return swiglu_oai_forward_ref, swiglu_oai_backward_ref
    raise ValueError(f"unknown expert activation {act!r}; expected one of {EXPERT_ACTS}")


def experts_ext_forward_ref(
    x: np.ndarray,
    routing: Routing,
    w_gate,
    w_up,
    w_down,
    b_gate: np.ndarray | None = None,
    b_up: np.ndarray | None = None,
    b_down: np.ndarray | None = None,
    lora_gate: LoraTerm | None = None,
    lora_up: LoraTerm | None = None,
    lora_down: LoraTerm | None = None,
    act: str = "silu",
):
    """y_n = sum_k w_nk (down_e(act(gate_e(x_n), up_e(x_n)))), e = topk[n, k], each projection with
    its LoRA term, then its bias (b_gate/b_up (E, F), b_down (E, C)). Weights and LoRA factors as in
    engine.kernels.moe.experts_forward_ref; each expert runs once on the rows routed to it."""
    fwd, _ = _acts(act)
    N, C = x.shape
    K = routing.topk.shape[1]
    pair_out = np.zeros((N * K, C), dtype=x.dtype)

    def expert(e: int) -> ExpertExtActs:  # writes expert e's rows of pair_out
        pairs = routing.order[routing.offsets[e] : routing.offsets[e + 1]]
        xe = x[pairs // K]  # (n_e, C)
        g, xa_g = expert_linear(xe, w_gate, lora_gate, e)  # (n_e, F)
        u, xa_u = expert_linear(xe, w_up, lora_up, e)
        if b_gate is not None:
            g = g + b_gate[e]
        if b_up is not None:
            u = u + b_up[e]
        h, c_act = fwd(g, u)
        ye, ha_d = expert_linear(h, w_down, lora_down, e)  # (n_e, C)
        if b_down is not None:
            ye = ye + b_down[e]
        pair_out[pairs] = ye
        return ExpertExtActs(e, pairs, c_act, h, xa_g, xa_u, ha_d)

    in_line = experts_in_line(routing, C, w_gate.shape[1])
    per_expert = run_each(expert, routed_experts(routing), in_line=in_line)  # side by side on CPU workers
    y = np.einsum("nkc,nk->nc", pair_out.reshape(N, K, C), routing.weights.astype(x.dtype))
    biases = (b_gate is not None, b_up is not None, b_down is not None)
    cache = ExpertsExtCache(x, routing, pair_out, per_expert, (lora_gate, lora_up, lora_down), biases, act)
    return y, cache


def experts_ext_backward_ref(dy: np.ndarray, cache: ExpertsExtCache, w_gate, w_up, w_down,
                             need_dw: bool = False, need_db: bool = False):  # fmt: skip
    """forward was: y_n = sum_k w_nk (down_e(act(gate_e(x_n) + b_g, up_e(x_n) + b_u)) + b_d).

    Returns (dx, dweights (N, K), dW or None, db or None, dlora): dW maps "gate"/"up"/"down" to
    (E, ...) arrays, db (with need_db) maps the biased ones to (E, F) / (E, C) arrays, dlora maps the
    adapted ones to (dA, dB).
    """
    x, routing, pair_out, per_expert, loras, biases, act = cache
    _, bwd = _acts(act)
    lora_gate, lora_up, lora_down = loras
    N, C = x.shape
    K = routing.topk.shape[1]
    dweights = np.einsum("nkc,nc->nk", pair_out.reshape(N, K, C), dy)
    do = (dy[:, None, :] * routing.weights[:, :, None].astype(dy.dtype)).reshape(N * K, C)
    dx_pairs = np.zeros((N * K, C), dtype=dy.dtype)
    stacks = (("gate", w_gate), ("up", w_up), ("down", w_down))
    dW = {k: np.zeros(w.shape, dy.dtype) for k, w in stacks} if need_dw else None
    db = None
    if need_db:
        db = {
            k: np.zeros((w.shape[0], w.shape[1]), dy.dtype)
            for (k, w), b in zip(stacks, biases, strict=True)
            if b
        }
    dlora = {}
    for name, lora in (("gate", lora_gate), ("up", lora_up), ("down", lora_down)):
        if lora is not None:
            dlora[name] = (np.zeros_like(lora.A), np.zeros_like(lora.B))

    def expert(acts: ExpertExtActs) -> None:  # writes expert e's rows of dx_pairs and slices of dW, db, dlora
        e, pairs, c_act, h, xa_g, xa_u, ha_d = acts
        xe = x[pairs // K]  # (n_e, C)
        do_e = do[pairs]  # (n_e, C)
        dh = expert_linear_backward(do_e, h, ha_d, w_down, lora_down, e, dlora.get("down"))  # (n_e, F)
        dg, du = bwd(dh, c_act)
        dxe = expert_linear_backward(dg, xe, xa_g, w_gate, lora_gate, e, dlora.get("gate"))
        dxe += expert_linear_backward(du, xe, xa_u, w_up, lora_up, e, dlora.get("up"))
        if need_dw:
            dW["down"][e] = do_e.T @ h
            dW["gate"][e] = dg.T @ xe
            dW["up"][e] = du.T @ xe
        if db is not None:
            for name, d in (("gate", dg), ("up", du), ("down", do_e)):
                if name in db:
                    db[name][e] = d.sum(axis=0)
        dx_pairs[pairs] = dxe

    run_each(expert, per_expert, in_line=experts_in_line(routing, C, w_gate.shape[1]))
    dx = dx_pairs.reshape(N, K, C).sum(axis=1)
    return dx, dweights, dW, db, dlora
