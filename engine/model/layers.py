"""One transformer block of every supported architecture, as a forward/backward pair.

`block_forward` is the single definition of what a layer computes: `Model.forward` (inference,
with a KV cache) and the training pass both call it. `block_backward` differentiates it, giving
the gradient of the block's input and adding the gradients of trainable tensors (named in
`need`) and of LoRA factors (`<base>.lora_a`, `<base>.lora_b`) into `grads`.

Weights come as a mapping from GGUF names to arrays (frozen weights overlaid with trainable
copies); LoRA terms as a mapping from base names to `LoraTerm`. Shapes: x (B, T, C).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

import numpy as np

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


class _Linear:
    """A named linear map of block i: weight, optional bias, optional LoRA term."""

    def __init__(self, W: Mapping[str, np.ndarray], lora: Mapping[str, LoraTerm], i: int, kind: str):
        self.name = layer_name(i, kind)
        self.bias_name = layer_name(i, kind, "bias")
        self.w = W[self.name]
        self.b = W.get(self.bias_name)
        self.lora = lora.get(self.name)

    def forward(self, x):
        return ops.linear_forward(x, self.w, self.b, self.lora)

    def backward(self, dy, cache, need, grads):
        dx, dW, db, dA, dB = ops.linear_backward(dy, cache, need_dw=self.name in need)
        add_grad(grads, self.name, dW)
        if self.bias_name in need:
            add_grad(grads, self.bias_name, db)
        if self.lora is not None:
            add_lora_grads(grads, self.name, dA, dB)
        return dx


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
):
    """x (B, T, C) -> (x', cache). With `kv` (an engine.model.KVCache), keys/values are appended to it."""
    B, T, C = x.shape
    eps = cfg.rms_eps
    c = {}
    # attention block: x += attn_output(attn(rmsnorm(x) * attn_norm))
    h, c["attn_norm"] = ops.rmsnorm_forward(x, W[layer_name(i, "attn_norm")], eps)
    q, c["q"] = _Linear(W, lora, i, "attn_q").forward(h)  # (B, T, NH*HS)
    k, c["k"] = _Linear(W, lora, i, "attn_k").forward(h)  # (B, T, NKV*HS)
    v, c["v"] = _Linear(W, lora, i, "attn_v").forward(h)
    if cfg.qk_norm == "full":
        q, c["q_norm"] = ops.rmsnorm_forward(q, W[layer_name(i, "attn_q_norm")], eps)
        k, c["k_norm"] = ops.rmsnorm_forward(k, W[layer_name(i, "attn_k_norm")], eps)
    q = q.reshape(B, T, cfg.NH, cfg.HS)
    k = k.reshape(B, T, cfg.NKV, cfg.HS)
    v = v.reshape(B, T, cfg.NKV, cfg.HS)
    if cfg.qk_norm == "head":
        q, c["q_norm"] = ops.rmsnorm_forward(q, W[layer_name(i, "attn_q_norm")], eps)
        k, c["k_norm"] = ops.rmsnorm_forward(k, W[layer_name(i, "attn_k_norm")], eps)
    q, c["q_rope"] = ops.rope_forward(q, cos, sin, cfg.rope)
    k, c["k_rope"] = ops.rope_forward(k, cos, sin, cfg.rope)
    if kv is not None:
        n = kv.length
        kv.k[i][:, n : n + T] = k
        kv.v[i][:, n : n + T] = v
        k, v = kv.k[i][:, : n + T], kv.v[i][:, : n + T]
    a, c["attn"] = ops.attention_forward(q, k, v, mask, cfg.attn_scale)  # (B, T, NH*HS)
    o, c["o"] = _Linear(W, lora, i, "attn_output").forward(a)
    x = x + o
    # feed-forward block: x += ffn(rmsnorm(x) * ffn_norm)
    h, c["ffn_norm"] = ops.rmsnorm_forward(x, W[layer_name(i, "ffn_norm")], eps)
    if moe:
        y, c["moe"] = _moe_forward(cfg, W, lora, i, h.reshape(B * T, C))
        y = y.reshape(B, T, C)
    else:
        y, c["ffn"] = _ffn_forward(W, lora, i, h, DENSE_FFN_KINDS)
    return x + y, c


def _ffn_forward(W, lora, i, h, kinds):
    gate, up, down = (_Linear(W, lora, i, k) for k in kinds)
    g, cg = gate.forward(h)
    u, cu = up.forward(h)
    act, cs = ops.swiglu_forward(g, u)
    y, cd = down.forward(act)
    return y, (cg, cu, cs, cd)


def _ffn_backward(W, lora, i, dy, cache, kinds, need, grads):
    gate, up, down = (_Linear(W, lora, i, k) for k in kinds)
    cg, cu, cs, cd = cache
    dact = down.backward(dy, cd, need, grads)
    dg, du = ops.swiglu_backward(dact, cs)
    return gate.backward(dg, cg, need, grads) + up.backward(du, cu, need, grads)


def _moe_forward(cfg, W, lora, i, h):
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
        c_shared = (c_ffn, shared, gate, h)
    return y, (c_router, c_route, c_experts, c_shared, routing)


def _moe_backward(cfg, W, lora, i, dy, cache, need, grads):
    c_router, c_route, c_experts, c_shared, _ = cache
    names = [layer_name(i, k) for k in EXPERT_KINDS]
    dh, dweights, dW, dlora = ops.experts_backward(dy, c_experts, need_dw=any(n in need for n in names))
    for n, key in zip(names, ("gate", "up", "down"), strict=True):
        if n in need:
            add_grad(grads, n, dW[key])
        if key in dlora:
            add_lora_grads(grads, n, *dlora[key])
    dlogits = ops.route_backward(dweights, c_route)
    dh = dh + _Linear(W, lora, i, "ffn_gate_inp").backward(dlogits, c_router, need, grads)
    if c_shared is not None:
        # forward was: y += shared * sigmoid(h . w_gs)
        c_ffn, shared, gate, h = c_shared
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
    c: dict,
    need: set[str],
    grads: MutableMapping[str, np.ndarray],
) -> np.ndarray:
    """Gradient of the block's input from the gradient of its output; parameter gradients into `grads`."""
    B, T, C = dx.shape
    # forward was: x2 = x1 + ffn(rmsnorm(x1))
    if moe:
        dh = _moe_backward(cfg, W, lora, i, dx.reshape(B * T, C), c["moe"], need, grads).reshape(B, T, C)
    else:
        dh = _ffn_backward(W, lora, i, dx, c["ffn"], DENSE_FFN_KINDS, need, grads)
    dx1, dw = ops.rmsnorm_backward(dh, c["ffn_norm"])
    _maybe(grads, need, layer_name(i, "ffn_norm"), dw)
    dx = dx + dx1
    # forward was: x1 = x + attn_output(attention(rope(q), rope(k), v))
    da = _Linear(W, lora, i, "attn_output").backward(dx, c["o"], need, grads)
    dq, dk, dv = ops.attention_backward(da, c["attn"])
    dq = ops.rope_backward(dq, c["q_rope"])
    dk = ops.rope_backward(dk, c["k_rope"])
    if cfg.qk_norm == "head":
        dq, dwq = ops.rmsnorm_backward(dq, c["q_norm"])
        dk, dwk = ops.rmsnorm_backward(dk, c["k_norm"])
        _maybe(grads, need, layer_name(i, "attn_q_norm"), dwq)
        _maybe(grads, need, layer_name(i, "attn_k_norm"), dwk)
    dq = dq.reshape(B, T, -1)
    dk = dk.reshape(B, T, -1)
    dv = dv.reshape(B, T, -1)
    if cfg.qk_norm == "full":
        dq, dwq = ops.rmsnorm_backward(dq, c["q_norm"])
        dk, dwk = ops.rmsnorm_backward(dk, c["k_norm"])
        _maybe(grads, need, layer_name(i, "attn_q_norm"), dwq)
        _maybe(grads, need, layer_name(i, "attn_k_norm"), dwk)
    dh = (
        _Linear(W, lora, i, "attn_q").backward(dq, c["q"], need, grads)
        + _Linear(W, lora, i, "attn_k").backward(dk, c["k"], need, grads)
        + _Linear(W, lora, i, "attn_v").backward(dv, c["v"], need, grads)
    )
    dx0, dw = ops.rmsnorm_backward(dh, c["attn_norm"])
    _maybe(grads, need, layer_name(i, "attn_norm"), dw)
    return dx + dx0


def _maybe(grads, need, name, g) -> None:
    if name in need:
        add_grad(grads, name, g)


def expert_counts(cache: dict, E: int) -> np.ndarray | None:
    """Tokens routed to each expert in this block's forward pass (None for dense blocks)."""
    if "moe" not in cache:
        return None
    routing = cache["moe"][-1]
    return np.diff(routing.offsets).astype(np.int64)
