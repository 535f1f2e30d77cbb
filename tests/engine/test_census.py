"""The routing census (engine.train.census): its counts equal the routing the model's own forward pass
does, sample by sample; it is cached, reused without running the model, and counted again when the
dataset changes; the CLI prints it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.cli.main import main
from engine.errors import ModelError
from engine.model import layers
from engine.model.model import Model
from engine.testing import SynthSpec, write_model
from engine.train import census as census_mod
from engine.train.census import CensusCancelled, routing_census
from engine.train.encode import EncodeOptions

OPTIONS = EncodeOptions(64, prompt_format="raw")


def _moe_model(tmp_path, arch="qwen2moe", **kw) -> str:
    spec = SynthSpec.for_arch(arch, L=2, seed=3, **kw)
    return write_model(tmp_path / f"{arch}.gguf", spec)


def _data(path, n: int, salt: str = "") -> str:
    rows = [
        {"prompt": f"question {i}{salt} about {i * 7 % 13}", "response": f"answer {i * 3} ok{salt}"}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def captured(monkeypatch):
    """Every routing the MoE blocks do, as (layer, topk) pairs."""
    seen: list[tuple[int, np.ndarray]] = []
    real = layers._moe_forward

    def spy(cfg, W, lora, i, h, *rest):
        y, cache = real(cfg, W, lora, i, h, *rest)
        seen.append((i, np.asarray(cache.routing.topk).copy()))
        return y, cache

    monkeypatch.setattr(layers, "_moe_forward", spy)
    return seen


def _direct_count(model: Model, data: str, seen: list) -> tuple[np.ndarray, int]:
    """Each prepared sample alone through Model.forward (no packing), counting the top-k choices its
    MoE blocks made: (n_moe_layers, E) and the tokens."""
    from engine.text.chat_template import template_for
    from engine.text.tokenizer import Tokenizer
    from engine.train.prepared import prepare_data

    prepared = prepare_data(data, Tokenizer.from_metadata(model.metadata, model.path),
                            template_for(model.metadata, None), OPTIONS)  # fmt: skip
    moe = [i for i, m in enumerate(model.moe_layers) if m]
    counts = np.zeros((len(moe), model.config.E), np.int64)
    n = 0
    for k in range(len(prepared)):
        tokens = prepared.encoded(k).tokens
        seen.clear()
        model.forward(tokens)
        assert [i for i, _ in seen] == moe
        for row, (_, topk) in enumerate(seen):
            assert topk.shape == (len(tokens), model.config.K)
            counts[row] += np.bincount(topk.ravel(), minlength=model.config.E)
        n += len(tokens)
    prepared.close()
    seen.clear()
    return counts, n


@pytest.mark.parametrize("arch", ["qwen2moe", "deepseek2"])
def test_census_equals_the_routing_the_forward_pass_did(tmp_path, captured, arch):
    kw = {"n_group": 2, "group_used": 1, "probs_bias": True, "gating": 2} if arch == "deepseek2" else {}
    model = Model.load(_moe_model(tmp_path, arch, **kw))
    data = _data(tmp_path / "d.jsonl", 23)
    expected, n_tokens = _direct_count(model, data, captured)
    progress = []
    c = routing_census(model, data, None, OPTIONS, cache=tmp_path / "census", data_cache=tmp_path / "prep",
                       window=40, on_progress=progress.append)  # fmt: skip
    assert c.layers == tuple(i for i, m in enumerate(model.moe_layers) if m)
    assert c.counts.dtype == np.int64 and c.counts.shape == (len(c.layers), model.config.E)
    np.testing.assert_array_equal(c.counts, expected)
    assert c.n_tokens == n_tokens and c.n_samples == 23 and not c.reused
    assert (c.counts.sum(axis=1) == model.config.K * n_tokens).all()
    assert progress[-1].phase == "routing" and progress[-1].done == progress[-1].total == n_tokens
    assert len([p for p in progress if p.phase == "routing"]) > 3  # windows of 40 tokens: several steps


def test_census_is_cached_reused_and_counted_again_when_the_data_changes(tmp_path, captured):
    path = _moe_model(tmp_path)
    data = _data(tmp_path / "d.jsonl", 12)
    kw = dict(cache=tmp_path / "census", data_cache=tmp_path / "prep")
    first = routing_census(path, data, None, OPTIONS, **kw)
    assert captured and not first.reused
    captured.clear()
    again = routing_census(path, data, None, OPTIONS, **kw)
    assert again.reused and not captured  # the model did not run
    np.testing.assert_array_equal(again.counts, first.counts)
    assert (again.layers, again.n_tokens, again.n_samples) == (first.layers, first.n_tokens, first.n_samples)
    _data(tmp_path / "d.jsonl", 12, salt="x")  # the same file, other content
    changed = routing_census(path, data, None, OPTIONS, **kw)
    assert not changed.reused and captured
    assert changed.n_tokens != first.n_tokens or not np.array_equal(changed.counts, first.counts)
    # a damaged cache entry is never trusted: counted again, the same result
    for entry in (tmp_path / "census").glob("*.npz"):
        entry.write_bytes(entry.read_bytes()[:100])
    captured.clear()
    redone = routing_census(path, data, None, OPTIONS, **kw)
    assert not redone.reused and captured
    np.testing.assert_array_equal(redone.counts, changed.counts)


def test_census_cancel_and_dense_model(tmp_path):
    path = _moe_model(tmp_path)
    data = _data(tmp_path / "d.jsonl", 12)
    with pytest.raises(CensusCancelled):
        routing_census(path, data, None, OPTIONS, cache=tmp_path / "census", data_cache=None,
                       window=16, cancelled=lambda: True)  # fmt: skip
    assert not list((tmp_path / "census").glob("*.npz"))  # nothing cached
    dense = write_model(tmp_path / "dense.gguf", SynthSpec.for_arch("llama", L=1))
    with pytest.raises(ModelError, match="no MoE layer"):
        routing_census(dense, data, None, OPTIONS, cache=None, data_cache=None)


def test_unreached_experts():
    c = census_mod.Census(np.array([[3, 0, 5, 2], [0, 10, 0, 0]], np.int64), (1, 3), 5, 2, 2)
    assert c.unreached() == [(1, 1), (3, 0), (3, 2), (3, 3)]
    assert c.unreached_mask().sum() == 4
    np.testing.assert_allclose(c.shares()[0], [0.3, 0, 0.5, 0.2])
    shapes = {"blk.1.ffn_up_exps.weight": (4, 32, 64), "blk.3.ffn_down_exps.weight": (4, 64, 32),
              "blk.3.attn_q.weight": (64, 64), "blk.2.ffn_up_exps.weight": (4, 32, 64)}  # fmt: skip
    out = census_mod.left_out(c, shapes, rank=2)
    assert {n: e.tolist() for n, e in out.frozen.items()} == {
        "blk.1.ffn_up_exps.weight": [1],
        "blk.3.ffn_down_exps.weight": [0, 2, 3],
    }
    assert (out.n_sets, out.n_total_sets, out.params) == (4, 8, 4 * 2 * (32 + 64))
    assert (
        out.describe()
        == "4 of 8 expert factor sets are never reached by this data: 768 parameters that would never learn"
    )


def test_cli_census(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TUNE_STUDIO_DATA", str(tmp_path / "app"))
    path = _moe_model(tmp_path)
    data = _data(tmp_path / "d.jsonl", 8)
    out = tmp_path / "census.json"
    assert main(["census", path, data, "--prompt-format", "raw", "--n-ctx", "64", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    got = json.loads(out.read_text())
    c = routing_census(path, data, None, OPTIONS)
    assert c.reused  # the CLI's census, from the app's cache folder
    assert got["counts"] == c.counts.tolist() and got["n_tokens"] == c.n_tokens
    assert f"layer {c.layers[0]}:" in text and "unreached" in text


def _model_with_unreached(tmp_path) -> tuple[str, list[tuple[int, int]]]:
    """A DeepSeek-V3-style model (one dense lead layer, two MoE layers, top-2 of 4, sigmoid gating) whose
    selection bias keeps experts 2 of layer 1 and 0, 3 of layer 2 from ever being chosen."""
    from engine.testing import random_weights

    spec = SynthSpec.for_arch("deepseek2", L=3, seed=5, gating=2, probs_bias=True)
    W = random_weights(spec)
    W["blk.1.exp_probs_b.bias"] = np.array([0, 0, -1e3, 0], np.float32)
    W["blk.2.exp_probs_b.bias"] = np.array([-1e3, 0, 0, -1e3], np.float32)
    return write_model(tmp_path / "v3.gguf", spec, W), [(1, 2), (2, 0), (2, 3)]


def test_training_leaves_out_unreached_experts(tmp_path):
    from engine.model.targets import TargetSpec
    from engine.train.trainer import TrainConfig, Trainer

    path, unreached = _model_with_unreached(tmp_path)
    data = _data(tmp_path / "d.jsonl", 10)
    c = routing_census(path, data, None, OPTIONS, cache=None, data_cache=None)
    assert c.unreached() == unreached
    experts = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    cfg = TrainConfig(
        targets=TargetSpec(preset="none", patterns=experts + ("attn_output",)), rank=2, lr=2e-2, steps=3,
        n_ctx=64, prompt_format="raw", weight_decay=0.1, skip_unreached_experts=True, data_cache="off",
    )  # fmt: skip
    trainer = Trainer(path, data, cfg)
    started = trainer.start()
    pairs = trainer.trainable.pairs
    init = {n: (A.copy(), B.copy()) for n, (A, B) in pairs.items()}
    r, C, F = (
        2,
        64,
        32,
    )  # rank, width, expert width: gate/up A (E, r, C) B (E, F, r); down A (E, r, F) B (E, C, r)
    per_expert = 2 * (r * C + F * r) + (r * F + C * r)
    assert trainer.frozen_params == 3 * per_expert
    full = sum(A.size + B.size for A, B in pairs.values())
    assert started.plan.trainable_params == full - 3 * per_expert
    for _ in range(3):
        trainer.train_step()
    for name, (A, B) in pairs.items():
        layer = int(name.split(".")[1])
        if name.endswith("_exps.weight"):
            for e in range(4):
                same = np.array_equal(A[e], init[name][0][e]) and np.array_equal(B[e], init[name][1][e])
                assert same == ((layer, e) in unreached), (name, e)
        else:
            assert not np.array_equal(B, init[name][1])
    # off: every expert's factors move (weight decay alone moves the unreached ones' A)
    cfg_off = TrainConfig(**{**cfg.__dict__, "skip_unreached_experts": False})
    off = Trainer(path, data, cfg_off)
    assert off.start().plan.trainable_params == full and off.frozen_params == 0
    off.train_step()
    A = off.trainable.pairs["blk.1.ffn_up_exps.weight"][0]
    assert not np.array_equal(A[2], init["blk.1.ffn_up_exps.weight"][0][2])
