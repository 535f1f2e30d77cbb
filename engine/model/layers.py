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


class FFNCache(NamedTuple):
    gate: ops.LinearCache
    up: ops.LinearCache
    act: ops.SwigluCache
    down: ops.LinearCache


class SharedExpertCache(NamedTuple):
    ffn: FFNCache
    out: np.ndarray  # (N, C) the shared expert's output before its gate
    gate: np.ndarray  # (N,) sigmoid(h . w_gs)
    h: np.ndarray  # (N, C) the MoE input


class MoECache(NamedTuple):
    router: ops.LinearCache
    route: ops.RouteCache
    experts: ops.ExpertsCache
    shared: SharedExpertCache | None
    routing: ops.Routing


class BlockCache(NamedTuple):
    """Activations of one block's forward pass (no weights)."""

    attn_norm: ops.NormCache
    q: ops.LinearCache
    k: ops.LinearCache
    v: ops.LinearCache
    q_norm: ops.NormCache | None
    k_norm: ops.NormCache | None
    q_rope: ops.RopeCache
    k_rope: ops.RopeCache
    attn: ops.AttentionCache
    o: ops.LinearCache
    ffn_norm: ops.NormCache
    ffn: FFNCache | None  # dense layers
    moe: MoECache | None  # MoE layers


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
) -> tuple[np.ndarray, BlockCache]:
    """x (B, T, C) -> (x', cache). With `kv` (an engine.model.KVCache), keys/values are appended to it."""
    B, T, C = x.shape
    eps = cfg.rms_eps
    # attention block: x += attn_output(attn(rmsnorm(x) * attn_norm))
    h, c_an = ops.rmsnorm_forward(x, W[layer_name(i, "attn_norm")], eps)
    q, c_q = _Linear(W, lora, i, "attn_q").forward(h)  # (B, T, NH*HS)
    k, c_k = _Linear(W, lora, i, "attn_k").forward(h)  # (B, T, NKV*HS)
    v, c_v = _Linear(W, lora, i, "attn_v").forward(h)
    c_qn = c_kn = None
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
    a, c_attn = ops.attention_forward(q, k, v, mask, cfg.attn_scale)  # (B, T, NH*HS)
    o, c_o = _Linear(W, lora, i, "attn_output").forward(a)
    x = x + o
    # feed-forward block: x += ffn(rmsnorm(x) * ffn_norm)
    h, c_fn = ops.rmsnorm_forward(x, W[layer_name(i, "ffn_norm")], eps)
    c_ffn = c_moe = None
    if moe:
        y, c_moe = _moe_forward(cfg, W, lora, i, h.reshape(B * T, C))
        y = y.reshape(B, T, C)
    else:
        y, c_ffn = _ffn_forward(W, lora, i, h, DENSE_FFN_KINDS)
    cache = BlockCache(c_an, c_q, c_k, c_v, c_qn, c_kn, c_qr, c_kr, c_attn, c_o, c_fn, c_ffn, c_moe)
    return x + y, cache


def _ffn_forward(W, lora, i, h, kinds) -> tuple[np.ndarray, FFNCache]:
    gate, up, down = (_Linear(W, lora, i, k) for k in kinds)
    g, cg = gate.forward(h)
    u, cu = up.forward(h)
    act, cs = ops.swiglu_forward(g, u)
    y, cd = down.forward(act)
    return y, FFNCache(cg, cu, cs, cd)


def _ffn_backward(W, lora, i, dy, cache: FFNCache, kinds, need, grads):
    gate, up, down = (_Linear(W, lora, i, k) for k in kinds)
    dact = down.backward(dy, cache.down, need, grads)
    dg, du = ops.swiglu_backward(dact, cache.act)
    return gate.backward(dg, cache.gate, need, grads) + up.backward(du, cache.up, need, grads)


def _moe_forward(cfg, W, lora, i, h) -> tuple[np.ndarray, MoECache]:
    """h (N, C): router, routed experts, and the gated shared expert when the architecture has one."""
    logits, c_router = _Linear(W, lora, i, "ffn_gate_inp").forward(h)  # (N, E)
    routing, c_route = ops.route_forward(logits, cfg.K, cfg.moe_renorm)
    names = [layer_name(i, k) for k in EXPERT_KINDS]
    y, c_experts = ops.experts_forward(h, routing, *(W[n] for n in names), *(lora.get(n) for n in names))
    c_shared = None
    if cfg.F_shexp:
        shared, c_ffn = _ffn_forward(W, lora, i, h, SHARED_EXPERT_KINDS)
        z = h @ W[layer_name(i, "ffn_gate_inp_shexp")]  # (N,)
        gate = ops.sigmoid(z)
        y = y + shared * gate[:, None]
        c_shared = SharedExpertCache(c_ffn, shared, gate, h)
    return y, MoECache(c_router, c_route, c_experts, c_shared, routing)


def _moe_backward(cfg, W, lora, i, dy, cache: MoECache, need, grads):
    names = [layer_name(i, k) for k in EXPERT_KINDS]
    dh, dweights, dW, dlora = ops.experts_backward(
        dy, cache.experts, *(W[n] for n in names), need_dw=any(n in need for n in names)
    )
    for n, key in zip(names, ("gate", "up", "down"), strict=True):
        if n in need:
            add_grad(grads, n, dW[key])
        if key in dlora:
            add_lora_grads(grads, n, *dlora[key])
    dlogits = ops.route_backward(dweights, cache.route)
    dh = dh + _Linear(W, lora, i, "ffn_gate_inp").backward(dlogits, cache.router, need, grads)
    if cache.shared is not None:
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
    # forward was: x2 = x1 + ffn(rmsnorm(x1))
    if moe:
        dh = _moe_backward(cfg, W, lora, i, dx.reshape(B * T, C), c.moe, need, grads).reshape(B, T, C)
    else:
        dh = _ffn_backward(W, lora, i, dx, c.ffn, DENSE_FFN_KINDS, need, grads)
    name = layer_name(i, "ffn_norm")
    dx1, dw = ops.rmsnorm_backward(dh, c.ffn_norm, W[name])
    _maybe(grads, need, name, dw)
    dx = dx + dx1
    # forward was: x1 = x + attn_output(attention(rope(q), rope(k), v))
    da = _Linear(W, lora, i, "attn_output").backward(dx, c.o, need, grads)
    dq, dk, dv = ops.attention_backward(da, c.attn)
    dq = ops.rope_backward(dq, c.q_rope)
    dk = ops.rope_backward(dk, c.k_rope)
    if cfg.qk_norm == "head":
        dq, dk = _qk_norm_backward(W, i, dq, dk, c, need, grads)
    dq = dq.reshape(B, T, -1)
    dk = dk.reshape(B, T, -1)
    dv = dv.reshape(B, T, -1)
    if cfg.qk_norm == "full":
        dq, dk = _qk_norm_backward(W, i, dq, dk, c, need, grads)
    dh = (
        _Linear(W, lora, i, "attn_q").backward(dq, c.q, need, grads)
        + _Linear(W, lora, i, "attn_k").backward(dk, c.k, need, grads)
        + _Linear(W, lora, i, "attn_v").backward(dv, c.v, need, grads)
    )
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
