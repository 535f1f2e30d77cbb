"""The trainable part of a run and the whole-model loss with its gradients.

`Trainable` holds the LoRA factor pairs (float master copies, B = 0 at the start) and the
full-weight copies of tensors trained in full; `Trainable.params()` is the flat name -> array view
the optimizer updates in place (`<base>.lora_a`, `<base>.lora_b`, `<base>`).

`loss_and_grads(model, trainable, batch)` runs the forward pass over a packed batch (positions
restarting per sample, attention kept inside each sample), the fused output projection and
cross-entropy, and the backward pass through every block, returning the gradients of exactly the
trainable parameters. Frozen weights get no gradient computed. With `checkpoint=True` only each
block's input is kept and the block is recomputed during the backward pass.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import array_module, to_host
from ..errors import ModelError
from ..model import ops
from ..model.forward import (
    OUTPUT,
    TOKEN_EMBD,
    backward_hidden,
    forward_hidden,
    make_inputs,
    output_name,
)
from ..model.layers import add_grad, add_lora_grads
from ..model.lora import LoraAdapter, effective_scale, lora_shapes
from ..model.model import applied_lora
from ..model.ops import LoraTerm


@dataclass
class Trainable:
    """LoRA pairs and full-weight tensors being trained, with one rank and alpha for the adapter."""

    rank: int  # LoRA rank r
    alpha: float  # LoRA alpha; the adapter's scale is alpha / r
    pairs: dict[str, tuple[np.ndarray, np.ndarray]]  # base name -> (A, B), NumPy layouts of engine.model.lora
    full: dict[str, np.ndarray]  # base name -> trainable copy of the whole tensor

    @classmethod
    def init(
        cls,
        model,
        targets: list[str],
        rank: int = 16,
        alpha: float = 32.0,
        full: list[str] = (),
        seed: int = 0,
        init: str = "kaiming",
    ) -> Trainable:
        """Fresh adapter: B = 0 so the model starts unchanged; A random.

        init "kaiming": A ~ U(-1/sqrt(n_in), 1/sqrt(n_in)), as PEFT, so the adapter's effective step
        size does not grow with the layer width; "gaussian": A ~ N(0, (1/sqrt(r))^2) (DESIGN §2.4).
        For token_embd (A (V, r), B (C, r)) A ~ N(0, 1) as PEFT's embedding LoRA.
        """
        if rank < 1:
            raise ModelError(f"LoRA rank must be >= 1, got {rank}")
        rng = np.random.default_rng(seed)
        dtype = model.dtype if model.dtype != np.float16 else np.float32
        pairs = {}
        for name in targets:
            info = model.tensors.get(name)
            if info is None:
                raise ModelError(f"LoRA target {name!r} is not a tensor of this model")
            shape_a, shape_b = lora_shapes(name, info.shape, rank)
            if name == TOKEN_EMBD:
                A = rng.standard_normal(shape_a)
            elif init == "gaussian":
                A = rng.standard_normal(shape_a) / np.sqrt(rank)
            elif init == "kaiming":
                bound = 1.0 / np.sqrt(shape_a[-1])
                A = rng.uniform(-bound, bound, shape_a)
            else:
                raise ModelError(f"unknown LoRA init {init!r} (kaiming, gaussian)")
            pairs[name] = (A.astype(dtype), np.zeros(shape_b, dtype))
        full_copies = {}
        for name in full:
            if name not in model.weights:
                raise ModelError(f"full-weight tensor {name!r} is not used by this model")
            full_copies[name] = np.array(model.weights.dense(name), dtype=dtype, copy=True)
        return cls(rank, float(alpha), pairs, full_copies)

    @classmethod
    def from_adapter(cls, adapter: LoraAdapter, model) -> Trainable:
        """Continue training an adapter file (ranks must agree across its tensors)."""
        adapter.check(model)
        ranks = {adapter.rank(n) for n in adapter.pairs}
        if len(ranks) != 1:
            raise ModelError(
                f"{adapter.path}: tensors have different ranks {sorted(ranks)}; one rank is needed"
            )
        dtype = model.dtype if model.dtype != np.float16 else np.float32
        pairs = {
            n: (A.astype(dtype, copy=True), B.astype(dtype, copy=True)) for n, (A, B) in adapter.pairs.items()
        }
        return cls(ranks.pop(), adapter.alpha, pairs, {})

    @property
    def scale(self) -> float:
        return effective_scale(self.alpha, self.rank)

    def to(self, backend) -> Trainable:
        """The same parameters as float32 arrays on `backend`'s device (itself on the CPU)."""
        if not backend.is_gpu:
            return self
        pairs = {
            n: (backend.asarray(A, np.float32), backend.asarray(B, np.float32))
            for n, (A, B) in self.pairs.items()
        }
        full = {n: backend.asarray(w, np.float32) for n, w in self.full.items()}
        return Trainable(self.rank, self.alpha, pairs, full)

    def terms(self, scale: float = 1.0) -> dict[str, LoraTerm]:
        s = effective_scale(self.alpha, self.rank, scale)
        return {n: LoraTerm(A, B, s) for n, (A, B) in self.pairs.items()}

    def params(self) -> dict[str, np.ndarray]:
        """Flat view for the optimizer: the same arrays, updated in place."""
        out: dict[str, np.ndarray] = {}
        for n, (A, B) in self.pairs.items():
            out[n + ".lora_a"] = A
            out[n + ".lora_b"] = B
        out.update(self.full)
        return out

    @property
    def n_params(self) -> int:
        return int(sum(a.size for a in self.params().values()))

    def to_adapter(self, arch: str, metadata: Mapping | None = None) -> LoraAdapter:
        """The adapter as host arrays (copied from the device on a GPU run)."""
        pairs = {
            n: (to_host(A).astype(np.float32), to_host(B).astype(np.float32))
            for n, (A, B) in self.pairs.items()
        }
        return LoraAdapter(self.alpha, pairs, arch, dict(metadata or {}))


