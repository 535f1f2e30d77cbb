"""One transformer block of every supported architecture, as a forward/backward pair.

`block_forward` is the single definition of what a layer computes: the model-level forward
(`engine.model.forward`) calls it for inference (with a KV cache) and for training.
`block_backward` differentiates it, giving the gradient of the block's input and adding the
gradients of trainable tensors (named in `need`) and of LoRA factors (`<base>.lora_a`,
`<base>.lora_b`) into `grads`.

Weights come as a mapping from GGUF names to arrays (the weight store, overlaid with trainable
copies); LoRA terms as a mapping from base names to `LoraTerm`. A weight is looked up when it is
used, in the forward and again in the backward, and the caches hold activations only, so the
weight store can drop a dequantized layer in between. Shapes: x (B, T, C).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, MutableMapping
from typing import NamedTuple

import numpy as np

from ..backend import array_module
from . import ops
from .archs import ModelConfig
from .ops import LoraTerm

EXPERT_KINDS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
SHARED_EXPERT_KINDS = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
DENSE_FFN_KINDS = ("ffn_gate", "ffn_up", "ffn_down")
QKV_KINDS = ("attn_q", "attn_k", "attn_v")


def layer_name(i: int, kind: str, suffix: str = "weight") -> str:
    return f"blk.{i}.{kind}.{suffix}"


def add_grad(grads: MutableMapping[str, np.ndarray], name: str, g: np.ndarray | None) -> None:
    """Accumulate a gradient (a tensor used twice, such as a tied embedding, gets both)."""
    if g is None:
        return
    if name in grads:
        grads[name] = grads[name] + g
    else:
        grads[name] = g


def add_lora_grads(grads, name: str, dA: np.ndarray | None, dB: np.ndarray | None) -> None:
    add_grad(grads, name + ".lora_a", dA)
    add_grad(grads, name + ".lora_b", dB)


def _maybe(grads, need, name, g) -> None:
    if name in need:
        add_grad(grads, name, g)


class _Linear:
    """A named linear map of block i: weight, optional bias, optional LoRA term (weights read at use)."""

    def __init__(self, W: Mapping[str, np.ndarray], lora: Mapping[str, LoraTerm], i: int, kind: str):
        self.W = W
        self.name = layer_name(i, kind)
        self.bias_name = layer_name(i, kind, "bias")
        self.lora = lora.get(self.name)

    def forward(self, x):
        return ops.linear_forward(x, self.W[self.name], self.W.get(self.bias_name), self.lora)

    def backward(self, dy, cache, need, grads):
        dx, dW, db, dA, dB = ops.linear_backward(dy, cache, self.W[self.name], need_dw=self.name in need)
        add_grad(grads, self.name, dW)
        if self.bias_name in need:
            add_grad(grads, self.bias_name, db)
        if self.lora is not None:
            add_lora_grads(grads, self.name, dA, dB)
        return dx


def member_weights(W: Mapping[str, np.ndarray], names: tuple[str, ...]) -> list[np.ndarray]:
    """The weights of a group of linear maps: row blocks of one array when the weight store can give
    them so (`WeightStore.rows_of`: a CPU twin then multiplies by all of them at once), else each
    tensor as W has it (tensors trained in full, the device's store)."""
    store, overlay = (W.maps[-1], W.maps[:-1]) if isinstance(W, ChainMap) else (W, ())
    rows_of = getattr(store, "rows_of", None)
    if rows_of is not None and not any(n in m for m in overlay for n in names):
        return rows_of(names)
    return [W[n] for n in names]


class _LinearGroup:
    """Linear maps of block i that read one input (q, k, v; gate and up), as one op
    (`ops.linear_group_forward`: its CPU twin takes them as one product; weights read at use)."""

    def __init__(self, W: Mapping[str, np.ndarray], lora: Mapping[str, LoraTerm], i: int, kinds):
        self.W = W
        self.members = [_Linear(W, lora, i, k) for k in kinds]
        self.names = tuple(m.name for m in self.members)

    def forward(self, x):
        ws, bs = member_weights(self.W, self.names), [self.W.get(m.bias_name) for m in self.members]
        return ops.linear_group_forward(x, ws, bs, [m.lora for m in self.members])

    def backward(self, dys, caches, need, grads):
        ws = member_weights(self.W, self.names)
        dx, member_grads = ops.linear_group_backward(dys, caches, ws, [n in need for n in self.names])
        for m, (dW, db, dA, dB) in zip(self.members, member_grads, strict=True):
            add_grad(grads, m.name, dW)
            if m.bias_name in need:
                add_grad(grads, m.bias_name, db)
            if m.lora is not None:
                add_lora_grads(grads, m.name, dA, dB)
        return dx


class FFNCache(NamedTuple):
    gate_up: tuple[ops.LinearCache, ops.LinearCache]  # the gate and up projections (one group)
    act: ops.GluCache
    down: ops.LinearCache


class SharedExpertCache(NamedTuple):
    ffn: FFNCache
    out: np.ndarray | None  # (N, C) the shared expert's output before its gate (None: ungated)
    gate: np.ndarray | None  # (N,) sigmoid(h . w_gs) (None: ungated)
    h: np.ndarray  # (N, C) the MoE input


class MoECache(NamedTuple):
    router: ops.LinearCache
    route: ops.RouteCache
    experts: ops.ExpertsCache
    shared: SharedExpertCache | None
    routing: ops.Routing
    aux: tuple | None = None  # (value, dlogits (N, E)) of the load-balancing loss, when it is on


class MlaCache(NamedTuple):
    """Multi-head latent attention's projections (the RoPE and attention caches are the block's)."""

    q_a: ops.LinearCache | None  # compressed query (attn_q_a), when q_lora_rank
    q_a_norm: ops.NormCache | None
    q: ops.LinearCache  # attn_q, or attn_q_b after the compression
    kv_a: ops.LinearCache  # attn_kv_a_mqa: compressed KV and the shared RoPE key
    kv_norm: ops.NormCache  # attn_kv_a_norm
    kv: ops.MlaKvCache  # attn_k_b / attn_v_b


class BlockCache(NamedTuple):
    """Activations of one block's forward pass (no weights)."""

    attn_norm: ops.NormCache
    qkv: tuple[ops.LinearCache, ...] | None  # the q, k, v projections (one group; None for MLA: see mla)
    q_norm: ops.NormCache | None
    k_norm: ops.NormCache | None
    q_rope: ops.RopeCache
    k_rope: ops.RopeCache
    attn: ops.AttentionCache
    o: ops.LinearCache
    ffn_norm: ops.NormCache
    ffn: FFNCache | None  # dense layers
    moe: MoECache | None  # MoE layers
    post_attn: ops.NormCache | None = None  # post_attention_norm (gemma3)
    post_ffn: ops.NormCache | None = None  # post_ffw_norm (gemma3)
    mla: MlaCache | None = None  # multi-head latent attention (deepseek2)


def block_forward(
    cfg: ModelConfig,
    W: Mapping[str, np.ndarray],
    lora: Mapping[str, LoraTerm],
    i: int,
    moe: bool,
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    mask: np.ndarray,
    kv=None,
    aux_coef: float = 0.0,
) -> tuple[np.ndarray, BlockCache]:
    """x (B, T, C) -> (x', cache). With `kv` (an engine.model.KVCache), keys/values are appended to it.

    cos, sin and mask are this layer's (a sliding-window layer gets its own, see engine.model.forward).
    aux_coef: the weight of a MoE block's load-balancing loss (`load_balance`; its value and gradient
    kept in the cache, `cache.moe.aux`); 0: none.
    """
    B, T, C = x.shape
    eps = cfg.rms_eps
    spec = cfg.spec
    # attention block: x += attn_output(attn(rmsnorm(x) * attn_norm))
    h, c_an = ops.rmsnorm_forward(x, W[layer_name(i, "attn_norm")], eps)
    c_qkv = c_qn = c_kn = c_mla = None
    if spec.attention == "mla":
        q, k, v, c_mla, c_qr, c_kr = _mla_forward(cfg, W, i, h, cos, sin)
    else:
        (q, k, v), c_qkv = _LinearGroup(W, lora, i, QKV_KINDS).forward(h)  # (B, T, NH*HS), (.., NKV*HS) x2
        if cfg.qk_norm == "full":
            q, c_qn = ops.rmsnorm_forward(q, W[layer_name(i, "attn_q_norm")], eps)
            k, c_kn = ops.rmsnorm_forward(k, W[layer_name(i, "attn_k_norm")], eps)
        q = q.reshape(B, T, cfg.NH, cfg.HS)
        k = k.reshape(B, T, cfg.NKV, cfg.HS)
        v = v.reshape(B, T, cfg.NKV, cfg.HS)
        if cfg.qk_norm == "head":
            q, c_qn = ops.rmsnorm_forward(q, W[layer_name(i, "attn_q_norm")], eps)
            k, c_kn = ops.rmsnorm_forward(k, W[layer_name(i, "attn_k_norm")], eps)
        q, c_qr = ops.rope_forward(q, cos, sin, cfg.rope)
        k, c_kr = ops.rope_forward(k, cos, sin, cfg.rope)
    if kv is not None:
        n = kv.length
        kv.k[i][:, n : n + T] = k
        kv.v[i][:, n : n + T] = v
        k, v = kv.k[i][:, : n + T], kv.v[i][:, : n + T]
    sinks = W[layer_name(i, "attn_sinks")] if spec.sinks else None
    a, c_attn = ops.attention_forward(q, k, v, mask, cfg.attn_scale, sinks)  # (B, T, NH*HS_v)
    o, c_o = _Linear(W, lora, i, "attn_output").forward(a)
    c_pa = c_pf = None
    if spec.post_norms:
        o, c_pa = ops.rmsnorm_forward(o, W[layer_name(i, "post_attention_norm")], eps)
    x = x + o
    # feed-forward block: x += ffn(rmsnorm(x) * ffn_norm)
    h, c_fn = ops.rmsnorm_forward(x, W[layer_name(i, spec.ffn_norm)], eps)
    c_ffn = c_moe = None
    if moe:
        y, c_moe = _moe_forward(cfg, W, lora, i, h.reshape(B * T, C), aux_coef)
        y = y.reshape(B, T, C)
    else:
        y, c_ffn = _ffn_forward(W, lora, i, h, DENSE_FFN_KINDS, spec.ffn_act)
    if spec.post_norms:
        y, c_pf = ops.rmsnorm_forward(y, W[layer_name(i, "post_ffw_norm")], eps)
    caches = (c_an, c_qkv, c_qn, c_kn, c_qr, c_kr, c_attn, c_o, c_fn, c_ffn, c_moe, c_pa, c_pf, c_mla)
    cache = BlockCache(*caches)
    return x + y, cache


# llama.cpp multiplies MLA's query and KV projections without their LoRA adapters (no build_lora_mm)
_NO_LORA: Mapping[str, LoraTerm] = {}


def _stack(W, name: str, xp):
    """A 3-D weight as one array (the host weight store gives a lazy stack; the device one an array)."""
    w = W[name]
    return np.asarray(w) if xp is np else w


def _mla_forward(cfg, W, i, h, cos, sin):
    """Multi-head latent attention's queries, keys and values (B, T, NH, HS), (.., HS), (.., HS_v),
    expanded per head; the RoPE part of each is the last n_rot dims, the key's shared by all heads."""
    B, T, C = h.shape
    NH, HS, n_rot, R = cfg.NH, cfg.HS, cfg.n_rot, cfg.kv_lora_rank
    nope = HS - n_rot
    xp = array_module(h)
    c_qa = c_qan = None
    if cfg.q_lora_rank:
        qa, c_qa = _Linear(W, _NO_LORA, i, "attn_q_a").forward(h)  # (B, T, q_lora_rank)
        qa, c_qan = ops.rmsnorm_forward(qa, W[layer_name(i, "attn_q_a_norm")], cfg.rms_eps)
        q, c_q = _Linear(W, _NO_LORA, i, "attn_q_b").forward(qa)  # (B, T, NH*HS)
    else:
        q, c_q = _Linear(W, _NO_LORA, i, "attn_q").forward(h)
    q = q.reshape(B, T, NH, HS)
    kva, c_kva = _Linear(W, _NO_LORA, i, "attn_kv_a_mqa").forward(h)  # (B, T, R + n_rot)
    q_pe, c_qr = ops.rope_forward(xp.ascontiguousarray(q[..., nope:]), cos, sin, cfg.rope)
    k_pe, c_kr = ops.rope_forward(
        xp.ascontiguousarray(kva[..., None, R:]), cos, sin, cfg.rope
    )  # (B, T, 1, n_rot)
    ckv, c_kvn = ops.rmsnorm_forward(
        xp.ascontiguousarray(kva[..., :R]), W[layer_name(i, "attn_kv_a_norm")], cfg.rms_eps
    )
    kb, vb = (_stack(W, layer_name(i, kind), xp) for kind in ("attn_k_b", "attn_v_b"))
    (k_nope, v), c_kv = ops.mla_kv_forward(ckv, kb, vb)  # (B, T, NH, nope), (B, T, NH, HS_v)
    q = xp.concatenate([q[..., :nope], q_pe], axis=-1)
    k = xp.concatenate([k_nope, xp.broadcast_to(k_pe, (B, T, NH, n_rot))], axis=-1)
    return q, k, v, MlaCache(c_qa, c_qan, c_q, c_kva, c_kvn, c_kv), c_qr, c_kr


def _mla_backward(cfg, W, i, dq, dk, dv, c: BlockCache, need, grads):
    """forward was: q = [q_nope, rope(q_pe)], k = [c W_kb, rope(k_pe)], v = c W_vb^T, c = rmsnorm(kv_a)."""
    B, T = dq.shape[:2]
    HS, n_rot = cfg.HS, cfg.n_rot
    nope = HS - n_rot
    m = c.mla
    xp = array_module(dq)
    dq_pe = ops.rope_backward(xp.ascontiguousarray(dq[..., nope:]), c.q_rope)
    dk_pe = ops.rope_backward(dk[..., nope:].sum(axis=2, keepdims=True), c.k_rope)  # (B, T, 1, n_rot)
    kb, vb = (layer_name(i, kind) for kind in ("attn_k_b", "attn_v_b"))
    dckv, dkb, dvb = ops.mla_kv_backward(
        xp.ascontiguousarray(dk[..., :nope]), dv, m.kv, _stack(W, kb, xp), _stack(W, vb, xp),
        need_dw=kb in need or vb in need,
    )  # fmt: skip
    _maybe(grads, need, kb, dkb)
    _maybe(grads, need, vb, dvb)
    name = layer_name(i, "attn_kv_a_norm")
    dckv, dw = ops.rmsnorm_backward(dckv, m.kv_norm, W[name])
    _maybe(grads, need, name, dw)
    dkva = xp.concatenate([dckv, dk_pe.reshape(B, T, n_rot)], axis=-1)
    dh = _Linear(W, _NO_LORA, i, "attn_kv_a_mqa").backward(dkva, m.kv_a, need, grads)
    dq = xp.concatenate([dq[..., :nope], dq_pe], axis=-1).reshape(B, T, -1)
    if cfg.q_lora_rank:
        dqa = _Linear(W, _NO_LORA, i, "attn_q_b").backward(dq, m.q, need, grads)
        name = layer_name(i, "attn_q_a_norm")
        dqa, dw = ops.rmsnorm_backward(dqa, m.q_a_norm, W[name])
        _maybe(grads, need, name, dw)
        return dh + _Linear(W, _NO_LORA, i, "attn_q_a").backward(dqa, m.q_a, need, grads)
    return dh + _Linear(W, _NO_LORA, i, "attn_q").backward(dq, m.q, need, grads)


def _ffn_forward(W, lora, i, h, kinds, act: str = "silu") -> tuple[np.ndarray, FFNCache]:
    (g, u), c_gu = _LinearGroup(W, lora, i, kinds[:2]).forward(h)
    a, cs = ops.glu_forward(g, u, act)
    y, cd = _Linear(W, lora, i, kinds[2]).forward(a)
    return y, FFNCache(c_gu, cs, cd)


def _ffn_backward(W, lora, i, dy, cache: FFNCache, kinds, need, grads):
    dact = _Linear(W, lora, i, kinds[2]).backward(dy, cache.down, need, grads)
    dg, du = ops.glu_backward(dact, cache.act)
    return _LinearGroup(W, lora, i, kinds[:2]).backward((dg, du), cache.gate_up, need, grads)


def load_balance(logits, routing: ops.Routing, coef: float):
    """The Switch Transformer load-balancing loss of one MoE block and its gradient in the router logits.

    aux = coef * E * sum_e f_e * P_e, with f_e the fraction of the N*K token-choices the routing
    sent to expert e (counted, no gradient) and P_e the mean over the N tokens of softmax(logits)_e,
    a softmax over all E experts whatever the model's gating (for sigmoid or softmax-over-the-chosen
    gating too: the router's preference as one distribution). It is 1*coef when the load is even.
    Returns (value, dlogits (N, E)): d aux / d logits = coef * E / N * p * (f - p.f).
    """
    xp = array_module(logits)
    N, E = logits.shape
    z = logits - logits.max(axis=-1, keepdims=True)
    p = xp.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    f = xp.diff(routing.offsets).astype(p.dtype) / max(1, routing.topk.size)
    P = p.mean(axis=0)
    value = coef * E * (f * P).sum()
    dlogits = (coef * E / max(1, N)) * p * (f[None, :] - (p @ f)[:, None])
    return value, dlogits.astype(logits.dtype, copy=False)


def _moe_forward(cfg, W, lora, i, h, aux_coef: float = 0.0) -> tuple[np.ndarray, MoECache]:
    """h (N, C): router, routed experts, and the shared expert(s) when the architecture has them;
    with `aux_coef`, the block's load-balancing loss (`load_balance`) in the cache."""
    spec = cfg.spec
    logits, c_router = _Linear(W, lora, i, "ffn_gate_inp").forward(h)  # (N, E) (+ router bias)
    bias_name = layer_name(i, "exp_probs_b", "bias")
    probs_bias = W[bias_name] if bias_name in W else None
    routing, c_route = ops.route_forward(
        logits, cfg.K, cfg.moe_renorm, cfg.gating, cfg.moe_scale, probs_bias, cfg.n_group, cfg.group_used
    )
    names = [layer_name(i, k) for k in EXPERT_KINDS]
    b_gate, b_up, b_down = (W.get(layer_name(i, k, "bias")) for k in EXPERT_KINDS)
    y, c_experts = ops.experts_forward(
        h, routing, *(W[n] for n in names), *(lora.get(n) for n in names),
        b_gate=b_gate, b_up=b_up, b_down=b_down, act=spec.expert_act,
    )  # fmt: skip
    c_shared = None
    if cfg.F_shexp:
        shared, c_ffn = _ffn_forward(W, lora, i, h, SHARED_EXPERT_KINDS)
        if spec.shared_ungated:
            y = y + shared
            c_shared = SharedExpertCache(c_ffn, None, None, h)
        else:
            z = h @ W[layer_name(i, "ffn_gate_inp_shexp")]  # (N,)
            gate = ops.sigmoid(z)
            y = y + shared * gate[:, None]
            c_shared = SharedExpertCache(c_ffn, shared, gate, h)
    aux = load_balance(logits, routing, aux_coef) if aux_coef else None
    return y, MoECache(c_router, c_route, c_experts, c_shared, routing, aux)


def _moe_backward(cfg, W, lora, i, dy, cache: MoECache, need, grads):
    names = [layer_name(i, k) for k in EXPERT_KINDS]
    bias_names = [layer_name(i, k, "bias") for k in EXPERT_KINDS]
    dh, dweights, dW, dlora, db = ops.experts_backward(
        dy, cache.experts, *(W[n] for n in names), need_dw=any(n in need for n in names),
        need_db=any(n in need for n in bias_names),
    )  # fmt: skip
    for n, key in zip(bias_names, ("gate", "up", "down"), strict=True):
        if n in need and db is not None and key in db:
            add_grad(grads, n, db[key])
    for n, key in zip(names, ("gate", "up", "down"), strict=True):
        if n in need:
            add_grad(grads, n, dW[key])
        if key in dlora:
            add_lora_grads(grads, n, *dlora[key])
    dlogits = ops.route_backward(dweights, cache.route)
    if cache.aux is not None:  # the load-balancing loss's gradient joins the routing's
        dlogits = dlogits + cache.aux[1]
    dh = dh + _Linear(W, lora, i, "ffn_gate_inp").backward(dlogits, cache.router, need, grads)
    if cache.shared is not None and cache.shared.gate is None:
        # forward was: y += shared(h)
        dh = dh + _ffn_backward(W, lora, i, dy, cache.shared.ffn, SHARED_EXPERT_KINDS, need, grads)
    elif cache.shared is not None:
        # forward was: y += shared * sigmoid(h . w_gs)
        c_ffn, shared, gate, h = cache.shared
        dshared = dy * gate[:, None]
        dz = (dy * shared).sum(axis=-1) * gate * (1.0 - gate)  # (N,)
        wgs_name = layer_name(i, "ffn_gate_inp_shexp")
        dh = dh + dz[:, None] * W[wgs_name][None, :]
        if wgs_name in need:
            add_grad(grads, wgs_name, dz @ h)
        dh = dh + _ffn_backward(W, lora, i, dshared, c_ffn, SHARED_EXPERT_KINDS, need, grads)
    return dh


def block_backward(
    cfg: ModelConfig,
    W: Mapping[str, np.ndarray],
    lora: Mapping[str, LoraTerm],
    i: int,
    moe: bool,
    dx: np.ndarray,
    c: BlockCache,
    need: set[str],
    grads: MutableMapping[str, np.ndarray],
) -> np.ndarray:
    """Gradient of the block's input from the gradient of its output; parameter gradients into `grads`."""
    B, T, C = dx.shape
    spec = cfg.spec
    # forward was: x2 = x1 + post_ffw_norm(ffn(rmsnorm(x1)))
    dy = dx
    if c.post_ffn is not None:
        name = layer_name(i, "post_ffw_norm")
        dy, dw = ops.rmsnorm_backward(dx, c.post_ffn, W[name])
        _maybe(grads, need, name, dw)
    if moe:
        dh = _moe_backward(cfg, W, lora, i, dy.reshape(B * T, C), c.moe, need, grads).reshape(B, T, C)
    else:
        dh = _ffn_backward(W, lora, i, dy, c.ffn, DENSE_FFN_KINDS, need, grads)
    name = layer_name(i, spec.ffn_norm)
    dx1, dw = ops.rmsnorm_backward(dh, c.ffn_norm, W[name])
    _maybe(grads, need, name, dw)
    dx = dx + dx1
    # forward was: x1 = x + post_attention_norm(attn_output(attention(rope(q), rope(k), v)))
    do = dx
    if c.post_attn is not None:
        name = layer_name(i, "post_attention_norm")
        do, dw = ops.rmsnorm_backward(dx, c.post_attn, W[name])
        _maybe(grads, need, name, dw)
    da = _Linear(W, lora, i, "attn_output").backward(do, c.o, need, grads)
    dq, dk, dv, dsinks = ops.attention_backward(da, c.attn)
    if dsinks is not None:
        _maybe(grads, need, layer_name(i, "attn_sinks"), dsinks)
    if c.mla is not None:
        dh = _mla_backward(cfg, W, i, dq, dk, dv, c, need, grads)
    else:
        dq = ops.rope_backward(dq, c.q_rope)
        dk = ops.rope_backward(dk, c.k_rope)
        if cfg.qk_norm == "head":
            dq, dk = _qk_norm_backward(W, i, dq, dk, c, need, grads)
        dq = dq.reshape(B, T, -1)
        dk = dk.reshape(B, T, -1)
        dv = dv.reshape(B, T, -1)
        if cfg.qk_norm == "full":
            dq, dk = _qk_norm_backward(W, i, dq, dk, c, need, grads)
        dh = _LinearGroup(W, lora, i, QKV_KINDS).backward((dq, dk, dv), c.qkv, need, grads)
    name = layer_name(i, "attn_norm")
    dx0, dw = ops.rmsnorm_backward(dh, c.attn_norm, W[name])
    _maybe(grads, need, name, dw)
    return dx + dx0


def _qk_norm_backward(W, i, dq, dk, c: BlockCache, need, grads):
    qn, kn = layer_name(i, "attn_q_norm"), layer_name(i, "attn_k_norm")
    dq, dwq = ops.rmsnorm_backward(dq, c.q_norm, W[qn])
    dk, dwk = ops.rmsnorm_backward(dk, c.k_norm, W[kn])
    _maybe(grads, need, qn, dwq)
    _maybe(grads, need, kn, dwk)
    return dq, dk


def expert_counts(cache: BlockCache) -> np.ndarray | None:
    """Tokens routed to each expert in this block's forward pass (None for dense blocks)."""
    if cache.moe is None:
        return None
    offsets = cache.moe.routing.offsets  # on the device for a GPU run: no host read here
    xp = array_module(offsets)
    return xp.diff(offsets).astype(xp.int64)
