"""Whole-model gradients: the loss against every LoRA parameter kind and full-weight tensors, on tiny
models of every architecture, by central differences in float64; checkpointing changes nothing."""

from __future__ import annotations

from fnmatch import fnmatch
from types import SimpleNamespace

import numpy as np
import pytest

from engine.model.model import Model
from engine.model.targets import TargetSpec, lora_candidates, select_full, select_targets, split_name
from engine.testing import SynthSpec, write_model
from engine.train.train_model import Trainable, loss_and_grads
from tests.conftest import ARCHS
from tests.gradcheck import assert_grads_close, check_grads

TINY = dict(C=16, L=2, NH=2, NKV=1, HS=8, F=16, F_exp=8, V=270)


def packed_batch(V: int) -> SimpleNamespace:
    """One row holding two packed samples (positions restart, attention kept inside each) plus padding."""
    rng = np.random.default_rng(5)
    tokens = rng.integers(3, V, size=(2, 8))
    positions = np.array([[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5, 6, 7]])
    segments = np.array([[0, 0, 0, 0, 1, 1, 1, -1], [0, 0, 0, 0, 0, 0, 0, 0]])
    targets = np.full((2, 8), -1)
    targets[0, 1:3] = tokens[0, 2:4]  # sample 1 trains its last tokens, never across the boundary
    targets[0, 4:6] = tokens[0, 5:7]
    targets[1, 2:7] = tokens[1, 3:8]
    weights = np.where(targets >= 0, rng.uniform(0.2, 1.0, targets.shape), 0.0)
    return SimpleNamespace(
        tokens=tokens, positions=positions, segments=segments, targets=targets, weights=weights
    )


def _model(tmp_path, arch, seed=3):
    spec = SynthSpec.for_arch(arch, seed=seed, **TINY, **({"F_shexp": 32} if arch == "qwen2moe" else {}))
    return Model.load(write_model(tmp_path / f"{arch}.gguf", spec), dtype=np.float64)


def _router_margin(model, batch) -> float:
    """Smallest gap between the k-th and (k+1)-th router logit, so finite differences keep the routing."""
    from engine.model import layers

    gaps = []
    orig = layers.ops.route_forward

    def spy(logits, K, renorm, *options):
        s = np.sort(logits, axis=-1)[:, ::-1]
        gaps.append(float((s[:, K - 1] - s[:, K]).min()))
        return orig(logits, K, renorm, *options)

    layers.ops.route_forward = spy
    try:
        tr = Trainable.init(model, [], rank=2)
        loss_and_grads(model, tr, batch, backward=False)
    finally:
        layers.ops.route_forward = orig
    return min(gaps) if gaps else np.inf


