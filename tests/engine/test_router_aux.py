"""The Switch Transformer load-balancing loss (engine.model.layers.load_balance, TrainConfig.router_aux_coef):
its value is E * sum_e f_e P_e per MoE layer, summed over the layers; its gradient through the router
logits into a LoRA and a fully trained router matches central differences in float64."""

from __future__ import annotations

import numpy as np
import pytest

from engine.model import layers
from engine.model.model import Model
from engine.testing import SynthSpec, write_model
from engine.train.train_model import Trainable, loss_and_grads
from tests.engine.test_grad_model import TINY, _router_margin, packed_batch
from tests.gradcheck import assert_grads_close, check_grads

COEF = 0.7


def _model(tmp_path, arch="qwen2moe") -> Model:
    spec = SynthSpec.for_arch(arch, seed=11, **TINY, **({"F_shexp": 16} if arch == "qwen2moe" else {}))
    return Model.load(write_model(tmp_path / f"{arch}.gguf", spec), dtype=np.float64)


def _router_trainable(model) -> Trainable:
    """A LoRA on layer 0's router and layer 1's router trained in full (and the experts' LoRA)."""
    tr = Trainable.init(model, ["blk.0.ffn_gate_inp.weight", "blk.1.ffn_up_exps.weight"], rank=2, seed=1,
                        full=["blk.1.ffn_gate_inp.weight"])  # fmt: skip
    rng = np.random.default_rng(2)
    for _, B in tr.pairs.values():  # not one value: a router LoRA adding the same to every logit changes
        B[...] = rng.uniform(-0.5, 0.5, B.shape)  # no softmax, so its A would get no gradient at all
    return tr


@pytest.mark.parametrize("arch", ["qwen2moe", "olmoe"])
def test_load_balancing_gradient_matches_finite_differences(tmp_path, arch):
    model = _model(tmp_path, arch)
    batch = packed_batch(model.config.V)
    assert _router_margin(model, batch) > 1e-4  # central differences keep the routing
    tr = _router_trainable(model)
    res = loss_and_grads(model, tr, batch, router_aux_coef=COEF)
    plain = loss_and_grads(model, tr, batch)
    assert res.router_aux is not None and plain.router_aux is None
    assert res.loss == pytest.approx(plain.loss + res.router_aux, rel=1e-12)
    # the aux term changes the router's gradients
    assert not np.allclose(res.grads["blk.1.ffn_gate_inp.weight"], plain.grads["blk.1.ffn_gate_inp.weight"])
    errors = check_grads(
        lambda: loss_and_grads(model, tr, batch, backward=False, router_aux_coef=COEF).loss,
        tr.params(), res.grads, max_entries=12,
    )  # fmt: skip
    assert_grads_close(errors, tol=1e-5)
    # layer checkpointing recomputes the blocks: the same gradients
    ck = loss_and_grads(model, tr, batch, router_aux_coef=COEF, checkpoint=True)
    for n, g in res.grads.items():
        np.testing.assert_allclose(ck.grads[n], g, rtol=1e-9, atol=1e-12)


def test_load_balancing_value_is_switch_transformers(tmp_path, monkeypatch):
    """E * sum_e f_e P_e per layer from the logits and choices the blocks made, summed over layers."""
    model = _model(tmp_path, "olmoe")
    batch = packed_batch(model.config.V)
    seen = []
    real = layers.ops.route_forward

    def spy(logits, K, *rest):
        routing, cache = real(logits, K, *rest)
        seen.append((np.array(logits), np.array(routing.topk)))
        return routing, cache

    monkeypatch.setattr(layers.ops, "route_forward", spy)
    res = loss_and_grads(model, _router_trainable(model), batch, backward=False, router_aux_coef=COEF)
    E = model.config.E
    expected = 0.0
    for logits, topk in seen:
        f = np.bincount(topk.ravel(), minlength=E) / topk.size
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        expected += COEF * E * float((f * p.mean(0)).sum())
    assert len(seen) == model.config.L
    assert res.router_aux == pytest.approx(expected, rel=1e-12)
    # perfectly even routing and uniform probabilities give exactly the coefficient
    routing = layers.ops.Routing(None, np.tile(np.arange(4), (2, 1)).reshape(4, 2), None, None,
                                 np.array([0, 2, 4, 6, 8]))  # fmt: skip
    value, d = layers.load_balance(np.zeros((4, 4)), routing, COEF)
    assert value == pytest.approx(COEF) and np.allclose(d, 0)


def test_training_reports_the_load_balancing_loss_per_step(tmp_path, caplog, capsys):
    from engine.cli.main import main
    from engine.model.targets import TargetSpec
    from engine.train import events as ev
    from engine.train.trainer import TrainConfig, Trainer
    from tests.engine.test_census import _data

    path = write_model(tmp_path / "m.gguf", SynthSpec.for_arch("qwen3moe", L=2, seed=4))
    data = _data(tmp_path / "d.jsonl", 6)
    base = dict(
        rank=2, lr=1e-2, steps=2, n_ctx=64, prompt_format="raw", data_cache="off", router_aux_coef=0.1
    )
    router = TargetSpec(preset="none", patterns=("ffn_gate_inp", "ffn_up_exps"))
    trainer = Trainer(path, data, TrainConfig(targets=router, **base))
    trainer.start()
    steps = [trainer.train_step() for _ in range(2)]
    for s in steps:
        assert isinstance(s, ev.Step) and s.router_aux is not None
        assert 0.1 * 0.99 <= s.router_aux <= 0.1 * 4  # coef * (1 .. E) per layer: 2 layers, E = 4
        assert s.router_aux < s.loss
        back = ev.event_from_json(ev.event_to_json(s))
        assert back.router_aux == pytest.approx(s.router_aux)
    # no router trained: the coefficient is not used, and it says so
    attn = Trainer(path, data, TrainConfig(targets=TargetSpec(preset="attention"), **base))
    attn.start()
    assert attn.train_step().router_aux is None
    assert "trains no MoE router" in caplog.text
    # the CLI's option, into the events file
    events = tmp_path / "events.jsonl"
    argv = ["train", path, data, "--targets", "ffn_gate_inp", "--steps", "1", "--ctx", "64", "--rank", "2",
            "--router-aux-coef", "0.05", "--events", str(events), "--out", str(tmp_path / "a")]  # fmt: skip
    assert main(argv) == 0
    got = [ev.event_from_json(line) for line in events.read_text().splitlines()]
    (step,) = [e for e in got if isinstance(e, ev.Step)]
    assert step.router_aux is not None and step.router_aux > 0
    assert main(argv[:-6] + ["--router-aux-coef", "-1", "--out", str(tmp_path / "b.gguf")]) == 2
    assert "--router-aux-coef must be in [0, 1000]" in capsys.readouterr().err