@dataclass(frozen=True)
class LossResult:
    """One batch's objective, its plain cross-entropy, and gradients."""

    loss: float  # the optimised objective: sum(weights * ce) (+ KL term)
    ce_sum: float  # sum of cross-entropy over label tokens (unweighted)
    n_tokens: int  # label tokens
    grads: dict[str, np.ndarray] | None  # name -> gradient, for every trainable parameter (on its device)
    expert_counts: np.ndarray | None  # (L, E) tokens routed to each expert, MoE models only (on the device)
    extra: Any = None  # what a sequence-level objective reports (engine.train.preferences), else None
    router_aux: float | None = None  # the MoE load-balancing loss, summed over the layers (in `loss`)

    @property
    def mean_ce(self) -> float:
        return self.ce_sum / max(1, self.n_tokens)


def _inputs(model, batch):
    return make_inputs(
        model.config,
        model.weights,
        batch.tokens,
        batch.positions,
        batch.segments,
        dtype=model.dtype,
        backend=model.backend,
    )


def final_hidden(model, batch, lora: Mapping[str, LoraTerm] | None = None, weights=None) -> np.ndarray:
    """Normalised final hidden states (B*T, C) without caches (the reference model for a KL term)."""
    cfg = model.config
    W = weights if weights is not None else model.weights
    with model.backend.active():
        h, _ = forward_hidden(cfg, W, lora or {}, model.moe_layers, _inputs(model, batch))
    return h.reshape(-1, cfg.C)


@dataclass(frozen=True)
class SequenceObjective:
    """What a sequence-level objective (DPO, ORPO) makes of the batch's per-sequence cross-entropies:
    its loss, the per-token weights whose weighted cross-entropy has its gradient, and figures."""

    loss: float  # the objective's value
    token_weights: np.ndarray  # (B*T,) dL/d(ce_t): the objective's gradient is sum_t w_t d(ce_t)
    extra: Any = None  # figures for events (LossResult.extra)


# the hook of loss_and_grads: given ce(targets) -> sum of the cross-entropy over the rows whose
# targets are >= 0 (the rest set to -1), the objective of the batch
SequenceLoss = Callable[[Callable[[np.ndarray], float]], SequenceObjective]


def loss_and_grads(
    model,
    trainable: Trainable,
    batch,
    *,
    backward: bool = True,
    checkpoint: bool = False,
    kl_coef: float = 0.0,
    sequence_loss: SequenceLoss | None = None,
    router_aux_coef: float = 0.0,
) -> LossResult:
    """Forward (and backward) over one packed batch; gradients of the trainable parameters only.

    sequence_loss: an objective of whole sequences (engine.train.preferences) instead of the
    batch's weighted cross-entropy: it is handed the cross-entropy of any subset of the label
    rows (the head computed again for them, no logits kept) and returns its loss and the token
    weights whose weighted cross-entropy has the same gradient; the backward pass is then the
    ordinary one with those weights.

    On a GPU model every array stays on the device; the loss and cross-entropy come back to the
    host in one read, gradients and expert counts stay where they were computed.

    router_aux_coef: the weight of the Switch Transformer load-balancing loss of every MoE layer
    (engine.model.layers.load_balance), summed over the layers and added to the loss (its value
    alone in `router_aux`); its gradient reaches the router through its logits."""
    with model.backend.active():
        return _loss_and_grads(model, trainable, batch, backward, checkpoint, kl_coef, sequence_loss,
                               router_aux_coef)  # fmt: skip