@pytest.mark.parametrize("arch", ARCHS + ("mixtral",))
def test_every_lora_kind_and_full_weights_match_finite_differences(arch, tmp_path):
    real_arch = "llama" if arch == "mixtral" else arch
    extra = {"E": 4, "K": 2, "F": 0} if arch == "mixtral" else {}
    spec = SynthSpec.for_arch(
        real_arch, seed=3, **{**TINY, **extra}, **({"F_shexp": 32} if real_arch == "qwen2moe" else {})
    )
    model = Model.load(write_model(tmp_path / "m.gguf", spec), dtype=np.float64)
    batch = packed_batch(model.config.V)
    if model.config.is_moe:
        assert _router_margin(model, batch) > 1e-3
    # every tensor that can take LoRA, embedding and output included
    targets = [c.name for c in lora_candidates(model.tensors) if c.lora_ok]
    # full-weight: norms, biases, the shared-expert gate and (MoE) the expert stacks of layer 1
    full_kinds = (
        "attn_norm",
        "ffn_norm",
        "output_norm",
        "attn_q_norm",
        "attn_k_norm",
        "attn_q.bias",
        "ffn_gate_inp_shexp",
        "blk.1.ffn_*_exps.weight",
    )
    present = [
        k
        for k in full_kinds
        if any(c.kind == k or fnmatch(c.name, k) for c in lora_candidates(model.tensors))
    ]
    full = select_full(model.tensors, tuple(present), model.config.L)
    assert "output_norm.weight" in full and "blk.0.attn_norm.weight" in full
    tr = Trainable.init(model, targets, rank=2, alpha=4.0, full=full, seed=1)
    rng = np.random.default_rng(2)
    for _, B in tr.pairs.values():
        B[...] = 0.3 * rng.standard_normal(B.shape)  # non-zero B so that A gets a gradient too
    res = loss_and_grads(model, tr, batch)
    params = tr.params()
    assert set(res.grads) == set(params)

    def f():
        return loss_and_grads(model, tr, batch, backward=False).loss

    errors = check_grads(f, params, res.grads, max_entries=6, eps=1e-6)
    assert_grads_close(errors, tol=1e-5)
    kinds = {split_name(n.removesuffix(".lora_a").removesuffix(".lora_b"))[1] for n in params}
    assert {"attn_k", "attn_v", "token_embd", "attn_norm", "output_norm"} <= kinds
    if model.config.is_moe:
        assert {"ffn_gate_inp", "ffn_up_exps", "ffn_down_exps"} <= kinds
        assert res.expert_counts.shape == (model.config.L, model.config.E)
        assert res.expert_counts.sum() == model.config.L * batch.tokens.size * model.config.K
    # no parameter is left without gradient signal: K/V, router and experts all learn
    for name in params:
        assert np.abs(res.grads[name]).max() > 0, f"{name} got a zero gradient"


@pytest.mark.parametrize("arch", ["llama", "qwen2moe"])
def test_checkpointing_gives_the_same_gradients(arch, tmp_path):
    model = _model(tmp_path, arch)
    batch = packed_batch(model.config.V)
    targets = select_targets(model.tensors, TargetSpec(preset="all"), model.config.L)
    tr = Trainable.init(model, targets, rank=2, seed=1)
    for _, B in tr.pairs.values():
        B[...] = 0.1
    a = loss_and_grads(model, tr, batch)
    b = loss_and_grads(model, tr, batch, checkpoint=True)
    assert a.loss == b.loss
    for n in a.grads:
        np.testing.assert_array_equal(a.grads[n], b.grads[n])


def test_kl_term_gradient(tmp_path):
    model = _model(tmp_path, "qwen3")
    batch = packed_batch(model.config.V)
    batch.weights = np.where(
        batch.targets >= 0, np.random.default_rng(0).uniform(-1, 1, batch.targets.shape), 0
    )
    tr = Trainable.init(
        model, select_targets(model.tensors, TargetSpec(preset="attention"), 2), rank=2, seed=1
    )
    for _, B in tr.pairs.values():
        B[...] = 0.2
    res = loss_and_grads(model, tr, batch, kl_coef=0.5)
    errors = check_grads(
        lambda: loss_and_grads(model, tr, batch, backward=False, kl_coef=0.5).loss,
        tr.params(),
        res.grads,
        max_entries=6,
    )
    assert_grads_close(errors, tol=1e-5)
    # with B = 0 the adapter is off: the policy equals the reference and the KL term vanishes
    for _, B in tr.pairs.values():
        B[...] = 0.0
    assert loss_and_grads(model, tr, batch, kl_coef=0.5, backward=False).loss == pytest.approx(
        loss_and_grads(model, tr, batch, kl_coef=0.0, backward=False).loss, abs=1e-12
    )


def test_fresh_adapter_leaves_the_model_unchanged(tmp_path):
    model = _model(tmp_path, "olmoe")
    tr = Trainable.init(model, select_targets(model.tensors, TargetSpec(preset="all"), 2), rank=4, seed=0)
    tokens = np.array([1, 5, 9, 260])
    np.testing.assert_array_equal(model.forward(tokens, lora=tr.terms()), model.forward(tokens))
