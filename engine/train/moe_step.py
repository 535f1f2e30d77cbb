"""The MoE feed-forward blocks of the fused training step (engine.train.dense_step): router, routed
experts and shared expert of every MoE layer on the step's static buffers, with no host read, so
that a MoE model's step is captured as one CUDA graph like a dense one.

What a MoE layer's FFN computes is `engine.model.layers._moe_forward` / `_moe_backward` (the generic
path, the reference): h = rmsnorm(x_mid); logits = h W_r^T (+ s (h A_r^T) B_r^T, + b_r); top-k
routing (`engine.kernels.moe_cuda.route_forward_on`: the architecture's gating, renormalisation, scale,
selection bias); the routed experts with their LoRA on gate, up and down (`experts_forward_on`, the
default route of engine.kernels.moe_gemm, whose launch shapes depend on N*K and E only); and for
qwen2moe the shared expert, a dense SwiGLU FFN times sigmoid(h . w_gs). Per layer:

- forward: the ffn norm writes h as float32 (the experts' input, kept for their backward) and the
  residual copy; one cast gives the bf16 h of the router's and the shared expert's GEMMs; the router
  is the dense step's residual-style group (logits float32, its LoRA's h A^T kept bf16); the
  experts' output and the gated shared expert are added into the residual stream;
- backward: the experts' backward reads the float32 residual gradient; their LoRA gradients are
  copied into the step's static gradient buffers (the optimizer's table points there); the
  router's gradient dlogits goes back through the router's GEMMs, and the shared expert's through
  the dense step's groups, all adding into the experts' dx; the ffn norm's backward adds it to the
  residual gradient;
- expert counts: every MoE layer's top-k choices, padding rows left out, summed on the device into
  the buffer the step's one read brings back.

Weights: as the dense step's (dequantized once into the step's buffers when the cache budget holds
them, else one set of expert buffers refilled at each use, the gate and up stacks in one launch).
The expert LoRA factors are float32 (the MoE kernels round them to bf16 where they enter a
product); the router's and shared expert's have the dense step's bf16 copies.

`unsupported(model)` says why a MoE model cannot take this path. Not here: attention, the head and
loss, the optimizer (engine.train.dense_step), the MoE kernels themselves (engine.kernels.moe).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..kernels.dequant import dequant_on
from ..kernels.glu import glu_bwd_bf16_on, glu_fwd_bf16_on
from ..kernels.linear import LoraTerm
from ..kernels.moe_cuda import (
    MAX_E,
    experts_backward_on,
    experts_forward_on,
    route_backward_on,
    route_forward_on,
)
from ..kernels.norm import rmsnorm_bwd_acc_on, rmsnorm_fwd_out_on
from ..model.layers import EXPERT_KINDS, SHARED_EXPERT_KINDS, layer_name

ROUTER = "ffn_gate_inp"
SHARED_GATE = "ffn_gate_inp_shexp"  # (C,) the shared expert's gate vector
# a MoE layer's linear groups besides the experts (dense_step._Group each): (group, member kinds)
GROUPS = (("router", (ROUTER,)), ("sgu", SHARED_EXPERT_KINDS[:2]), ("sdown", SHARED_EXPERT_KINDS[2:]))
KINDS = (ROUTER, *EXPERT_KINDS, *SHARED_EXPERT_KINDS)  # the LoRA targets of a MoE layer


def unsupported(model) -> str | None:
    """Why this MoE model's layers cannot take the fused step (None: they can)."""
    cfg = model.config
    spec = cfg.spec
    if spec.shared_ungated or spec.dense_lead:
        return "ungated shared experts and leading dense layers (DeepSeek)"
    if spec.expert_act != "silu" or spec.ffn_act != "silu":
        return f"expert activation {spec.expert_act} (the fused step's experts are SwiGLU)"
    if cfg.C % 8 or cfg.F_exp % 8:
        return f"expert widths C {cfg.C}, F {cfg.F_exp} (the grouped GEMMs need multiples of 8)"
    if cfg.E > MAX_E:
        return f"{cfg.E} experts (the router kernels take at most {MAX_E})"
    if os.environ.get("TUNE_MOE_STEP") == "0":  # the generic step, to compare or to fall back
        return "TUNE_MOE_STEP=0 asks for the generic step"
    return None


def matrices(model, i: int) -> list[str]:
    """The matrices of MoE layer i that the step holds as bf16: router, expert stacks, shared expert."""
    kinds = (ROUTER, *EXPERT_KINDS) + (SHARED_EXPERT_KINDS if model.config.F_shexp else ())
    return [layer_name(i, k) for k in kinds]


