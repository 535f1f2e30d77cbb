"""The fused training step of a dense model on a GPU: every launch of a step planned once, on fixed
buffers, so that the step reads the host once, at its end, and can be captured as one CUDA graph.

What it computes is `engine.train.train_model.loss_and_grads` followed by `AdamW.step` (the
generic op-by-op path, which stays the reference and the fallback), for the standard dense
architectures (llama, qwen2, qwen3) with LoRA on any of q, k, v, o, gate, up, down. Per layer:

- forward: the attention norm writes the bf16 input of its GEMM and copies the residual stream
  into the buffer the output projection adds into (GEMM beta = 1); q, k, v are one GEMM of
  [Wq; Wk; Wv; A_q; A_k; A_v] (the LoRA A products folded in), their B products one GEMM of a
  block-diagonal [B_q, B_k, B_v] added in (bf16 output); bias, q/k norm and RoPE one kernel
  (`engine.kernels.qkv`); attention on the tensor cores (`engine.kernels.attention_gemm`); o, gate/up
  and down the same way (gate and up one GEMM); SwiGLU on bf16;
- backward: each group's input gradient is one GEMM of [dY | s dY B] @ [W; A]; its LoRA gradients two
  GEMMs (dB of the whole block, whose diagonal blocks are the gradients; dA); norms add into the
  residual gradient in place and write its bf16 bits for the next GEMM; frozen norms and biases get
  no gradient;
- the head and loss over all B*T rows (padding rows weigh 0: fixed shapes), then AdamW with its
  clip, skip and |p| check decided on the device (`engine.kernels.adamw.DeviceAdamW`), which writes
  the bf16 copies of the new LoRA factors where the next step's GEMMs read them.

bf16: every GEMM operand (weights, activations, LoRA factors' copies) with fp32 accumulation; the
residual stream and its gradient, LoRA master weights, optimizer moments, norms' statistics and
the loss are float32 (float64 sums). Weights: when the weight cache's budget holds the whole
model, each layer's matrices are dequantized once into the step's own buffers (the A rows beside
them); otherwise ("off", or a small budget) one set of layer buffers is refilled at each use
(dequantized from the stored blocks, the layer's A rows copied in): QLoRA at rest.

`DenseStep.unsupported(...)` says why a run cannot take this path (the trainer logs it and runs
the generic path): another architecture, MoE layers (issue 30 will add a MoE layer to this step:
a layer is a forward/backward pair on the step's buffers, `_dense_forward` / `_dense_backward`),
full-weight tensors, LoRA on the embedding or the head, gradient accumulation, a KL term, layer
checkpointing. Not here: the training loop and its events (engine.train.trainer).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels import attention_gemm, embedding, linear
from ..kernels.adamw import STATS, DeviceAdamW
from ..kernels.cross_entropy import lm_head_loss_on
from ..kernels.dequant import dequant_on
from ..kernels.glu import glu_bwd_bf16_on, glu_fwd_bf16_on
from ..kernels.norm import rmsnorm_bwd_acc_on, rmsnorm_fwd_out_on
from ..kernels.qkv import qkv_rope_backward_on, qkv_rope_forward_on
from ..model.forward import OUTPUT_NORM, TOKEN_EMBD, make_inputs, output_name
from ..model.layers import layer_name

log = logging.getLogger(__name__)

ARCHS = ("llama", "qwen2", "qwen3")
# the linear groups of a layer: (group, member kinds, the GEMM writes a fresh buffer (True) or adds
# into the residual stream (False))
GROUPS = (
    ("qkv", ("attn_q", "attn_k", "attn_v"), True),
    ("o", ("attn_output",), False),
    ("gu", ("ffn_gate", "ffn_up"), True),
    ("down", ("ffn_down",), False),
)
KINDS = tuple(k for _, kinds, _ in GROUPS for k in kinds)


@dataclass
class _Group:
    """One linear group of one layer: its weight buffer [W_1; ...; W_k; A_1; ...] and LoRA blocks."""

    names: tuple[str, ...]  # GGUF names of the members
    rows: tuple[int, ...]  # first row of each member in W
    n_out: int  # rows of all W together
    n_in: int
    lora: tuple[int, ...]  # members with LoRA (indices into names), in slot order
    raw: Any  # ring mode: (stored blocks of every member, type) for one dequantization, or None
    W: Any  # (n_out + rg, n_in) bf16: the member weights, then the A rows (persistent mode)
    A16: Any  # (rg, n_in) bf16: this layer's A rows (ring mode; None when they live in W)
    Bblk: Any  # (n_out, rg) bf16: block-diagonal B copies (zeros off the blocks), or None
    gA: Any  # (rg, n_in) float32 gradients of the A rows
    gB: Any  # (n_out, rg) float32: dB of every block (the diagonal blocks are the gradients)

    @property
    def rg(self) -> int:
        return 0 if self.gA is None else int(self.gA.shape[0])


def unsupported(
    model, trainable, grad_accum: int = 1, kl: bool = False, checkpoint: bool = False
) -> str | None:
    """Why this run cannot take the fused dense step (None: it can)."""
    cfg = model.config
    if not model.backend.is_gpu:
        return "the CPU runs the NumPy path"
    if cfg.arch not in ARCHS:
        return f"architecture {cfg.arch} (the fused step covers {', '.join(ARCHS)})"
    if any(model.moe_layers):
        return "MoE layers (the fused step is dense only so far)"
    if cfg.qk_norm not in (None, "head") or cfg.has_swa or cfg.n_rot % 2:
        return "this attention variant (q/k norm over the whole projection, sliding window, odd n_rot)"
    if cfg.HS > 256:
        return f"head size {cfg.HS} (at most 256)"
    if trainable.full:
        return "tensors trained in full"
    other = [n for n in trainable.pairs if n.split(".")[2:3] == [] or n.split(".")[2] not in KINDS]
    if other:
        return f"LoRA on {other[0]} (the fused step adapts the layers' linear maps only)"
    if not trainable.pairs:
        return "no LoRA target"
    if grad_accum != 1:
        return "gradient accumulation"
    if kl:
        return "a KL term to the base model"
    if checkpoint:
        return "layer checkpointing (the fused step keeps every layer's activations)"
    return None


class DenseStep:
    """One model's fused step at a fixed batch shape (B windows of T tokens). Build it once; per
    step: `load(batch, lr)` uploads the inputs into the static buffers, `run()` issues the device
    work (no host read: it can be captured), `read()` is the one host read, `finish(stats)` updates
    the optimizer's counts. See the module docstring."""

    def __init__(self, model, trainable, optimizer, B: int, T: int) -> None:
        why = unsupported(model, trainable)
        if why:
            raise ValueError(f"the fused dense step cannot run this model: {why}")
        self.model, self.trainable, self.opt = model, trainable, optimizer
        self.cfg = cfg = model.config
        self.rt = rt = model.backend.runtime
        xp = self.xp = rt.xp
        W = model.weights
        self.B, self.T, self.N = B, T, B * T
        N, C, L = self.N, cfg.C, cfg.L
        self.nq, self.nkv = cfg.NH * cfg.HS, cfg.NKV * cfg.HS
        self.s = float(trainable.scale)
        self.r = int(trainable.rank)
        self.out_name = output_name(W)
        if self.out_name == TOKEN_EMBD and TOKEN_EMBD in trainable.pairs:
            raise ValueError("LoRA on a tied embedding is not on the fused path")
        matrices = [layer_name(i, k) for i in range(L) for k in KINDS]
        need = sum(W.infos[n].n_elements * 2 for n in matrices)
        self.persistent = W.budget >= need
        u16, f32 = xp.uint16, xp.float32
        # the model's other weights: the head (and tied embedding) in the step's own buffer
        self.head = self._matrix(self.out_name)
        self.embd = self.head if self.out_name == TOKEN_EMBD else self._matrix(TOKEN_EMBD)
        self.norm_w = [(W[layer_name(i, "attn_norm")], W[layer_name(i, "ffn_norm")]) for i in range(L)]
        self.out_norm = W[OUTPUT_NORM]
        self.bias = [self._qkv_bias(i) for i in range(L)]
        self.qk_norm = [
            (W[layer_name(i, "attn_q_norm")], W[layer_name(i, "attn_k_norm")])
            if cfg.qk_norm
            else (None, None)
            for i in range(L)
        ]
        # per layer, per group: weights, LoRA copies, gradients
        self.groups: list[dict[str, _Group]] = []
        ring: dict[str, Any] = {}
        for i in range(L):
            layer = {}
            for g, kinds, _fresh in GROUPS:
                layer[g] = self._group(i, kinds, ring)
            self.groups.append(layer)
        r_of = {g: self.groups[0][g].rg for g, _, _ in GROUPS}
        nqkv = self.nq + 2 * self.nkv
        F, NHS = cfg.F, self.nq
        self.r_of = r_of
        # activations kept for the backward, per layer
        self.X = xp.empty((L + 1, N, C), f32)  # the residual stream: layer inputs, then the last output
        self.XM = xp.empty((L, N, C), f32)  # after each layer's attention
        self.rstd = xp.empty((L, 2, N), f32)
        self.H16 = xp.empty((L, N, C), u16)  # attention norm outputs
        self.QKV16 = xp.empty((L, N, nqkv + r_of["qkv"]), u16)  # q|k|v (before bias) | x A^T
        self.ATT16 = xp.empty((L, N, NHS), u16)  # attention outputs
        self.XAO = xp.empty((L, N, max(1, r_of["o"])), u16)  # a A_o^T
        self.H2 = xp.empty((L, N, C), u16)  # ffn norm outputs
        self.GU16 = xp.empty((L, N, 2 * F + r_of["gu"]), u16)  # g|u | h A^T
        self.XAD = xp.empty((L, N, max(1, r_of["down"])), u16)  # act A_d^T
        # scratch
        self.q = xp.empty((N, cfg.NH, cfg.HS), f32)
        self.k = xp.empty((N, cfg.NKV, cfg.HS), f32)
        self.v = xp.empty((N, cfg.NKV, cfg.HS), f32)
        self.act = xp.empty((N, F), u16)
        self.hfin = xp.empty((N, C), f32)
        self.rstd_fin = xp.empty(N, f32)
        self.dres = xp.empty((N, C), f32)
        self.dh = xp.empty((N, C), f32)
        self.da = xp.empty((N, NHS), f32)
        self.dact = xp.empty((N, F), f32)
        self.G = {
            "qkv": xp.empty((N, nqkv + r_of["qkv"]), u16),
            "o": xp.empty((N, C + r_of["o"]), u16),
            "gu": xp.empty((N, 2 * F + r_of["gu"]), u16),
            "down": xp.empty((N, C + r_of["down"]), u16),
        }
        # the static inputs
        self.tokens = xp.empty(N, xp.int32)
        self.targets = xp.empty(N, xp.int32)
        self.weights = xp.empty(N, f32)
        self.mask = xp.empty((B, T, T), xp.uint8)
        half = cfg.n_rot // 2
        self.cos = xp.empty((N, half), f32)
        self.sin = xp.empty((N, half), f32)
        self.stats = xp.zeros(16, xp.float64)
        freqs = W.get("rope_freqs.weight")
        self.host_w = {} if freqs is None else {"rope_freqs.weight": rt.read(freqs)[0]}
        # the optimizer: every LoRA factor, its gradient view and its bf16 copy
        self.names: list[str] = []
        tensors, decay = [], []
        for i in range(L):
            for g, _, _ in GROUPS:
                grp = self.groups[i][g]
                for slot, m in enumerate(grp.lora):
                    name = grp.names[m]
                    A, Bm = trainable.pairs[name]
                    r = self.r
                    a_rows = slice(slot * r, (slot + 1) * r)
                    a16 = (
                        grp.A16[a_rows]
                        if grp.A16 is not None
                        else grp.W[grp.n_out + slot * r : grp.n_out + (slot + 1) * r]
                    )
                    b_rows = slice(grp.rows[m], grp.rows[m] + Bm.shape[0])
                    for suffix, p, gview, shadow in (
                        (".lora_a", A, grp.gA[a_rows], a16),
                        (".lora_b", Bm, grp.gB[b_rows, a_rows], grp.Bblk[b_rows, a_rows]),
                    ):
                        pname = name + suffix
                        self.names.append(pname)
                        tensors.append((p, gview, optimizer._m[pname], optimizer._v[pname], shadow))
                        decay.append(optimizer.decays(pname))
        self.adamw = DeviceAdamW(rt, tensors, decay)
        self.write_shadows()

    # --- building --------------------------------------------------------------------------------
    def _matrix(self, name: str) -> Any:
        info = self.model.weights.infos[name]
        out = self.xp.empty(tuple(info.shape), self.xp.uint16)
        self.model.weights.dequant_into(name, out)
        return out

    def _qkv_bias(self, i: int) -> Any:
        W = self.model.weights
        names = [layer_name(i, k, "bias") for k in ("attn_q", "attn_k", "attn_v")]
        if not any(n in W for n in names):
            return None
        parts = []
        for n, size in zip(names, (self.nq, self.nkv, self.nkv), strict=True):
            parts.append(W[n] if n in W else self.xp.zeros(size, self.xp.float32))
        return self.xp.ascontiguousarray(self.xp.concatenate(parts))

    def _group(self, i: int, kinds: tuple[str, ...], ring: dict) -> _Group:
        xp, W, pairs, r = self.xp, self.model.weights, self.trainable.pairs, self.r
        names = tuple(layer_name(i, k) for k in kinds)
        shapes = [tuple(W.infos[n].shape) for n in names]
        rows = tuple(int(x) for x in np.cumsum([0] + [s[0] for s in shapes[:-1]]))
        n_out, n_in = sum(s[0] for s in shapes), shapes[0][1]
        lora = tuple(m for m, n in enumerate(names) if n in pairs)
        rg = r * len(lora)
        key = kinds[0]
        if self.persistent:
            Wbuf = xp.empty((n_out + rg, n_in), xp.uint16)
            for n, row, s in zip(names, rows, shapes, strict=True):
                W.dequant_into(n, Wbuf[row : row + s[0]])
            A16 = raw = None
        else:  # one buffer per group shape, refilled at each use
            if key not in ring:
                ring[key] = xp.empty((n_out + rg, n_in), xp.uint16)
            Wbuf = ring[key]
            A16 = xp.empty((rg, n_in), xp.uint16) if rg else None
            raw = W.join(names) if len(names) > 1 else None
        Bblk = xp.zeros((n_out, rg), xp.uint16) if rg else None
        gA = xp.empty((rg, n_in), xp.float32) if rg else None
        gB = xp.empty((n_out, rg), xp.float32) if rg else None
        return _Group(names, rows, n_out, n_in, lora, raw, Wbuf, A16, Bblk, gA, gB)

    def write_shadows(self) -> None:
        """The bf16 copies of the LoRA factors (after a resume or a change from outside)."""
        opt = self.opt.cfg
        self.adamw.step(self.stats, betas=opt.betas, eps=opt.eps, gclip=opt.gclip,
                        max_grad_norm=opt.max_grad_norm, shadow_only=True)  # fmt: skip

    # --- a step --------------------------------------------------------------------------------
    def load(self, batch, lr: float) -> int:
        """Upload one batch (padded to B rows of T tokens: padding rows weigh 0) and the step's
        optimizer coefficients into the static buffers; returns its label tokens."""
        cfg, B, T = self.cfg, self.B, self.T
        b = batch.tokens.shape[0]
        if b > B or batch.tokens.shape[1] != T:
            raise ValueError(f"batch of {batch.tokens.shape} does not fit the step's ({B}, {T})")

        def pad(a, fill):
            out = np.full((B, T), fill, dtype=np.asarray(a).dtype)
            out[:b] = a
            return out

        tokens, targets = pad(batch.tokens, 0), pad(batch.targets, -1)
        weights = pad(batch.weights.astype(np.float32), 0.0)
        positions, segments = pad(batch.positions, 0), pad(batch.segments, -1)
        segments[b:] = np.arange(T)  # a padding row attends to itself only: finite, weightless
        inp = make_inputs(cfg, self.host_w, tokens, positions, segments)  # host arrays
        mask, cos, sin = inp.mask, inp.cos, inp.sin
        rt = self.rt
        rt.upload(self.tokens, tokens.reshape(-1))
        rt.upload(self.targets, targets.reshape(-1))
        rt.upload(self.weights, weights.reshape(-1))
        rt.upload(self.mask, mask.astype(np.uint8))
        rt.upload(self.cos, cos.reshape(self.N, -1))
        rt.upload(self.sin, sin.reshape(self.N, -1))
        opt = self.opt
        steps = [opt._t[n] + 1 for n in self.names]
        coef = self.adamw.coefficients(steps, lr, opt.cfg.betas, opt.cfg.weight_decay)
        rt.upload(self.adamw.coef, coef)
        return int(batch.n_label_tokens)

    def run(self) -> None:
        """The device work of one step: forward, loss, backward, optimizer. No host read, no upload."""
        rt, cfg, L, C = self.rt, self.cfg, self.cfg.L, self.cfg.C
        kernel = "get_rows_bf16_v8" if C % 8 == 0 else "get_rows_bf16_v1"
        V = self.embd.shape[0]
        args = (self.embd, self.tokens, self.X[0], np.int32(V), np.int32(C))
        rt.launch(embedding.SOURCE, kernel, (self.N,), (embedding.THREADS,), args)
        caches = [self._forward(i) for i in range(L)]
        rmsnorm_fwd_out_on(rt, self.X[L], self.out_norm, cfg.rms_eps, self.hfin, self.rstd_fin)
        _, _, dh, _ = lm_head_loss_on(
            rt, self.hfin, self.head, self.targets, self.weights, padded=True, out=self.stats[0:2]
        )
        G = self.G["down"]
        rmsnorm_bwd_acc_on(rt, dh, self.X[L], self.rstd_fin, self.out_norm, self.dres, G, accumulate=False)
        for i in reversed(range(L)):
            self._backward(i, caches[i])
            caches[i] = None
        opt = self.opt.cfg
        self.adamw.step(
            self.stats, betas=opt.betas, eps=opt.eps, gclip=opt.gclip, max_grad_norm=opt.max_grad_norm
        )

    def read(self) -> dict[str, float]:
        """The step's one host read: loss, ce_sum and the optimizer's stats (kernels.adamw.STATS)."""
        host = self.rt.read(self.stats)[0]
        return {k: float(host[i]) for i, k in enumerate(STATS)}

    def finish(self, stats: dict[str, float]) -> None:
        """After the read: the optimizer's counts move on unless the device skipped the step."""
        if stats["skipped"]:
            log.warning("non-finite loss or gradient norm at step %d: update skipped", self.opt.step_count)
            return
        for n in self.names:
            self.opt._t[n] += 1
        self.opt.step_count += 1

    # --- a layer ---------------------------------------------------------------------------------
    def _weights(self, grp: _Group, with_a: bool = True) -> Any:
        """The group's [W; A] buffer, refilled first in ring mode (the dequantization is captured;
        the A rows are copied in only when the GEMM reads them)."""
        if not self.persistent:
            W = self.model.weights
            if grp.raw is not None:  # the members' blocks side by side: one launch
                dequant_on(self.rt, grp.raw[0], grp.raw[1], out=grp.W[: grp.n_out], dtype="bfloat16")
            else:
                for n, row in zip(grp.names, grp.rows, strict=True):
                    W.dequant_into(n, grp.W[row : row + W.infos[n].shape[0]])
            if grp.A16 is not None and with_a:
                grp.W[grp.n_out :] = grp.A16
        return grp.W

    def _fresh_forward(self, grp: _Group, x16: Any, out16: Any) -> None:
        """out16 = x [W; A]^T (bf16), then out16[:, :n_out] += s (x A^T) B^T."""
        Wb = self._weights(grp)
        self.rt.gemm(x16, Wb, out16, trans_b=True)
        if grp.rg:
            n = grp.n_out
            self.rt.gemm(out16[:, n:], grp.Bblk, out16[:, :n], trans_b=True, alpha=self.s, beta=1.0)

    def _residual_forward(self, grp: _Group, x16: Any, res: Any, xa16: Any) -> None:
        """res += x W^T + s (x A^T) B^T (float32 residual stream; x A^T kept in xa16)."""
        Wb = self._weights(grp, with_a=False)
        n = grp.n_out
        self.rt.gemm(x16, Wb[:n], res, trans_b=True, beta=1.0)
        if grp.rg:
            self.rt.gemm(x16, Wb[n:] if grp.A16 is None else grp.A16, xa16, trans_b=True)
            self.rt.gemm(xa16, grp.Bblk, res, trans_b=True, alpha=self.s, beta=1.0)

    def _fresh_backward(self, grp: _Group, G: Any, xa16: Any, x16: Any, dx: Any) -> None:
        """G[:, :n_out] holds dY (bf16): dx = [dY | s dY B] [W; A]; dB = s dY^T (x A^T); dA = (s dY B)^T x."""
        rt, n = self.rt, grp.n_out
        if grp.rg:
            rt.gemm(G[:, :n], grp.Bblk, G[:, n:], alpha=self.s)
        Wb = self._weights(grp)
        rt.gemm(G, Wb, dx)
        if grp.rg:
            rt.gemm(G[:, :n], xa16, grp.gB, trans_a=True, alpha=self.s)
            rt.gemm(G[:, n:], x16, grp.gA, trans_a=True)

    def _forward(self, i: int):
        rt, cfg = self.rt, self.cfg
        g = self.groups[i]
        X, XM, eps = self.X, self.XM, cfg.rms_eps
        w_an, w_fn = self.norm_w[i]
        # attention block: x_mid = x + o(attention(rope(q), rope(k), v)) of rmsnorm(x)
        rmsnorm_fwd_out_on(rt, X[i], w_an, eps, self.H16[i], self.rstd[i, 0], copy=XM[i])
        self._fresh_forward(g["qkv"], self.H16[i], self.QKV16[i])
        qn, kn = self.qk_norm[i]
        qkv_rope_forward_on(rt, self.QKV16[i], self.bias[i], qn, kn, eps, self.cos, self.sin, cfg.rope,
                            cfg.NH, cfg.NKV, cfg.HS, out=(self.q, self.k, self.v))  # fmt: skip
        B, T = self.B, self.T
        q = self.q.reshape(B, T, cfg.NH, cfg.HS)
        k, v = (a.reshape(B, T, cfg.NKV, cfg.HS) for a in (self.k, self.v))
        bs = (T * cfg.NH * cfg.HS, T * cfg.NKV * cfg.HS, T * cfg.NKV * cfg.HS)
        y, cache = attention_gemm.forward_on(rt, q, k, v, self.mask, cfg.attn_scale, bs)
        self._to_bf16(y.reshape(self.N, -1), self.ATT16[i])
        self._residual_forward(g["o"], self.ATT16[i], XM[i], self.XAO[i])
        # feed-forward block: x' = x_mid + down(swiglu(gate, up)) of rmsnorm(x_mid)
        rmsnorm_fwd_out_on(rt, XM[i], w_fn, eps, self.H2[i], self.rstd[i, 1], copy=X[i + 1])
        self._fresh_forward(g["gu"], self.H2[i], self.GU16[i])
        glu_fwd_bf16_on(rt, self.GU16[i], cfg.F, self.act)
        self._residual_forward(g["down"], self.act, X[i + 1], self.XAD[i])
        return cache

    def _backward(self, i: int, cache) -> None:
        """dres holds the gradient of layer i's output, G["down"][:, :C] its bf16 bits."""
        rt, cfg = self.rt, self.cfg
        g, G = self.groups[i], self.G
        C, F, eps = cfg.C, cfg.F, cfg.rms_eps
        w_an, w_fn = self.norm_w[i]
        # forward was: x' = x_mid + down(act), act = swiglu(gu), gu = rmsnorm(x_mid) [Wg; Wu]
        glu_fwd_bf16_on(rt, self.GU16[i], F, self.act)  # recomputed: not kept per layer
        self._fresh_backward(g["down"], G["down"], self.XAD[i], self.act, self.dact)
        glu_bwd_bf16_on(rt, self.dact, self.GU16[i], F, G["gu"])
        self._fresh_backward(g["gu"], G["gu"], self.GU16[i][:, 2 * F :], self.H2[i], self.dh)
        rmsnorm_bwd_acc_on(rt, self.dh, self.XM[i], self.rstd[i, 1], w_fn, self.dres, G["o"][:, :C])
        # forward was: x_mid = x + o(attention(...)), q, k, v = rope/norm/bias of rmsnorm(x) [Wq; Wk; Wv]
        self._fresh_backward(g["o"], G["o"], self.XAO[i], self.ATT16[i], self.da)
        dq, dk, dv, _ = attention_gemm.backward_on(rt, self.da.reshape(self.B, self.T, -1), cache)
        qn, kn = self.qk_norm[i]
        qkv_rope_backward_on(rt, dq, dk, dv, self.QKV16[i], self.bias[i], qn, kn, eps, self.cos, self.sin,
                             cfg.rope, cfg.NH, cfg.NKV, cfg.HS, G["qkv"])  # fmt: skip
        nqkv = self.nq + 2 * self.nkv
        self._fresh_backward(g["qkv"], G["qkv"], self.QKV16[i][:, nqkv:], self.H16[i], self.dh)
        out16 = G["down"][:, :C] if i > 0 else None
        rmsnorm_bwd_acc_on(rt, self.dh, self.X[i], self.rstd[i, 0], w_an, self.dres, out16)

    def _to_bf16(self, x: Any, out: Any) -> None:
        grid = max(1, min(65535, -(-x.size // (linear.THREADS * 8))))
        vec = np.int32(x.size % 8 == 0 and self.rt.address(x) % 16 == 0 and self.rt.address(out) % 16 == 0)
        self.rt.launch(
            linear.SOURCE, "f32_to_bf16", (grid,), (linear.THREADS,), (x, out, np.int64(x.size), vec)
        )


def stats_of(step: dict[str, float]) -> tuple[float, float, float, float]:
    """(grad_norm, update_norm, param_norm, max |p|) from a step's stats (nan grad_norm: skipped)."""
    grad = math.sqrt(step["grad_sumsq"]) if not step["skipped"] else float("nan")
    return (
        grad,
        math.sqrt(max(0.0, step["update_sumsq"])),
        math.sqrt(max(0.0, step["param_sumsq"])),
        step["max_abs_param"],
    )
