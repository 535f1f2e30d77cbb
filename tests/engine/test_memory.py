"""The memory plan of a run: what holds the bytes, the automatic choices, and refusing what cannot fit."""

from __future__ import annotations

import numpy as np
import pytest

import engine.train.memory as memory_mod
from engine import Failed, TrainConfig, Trainer, estimate_memory
from engine.io.gguf_file import GGUFFile
from engine.model.archs import ModelConfig
from engine.testing import SynthSpec, write_model

GIB = 2**30


@pytest.fixture(scope="module")
def q8_moe(tmp_path_factory):
    spec = SynthSpec.for_arch("qwen3moe", C=64, F_exp=64, V=300, qtype="Q8_0")
    f = GGUFFile(write_model(tmp_path_factory.mktemp("mem") / "q8.gguf", spec))
    return ModelConfig.from_gguf(f), f.tensors


def test_parts_add_up_and_follow_the_settings(q8_moe):
    cfg, tensors = q8_moe
    base = estimate_memory(
        cfg,
        tensors,
        1000,
        TrainConfig(n_ctx=256, checkpoint_layers="off", cache_budget="off"),
        available=8 * GIB,
    )
    assert base.stored == sum(t.n_bytes for t in tensors.values())
    assert base.trainable == 1000 * 4 * memory_mod.TRAINABLE_COPIES and base.gradients == 4000
    assert base.cache == 0 and base.buffers > 0  # cache off: one layer's working set and head blocks
    assert base.total == max(base.gradients, base.activations) + sum(
        getattr(base, k) for k in ("mapped", "cache", "buffers", "trainable", "transient", "head", "runtime")
    )
    d = base.to_dict()
    assert d["total"] == base.total and d["weights"] == base.mapped + base.cache + base.buffers
    assert base.mapped < base.stored  # quantized tensors are let go once dequantized
    ckpt = estimate_memory(
        cfg, tensors, 1000, TrainConfig(n_ctx=256, checkpoint_layers="on"), available=8 * GIB
    )
    longer = estimate_memory(
        cfg, tensors, 1000, TrainConfig(n_ctx=1024, checkpoint_layers="off"), available=8 * GIB
    )
    assert ckpt.activations < base.activations < longer.activations
    cached = estimate_memory(cfg, tensors, 1000, TrainConfig(cache_budget="1G"), available=8 * GIB)
    assert cached.cache == cached.dequantized and cached.buffers == 0  # the whole model fits the cache


def test_auto_choices_follow_what_is_free(q8_moe):
    cfg, tensors = q8_moe
    config = TrainConfig(n_ctx=4096, batch_size=8)  # auto checkpointing, auto budget
    roomy = estimate_memory(cfg, tensors, 1000, config, available=64 * GIB)
    tight_avail = roomy.required - roomy.activations // 2 + memory_mod.auto_headroom_for(64 * GIB)
    tight = estimate_memory(cfg, tensors, 1000, config, available=tight_avail)
    assert not roomy.checkpoint and tight.checkpoint
    assert roomy.cache == roomy.dequantized  # plenty of room: every weight stays dequantized
    assert tight.budget < roomy.budget


def test_a_run_that_cannot_fit_says_what_to_change(q8_moe):
    cfg, tensors = q8_moe
    est = estimate_memory(cfg, tensors, 1000, TrainConfig(n_ctx=8192, batch_size=16), available=GIB // 4)
    assert not est.fits()
    msg = est.advice(TrainConfig(n_ctx=8192, batch_size=16))
    assert "GiB" in msg and "8192" in msg and "batch" in msg


def test_trainer_refuses_before_dequantizing_anything(tmp_path, chats, monkeypatch):
    path = write_model(tmp_path / "m.gguf", SynthSpec.for_arch("llama", qtype="Q8_0"))
    monkeypatch.setattr(memory_mod, "memory_available", lambda: 32 << 20)
    events = []
    trainer = Trainer(path, chats, TrainConfig(n_ctx=128, steps=2))
    result = trainer.run(events.append)
    assert isinstance(result, Failed) and "free" in result.message and "GiB" in result.message
    assert trainer.model.weights.stats.misses == 0  # no weight was dequantized


def test_plan_sets_the_budget_and_checkpointing_of_the_run(tmp_path, chats):
    path = write_model(tmp_path / "m.gguf", SynthSpec.for_arch("llama", qtype="Q8_0"))
    trainer = Trainer(path, chats, TrainConfig(n_ctx=64, steps=1, cache_budget="3M", checkpoint_layers="on"))
    events = []
    trainer.run(events.append)
    plan = events[0].plan
    assert plan.memory_bytes["budget"] == 3 << 20 and plan.memory_bytes["checkpoint"] == 1
    assert trainer.model.weights.budget == 3 << 20
    assert trainer.memory.checkpoint


@pytest.mark.parametrize("value,stored", [(True, "on"), (False, "off"), (None, "auto"), ("on", "on")])
def test_checkpoint_setting_accepts_older_booleans(value, stored):
    assert TrainConfig(checkpoint_layers=value).checkpoint_layers == stored


def test_bad_runtime_settings_are_refused():
    from engine import EngineError

    with pytest.raises(EngineError, match="checkpoint_layers"):
        TrainConfig(checkpoint_layers="sometimes")
    with pytest.raises(EngineError, match="budget"):
        TrainConfig(cache_budget="plenty")
    with pytest.raises(EngineError, match="device"):
        TrainConfig(device="tpu")
    assert np.isfinite(1.0)