class MoeBlocks:
    """The MoE layers of one fused step (dense_step.DenseStep builds it after its attention groups):
    their groups (added to step.groups, so that the optimizer table covers them), buffers, forward,
    backward and expert counts."""

    def __init__(self, step, ring: dict) -> None:
        self.step = step
        cfg, xp, W = step.cfg, step.xp, step.model.weights
        self.layers = [i for i, moe in enumerate(step.moe_layers) if moe]
        self.index = {i: j for j, i in enumerate(self.layers)}  # layer -> its row in the MoE buffers
        Lm, N, C, E, F = len(self.layers), step.N, cfg.C, cfg.E, cfg.F_exp
        self.shared = bool(cfg.F_shexp)
        Fs = cfg.F_shexp
        u16, f32 = xp.uint16, xp.float32
        for i in self.layers:
            for g, kinds in GROUPS:
                if g == "router" or self.shared:
                    step.groups[i][g] = step._group(i, kinds, ring)
        r_of = {g: max((step.groups[i][g].rg for i in self.layers if g in step.groups[i]), default=0)
                for g, _ in GROUPS}  # fmt: skip
        self.r_of = r_of

        def optional(i, kind, suffix="bias"):
            name = layer_name(i, kind, suffix)
            return W[name] if name in W else None

        self.router_bias = [optional(i, ROUTER) for i in self.layers]
        self.select_bias = [optional(i, "exp_probs_b") for i in self.layers]
        self.expert_bias = [tuple(optional(i, k) for k in EXPERT_KINDS) for i in self.layers]
        # expert stacks: (gate|up (2, E, F, C), down (E, C, F)) bf16, per layer or one refilled set
        self.names = [tuple(layer_name(i, k) for k in EXPERT_KINDS) for i in self.layers]
        if step.persistent:
            self.stacks = []
            for gate, up, down in self.names:
                gu, d = xp.empty((2, E, F, C), u16), xp.empty((E, C, F), u16)
                W.dequant_into(gate, gu[0])
                W.dequant_into(up, gu[1])
                W.dequant_into(down, d)
                self.stacks.append((gu, d))
            self.raw = None
        else:
            self.ring = (xp.empty((2, E, F, C), u16), xp.empty((E, C, F), u16))
            self.raw = [W.join(names[:2]) for names in self.names]  # one launch for gate and up
        # expert LoRA: per layer, per stack (gate, up, down) the master factors and static gradients
        self.lora: list[tuple] = []
        pairs, s = step.trainable.pairs, step.s
        for names in self.names:
            per = []
            for name in names:
                if name in pairs:
                    A, B = pairs[name]
                    per.append((name, LoraTerm(A, B, s), xp.empty(A.shape, f32), xp.empty(B.shape, f32)))
                else:
                    per.append(None)
            self.lora.append(tuple(per))
        self.w_gs = [W[layer_name(i, SHARED_GATE)] for i in self.layers] if self.shared else None
        # activations kept for the backward, per MoE layer
        self.XH = xp.empty((Lm, N, C), f32)  # ffn norm output: the experts' input
        self.XAR = xp.empty((Lm, N, max(1, r_of["router"])), u16)  # h A_r^T
        if self.shared:
            self.SGU16 = xp.empty((Lm, N, 2 * Fs + r_of["sgu"]), u16)  # g|u | h A^T
            self.XASD = xp.empty((Lm, N, max(1, r_of["sdown"])), u16)  # act A_d^T
            self.SOUT = xp.empty((Lm, N, C), f32)  # the shared expert's output before its gate
            self.SGATE = xp.empty((Lm, N, 1), f32)  # sigmoid(h . w_gs)
            self.sact = xp.empty((N, Fs), u16)
            self.dsact = xp.empty((N, Fs), f32)
            self.Gs = xp.empty((N, 2 * Fs + r_of["sgu"]), u16)
            self.dS16 = xp.empty((N, C), u16)
            self.tmp = xp.empty((N, C), f32)
            self.z = xp.empty((N, 1), f32)
            self.z2 = xp.empty((N, 1), f32)
        # scratch
        self.logits = xp.empty((N, E), f32)
        self.DL16 = xp.empty((N, E), u16)
        self.T16 = xp.empty((N, max(1, r_of["router"], r_of["sdown"])), u16)  # s dY B of a split backward
        # expert counts: the padding rows' expert ids are moved past E (uploaded per batch)
        self.pad = xp.zeros(N, xp.int32)
        self.expert_ids = xp.arange(E, dtype=xp.int32)
        self.topk = xp.empty((Lm, N, cfg.K), xp.int32)  # every MoE layer's choices, for the counts
        self.counts_shape = (Lm, E)
        self.counts_size = Lm * E
        self.counts: Any = None  # (Lm, E) float64 view of the step's read buffer (set by the step)

    def expert_params(self):
        """(parameter name, master factor, static gradient) of every expert LoRA factor."""
        for per in self.lora:
            for entry in per:
                if entry is not None:
                    name, term, gA, gB = entry
                    yield name + ".lora_a", term.A, gA
                    yield name + ".lora_b", term.B, gB

    def load(self, b: int) -> None:
        """Upload the batch's padding rows (windows b..B-1), which the expert counts leave out."""
        st = self.step
        pad = np.zeros((st.B, st.T), np.int32)
        pad[b:] = st.cfg.E
        st.rt.upload(self.pad, pad.reshape(-1))

    # --- weights ------------------------------------------------------------------------------
    def _stacks(self, j: int):
        """Layer j's expert stacks (gate, up, down) as bf16, refilled first in ring mode."""
        if self.raw is None:
            gu, d = self.stacks[j]
            return gu[0], gu[1], d
        st, (gu, d) = self.step, self.ring
        W = st.model.weights
        gate, up, down = self.names[j]
        raw = self.raw[j]
        if raw is not None:
            dequant_on(st.rt, raw[0], raw[1], out=gu.reshape(*raw[0].shape[:-1], -1), dtype="bfloat16")
        else:
            W.dequant_into(gate, gu[0])
            W.dequant_into(up, gu[1])
        W.dequant_into(down, d)
        return gu[0], gu[1], d

    def _loras(self, j: int) -> tuple:
        return tuple(None if e is None else e[1] for e in self.lora[j])

    # --- a layer ------------------------------------------------------------------------------
    def forward(self, i: int):
        """Layer i's MoE FFN: x' = x_mid + experts(h) (+ shared(h) sigmoid(h . w_gs)), h = rmsnorm(x_mid).
        Returns its cache: (topk, the routing's cache, the experts' cache)."""
        st, cfg = self.step, self.step.cfg
        rt, j, g = st.rt, self.index[i], st.groups[i]
        XH, H2 = self.XH[j], st.H2[i]
        rmsnorm_fwd_out_on(rt, st.XM[i], st.norm_w[i][1], cfg.rms_eps, XH, st.rstd[i, 1], copy=st.X[i + 1])
        st._to_bf16(XH, H2)
        # router: logits = h W_r^T + s (h A_r^T) B_r^T (+ b_r)
        st._residual_forward(g["router"], H2, self.logits, self.XAR[j], add=False)
        if self.router_bias[j] is not None:
            self.logits += self.router_bias[j]
        routing, rcache = route_forward_on(rt, self.logits, cfg.K, cfg.moe_renorm, cfg.gating, cfg.moe_scale,
                                           self.select_bias[j], cfg.n_group, cfg.group_used)  # fmt: skip
        wg, wu, wd = self._stacks(j)
        bg, bu, bd = self.expert_bias[j]
        y, ecache = experts_forward_on(rt, XH, routing, wg, wu, wd, *self._loras(j), b_gate=bg, b_up=bu,
                                       b_down=bd, act=cfg.spec.expert_act)  # fmt: skip
        st.X[i + 1] += y
        if self.shared:
            self._shared_forward(i, j)
        return routing.topk, rcache, ecache

    def backward(self, i: int, cache) -> None:
        """dres holds the gradient of layer i's output; adds the ffn norm's input gradient to it and
        writes its bf16 bits to G["o"] (the attention output's dY)."""
        st, cfg = self.step, self.step.cfg
        rt, j, g, xp = st.rt, self.index[i], st.groups[i], st.xp
        _, rcache, ecache = cache
        wg, wu, wd = self._stacks(j)
        # forward was: y = sum_k w_nk expert_e(h) (grouped GEMMs, LoRA on gate/up/down)
        dh, dweights, _, dlora, _ = experts_backward_on(rt, st.dres, ecache, wg, wu, wd)
        for key, entry in zip(("gate", "up", "down"), self.lora[j], strict=True):
            if entry is not None:
                dA, dB = dlora[key]
                entry[2][...] = dA
                entry[3][...] = dB
        dlogits = route_backward_on(rt, dweights, rcache)
        # forward was: logits = h W_r^T + s (h A_r^T) B_r^T
        st._to_bf16(dlogits, self.DL16)
        self._split_backward(g["router"], self.DL16, self.XAR[j], st.H2[i], dh)
        if self.shared:
            self._shared_backward(i, j, dh, xp)
        rmsnorm_bwd_acc_on(rt, dh, st.XM[i], st.rstd[i, 1], st.norm_w[i][1], st.dres, st.G["o"][:, : cfg.C])

    def _shared_forward(self, i: int, j: int) -> None:
        """x' += S sigmoid(z): S = down(swiglu(gate, up)) of h, z = h . w_gs (qwen2moe)."""
        st, xp = self.step, self.step.xp
        rt, g, Fs = st.rt, st.groups[i], st.cfg.F_shexp
        st._fresh_forward(g["sgu"], st.H2[i], self.SGU16[j])
        glu_fwd_bf16_on(rt, self.SGU16[j], Fs, self.sact)
        st._residual_forward(g["sdown"], self.sact, self.SOUT[j], self.XASD[j], add=False)
        rt.gemm(self.XH[j], self.w_gs[j].reshape(-1, 1), self.z)  # float32, as the generic h @ w_gs
        gate = self.SGATE[j]
        xp.negative(self.z, out=self.z)  # sigmoid(z) = 1 / (1 + exp(-z)), as kernels.glu.sigmoid
        xp.exp(self.z, out=self.z)
        self.z += 1.0
        xp.reciprocal(self.z, out=gate)
        xp.multiply(self.SOUT[j], gate, out=self.tmp)
        st.X[i + 1] += self.tmp

    def _shared_backward(self, i: int, j: int, dh: Any, xp: Any) -> None:
        """forward was: x' += S g, g = sigmoid(z), z = h . w_gs, S = down(act), act = swiglu(gu(h)).
        Adds the shared expert's and its gate's input gradients into dh."""
        st = self.step
        rt, g, Fs = st.rt, st.groups[i], st.cfg.F_shexp
        gate = self.SGATE[j]
        xp.multiply(st.dres, gate, out=self.tmp)  # dS = dy g
        st._to_bf16(self.tmp, self.dS16)
        xp.multiply(st.dres, self.SOUT[j], out=self.tmp)
        self.tmp.sum(axis=1, keepdims=True, out=self.z)  # sum_c dy S
        xp.subtract(1.0, gate, out=self.z2)
        self.z2 *= gate
        self.z *= self.z2  # dz = (sum_c dy S) g (1 - g)
        rt.gemm(self.z, self.w_gs[j].reshape(1, -1), dh, beta=1.0)  # dh += dz w_gs
        glu_fwd_bf16_on(rt, self.SGU16[j], Fs, self.sact)  # recomputed: not kept per layer
        self._split_backward(g["sdown"], self.dS16, self.XASD[j], self.sact, self.dsact, beta=0.0)
        glu_bwd_bf16_on(rt, self.dsact, self.SGU16[j], Fs, self.Gs)
        st._fresh_backward(g["sgu"], self.Gs, self.SGU16[j][:, 2 * Fs :], st.H2[i], dh, beta=1.0)

    def _split_backward(self, grp, dY16: Any, xa16: Any, x16: Any, dx: Any, beta: float = 1.0) -> None:
        """A residual-style group's backward from a contiguous bf16 dY: dx = dY W + (s dY B) A (+ beta
        dx); dB = s dY^T (x A^T); dA = (s dY B)^T x. (The dense step's `_fresh_backward` with dY and
        its LoRA columns in separate buffers: dY comes from a cast, which writes whole rows.)"""
        st = self.step
        rt, n = st.rt, grp.n_out
        Wb = st._weights(grp, with_a=False)
        rt.gemm(dY16, Wb[:n], dx, beta=beta)
        if grp.rg:
            t = self.T16[:, : grp.rg]
            rt.gemm(dY16, grp.Bblk, t, alpha=st.s)
            rt.gemm(t, st._a_rows(grp), dx, beta=1.0)
            rt.gemm(dY16, xa16[:, : grp.rg], grp.gB, trans_a=True, alpha=st.s)
            rt.gemm(t, x16, grp.gA, trans_a=True)

    def count(self, caches) -> None:
        """Tokens routed to each expert in every MoE layer this step, padding rows left out, into the
        read buffer (float64 counts, exact): one-hot of the top-k choices summed over tokens and slots."""
        xp, topk = self.step.xp, self.topk
        for j, c in enumerate(caches):  # one copy a layer: CuPy's stack of more than 8 small arrays
            topk[j] = c[0]  # uploads a table of their addresses, which a capture refuses
        topk += self.pad[None, :, None]  # a padding row's choices become ids >= E: no expert
        hits = topk[..., None] == self.expert_ids  # (Lm, N, K, E)
        hits.sum(axis=(1, 2), dtype=xp.float64, out=self.counts)