def _loss_and_grads(model, trainable: Trainable, batch, backward: bool, checkpoint: bool, kl_coef: float,
                    sequence_loss: SequenceLoss | None = None, router_aux_coef: float = 0.0):  # fmt: skip
    cfg = model.config
    W = ChainMap(trainable.full, model.weights)
    lora = applied_lora(cfg, trainable.terms())
    need = set(trainable.full)
    inp = _inputs(model, batch)
    counts: list[np.ndarray] = []
    keep = "none" if not backward else ("inputs" if checkpoint else "caches")
    aux_values: list = []
    h, fc = forward_hidden(cfg, W, lora, model.moe_layers, inp, keep=keep, expert_usage=counts,
                           aux_coef=router_aux_coef, aux_values=aux_values)  # fmt: skip
    out_name = output_name(W)
    tied_lora = lora.get(TOKEN_EMBD) if out_name == TOKEN_EMBD else None
    h_ref = w_ref = None
    if kl_coef:
        # the reference is the base model: adapter off, full-weight tensors at their original values
        h_ref = final_hidden(model, batch)
        w_ref = model.weights[out_name]
    # the fused head and loss (with a final soft-cap, gemma3's, the logits are capped first)
    weights = np.asarray(batch.weights).reshape(-1)
    objective = None
    if sequence_loss is not None:
        objective = sequence_loss(_sequence_ce(cfg, h, W[out_name], lora, out_name, tied_lora))
        weights = objective.token_weights
        if not backward:
            n_label = int(np.count_nonzero(np.asarray(batch.targets) >= 0))
            return LossResult(objective.loss, float("nan"), n_label, None, None, objective.extra)
    loss, (ce_sum, n_tok), dh, g_head = ops.lm_head_loss(
        h.reshape(-1, cfg.C),
        W[out_name],
        np.asarray(batch.targets).reshape(-1),
        weights,
        lora=lora.get(OUTPUT) if out_name == OUTPUT else None,
        tied_lora=tied_lora,
        need_dw=out_name in need,
        h_ref=h_ref,
        w_ref=w_ref,
        kl_coef=kl_coef,
        backward=backward,
        cap=cfg.softcap,
    )
    expert = array_module(counts[0]).stack(counts) if counts else None
    if not isinstance(loss, float):  # device scalars (a GPU run): both in one read
        xp = array_module(loss)
        loss, ce_sum = (float(x) for x in to_host(xp.stack([xp.asarray(loss), xp.asarray(ce_sum)])))
    extra = None
    if objective is not None:
        loss, extra = objective.loss, objective.extra
    aux = float(sum(float(to_host(v)) for v in aux_values)) if aux_values else None
    if aux is not None:
        loss += aux
    if not backward:
        return LossResult(loss, ce_sum, n_tok, None, expert, extra, aux)

    grads: dict[str, np.ndarray] = {}
    add_grad(grads, out_name, g_head["W"])
    if g_head["lora"] is not None:
        add_lora_grads(grads, OUTPUT, *g_head["lora"])
    if g_head["tied_lora"] is not None:
        add_lora_grads(grads, TOKEN_EMBD, *g_head["tied_lora"])
    backward_hidden(
        cfg,
        W,
        lora,
        model.moe_layers,
        inp,
        dh.reshape(h.shape),
        fc,
        need,
        grads,
        TOKEN_EMBD in trainable.pairs,
    )
    params = trainable.params()
    missing = set(params) - set(grads)
    for name in missing:  # a parameter the batch did not reach (e.g. an expert no token was routed to)
        grads[name] = array_module(params[name]).zeros_like(params[name])
    return LossResult(loss, ce_sum, n_tok, grads, expert, extra, aux)


def _sequence_ce(cfg, h, w, lora, out_name: str, tied_lora) -> Callable[[np.ndarray], float]:
    """ce(targets): the summed cross-entropy of the rows whose targets are >= 0, by the fused head
    (forward only; the rows of the other targets are not computed)."""
    h2 = h.reshape(-1, cfg.C)
    out_lora = lora.get(OUTPUT) if out_name == OUTPUT else None

    def ce(targets: np.ndarray) -> float:
        ones = (np.asarray(targets) >= 0).astype(np.float32)
        _, (ce_sum, _), _, _ = ops.lm_head_loss(h2, w, targets, ones, lora=out_lora, tied_lora=tied_lora,
                                                backward=False, cap=cfg.softcap)  # fmt: skip
        return float(ce_sum)

    return ce
