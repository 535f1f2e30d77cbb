"""The GPU path of the engine, end to end, on the kernel emulator: no GPU needed.

A `Backend` whose runtime is tests/kernels/emu_runtime.EmuRuntime is what a CUDA backend is, with
NumPy arrays for device memory and every kernel built by g++ and run on the CPU. So these tests run
the device code of the whole engine as a GPU run would: the weights uploaded as the file stores
them and dequantized to bf16 by the dequant kernels, every op through its CUDA twin's host code
(`<op>_on`), the MoE kernels, the fused head and loss, the multi-tensor AdamW, generation with the
KV cache in device memory, checkpoints and resume. They compare against the CPU path (float32
references; the device multiplies bf16 weights with fp32 accumulation, hence the tolerances).
What they cannot show: CuPy's behaviour, the GPU compiler's code, timing (bench/gpu_check.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.backend import Backend
from engine.errors import ModelError
from engine.model.generate import GREEDY, generate
from engine.model.model import Model
from engine.model.targets import TargetSpec
from engine.train import events as ev
from engine.train.reward_session import RewardConfig, RewardSession
from engine.train.trainer import TrainConfig, Trainer
from tests.kernels.emulate import compiler

pytestmark = pytest.mark.skipif(compiler() is None, reason="the kernel emulator needs g++")


@pytest.fixture(scope="module")
def emulated() -> Backend:
    from tests.kernels.emu_runtime import EmuRuntime

    rt = EmuRuntime()
    return Backend("emulated", rt.xp, "", rt)


def _run(model, chats, cfg, **kw):
    got: list = []
    Trainer(model, chats, cfg, **kw).run(got.append, lambda: False)
    return got


def _config(tmp_path, **changes) -> TrainConfig:
    base = dict(
        targets=TargetSpec(preset="all"), rank=4, alpha=8, lr=5e-3, steps=3, n_ctx=48, schedule="constant",
        checkpoint_every=2, checkpoint_dir=str(tmp_path / "ckpt"), out=str(tmp_path / "adapter.gguf"),
        norms_every=1,
    )  # fmt: skip
    base.update(changes)
    return TrainConfig(**base)


def test_weights_stay_quantized_on_the_device_and_logits_match_the_cpu(synth_model, emulated):
    path = synth_model("llama", seed=31, qtype="Q8_0")
    cpu, dev = Model.load(path), Model.load(path, backend=emulated)
    W = dev.weights
    assert {W.infos[n].qtype for n in W._raw} == {"Q8_0"}
    assert W.stored_bytes < W.dequantized_bytes  # at rest: the file's blocks, not bf16 copies
    assert W["blk.0.attn_q.weight"].dtype == np.uint16  # bf16 bits, dequantized on use
    assert W["blk.0.attn_norm.weight"].dtype == np.float32
    tokens = np.array([1, 7, 42, 99, 3, 250, 17, 8])
    a, b = cpu.forward(tokens), dev.forward(tokens)
    assert isinstance(b, np.ndarray) and b.shape == a.shape
    assert np.linalg.norm(b - a) / np.linalg.norm(a) < 2e-2  # bf16 weights, fp32 accumulation
    assert (b.argmax(-1) == a.argmax(-1)).mean() >= 0.75


@pytest.mark.parametrize(
    "arch,checkpoint", [("llama", "on"), pytest.param("qwen2moe", "off", id="qwen2moe-shared-expert")]
)
def test_training_on_the_device_follows_the_cpu(synth_model, emulated, chats, tmp_path, arch, checkpoint):
    path = synth_model(arch, seed=32)
    cfg = _config(tmp_path / "cpu", checkpoint_layers=checkpoint)
    cpu = _run(Model.load(path), chats, cfg)
    dev_cfg = _config(tmp_path / "dev", checkpoint_layers=checkpoint)
    dev = _run(Model.load(path, backend=emulated), chats, dev_cfg)
    assert isinstance(dev[-1], ev.Finished), dev[-1]
    a = [e for e in cpu if isinstance(e, ev.Step)]
    b = [e for e in dev if isinstance(e, ev.Step)]
    assert [e.step for e in b] == [1, 2, 3]
    for x, y in zip(a, b, strict=True):
        assert isinstance(y.loss, float) and isinstance(y.grad_norm, float)  # events carry host data
        assert abs(x.mean_ce - y.mean_ce) <= 2e-2 * abs(x.mean_ce)
        assert abs(x.grad_norm - y.grad_norm) <= 5e-2 * x.grad_norm
    assert b[-1].mean_ce < b[0].mean_ce  # it learns
    norms = [e for e in dev if isinstance(e, ev.LoraNorms)]
    assert norms and all(isinstance(v, float) for v in norms[-1].per_tensor.values())
    if arch == "qwen2moe":
        usage = [e for e in dev if isinstance(e, ev.ExpertUsage)]
        assert usage and isinstance(usage[0].counts, np.ndarray) and usage[0].counts.sum() > 0
    # the adapter written from the device reloads on the CPU and acts like the CPU run's
    from engine.model.lora import LoraAdapter

    host = Model.load(path)
    ad_dev = LoraAdapter.load(str(tmp_path / "dev" / "adapter.gguf"), host)
    ad_cpu = LoraAdapter.load(str(tmp_path / "cpu" / "adapter.gguf"), host)
    assert set(ad_dev.pairs) == set(ad_cpu.pairs)
    tokens = np.array([1, 30, 31, 32, 33, 34, 35, 36])
    z0 = host.forward(tokens)
    z_cpu = host.forward(tokens, lora=ad_cpu.terms())
    z_dev = host.forward(tokens, lora=ad_dev.terms())
    effect = np.linalg.norm(z_cpu - z0)
    print(f"adapter effect {effect:.4f}, device vs cpu {np.linalg.norm(z_dev - z_cpu):.4f}")
    assert effect > 0 and np.linalg.norm(z_dev - z_cpu) <= 0.15 * effect


MLA = dict(HS=40, n_rot=8, HS_v=32, kv_lora_rank=32, q_lora_rank=32)  # Q8_0 rows: 32-value blocks


@pytest.mark.parametrize(
    "arch,overrides,full",
    [
        ("gemma3", {}, ()),
        ("gpt-oss", {"expert_qtype": "MXFP4"}, ("blk.*.attn_sinks.weight", "blk.*.ffn_*_exps.bias")),
        (
            "deepseek2",
            dict(E=8, gating=2, probs_bias=True, n_group=4, group_used=2, moe_renorm=True, **MLA),
            (),
        ),
    ],
    ids=["gemma3", "gpt-oss-mxfp4", "deepseek-v3"],
)
def test_the_newer_families_train_on_the_device_as_on_the_cpu(
    synth_model, emulated, chats, tmp_path, arch, overrides, full
):
    """Gemma 3 (sliding windows, GEGLU, soft-capped logits), gpt-oss (sinks, biases, clamped SwiGLU,
    MXFP4 experts, its sinks and expert biases trained in full) and DeepSeek-V3 (MLA with q compression,
    sigmoid routing with a selection bias and group limits) take every op on the device's twins (none
    is refused) and follow the CPU's losses and gradient norms."""
    path = synth_model(arch, seed=33, qtype="Q8_0", **overrides)
    cfg = dict(steps=2, checkpoint_every=0, out="", norms_every=0, full=full)
    cpu = _run(Model.load(path), chats, _config(tmp_path / "cpu", **cfg))
    dev = _run(Model.load(path, backend=emulated), chats, _config(tmp_path / "dev", **cfg))
    assert isinstance(dev[-1], ev.Finished), dev[-1]
    a = [e for e in cpu if isinstance(e, ev.Step)]
    b = [e for e in dev if isinstance(e, ev.Step)]
    assert len(a) == len(b) == 2
    for x, y in zip(a, b, strict=True):
        assert abs(x.mean_ce - y.mean_ce) <= 2e-2 * abs(x.mean_ce)
        assert abs(x.grad_norm - y.grad_norm) <= 5e-2 * x.grad_norm


def test_device_run_resumes_exactly_from_its_checkpoint(synth_model, emulated, chats, tmp_path):
    path = synth_model("qwen3", seed=33)
    model = Model.load(path, backend=emulated)
    whole = _run(model, chats, _config(tmp_path / "a", steps=4))
    part = _run(
        model, chats, _config(tmp_path / "b", steps=4), resume=str(tmp_path / "a" / "ckpt" / "ckpt-000002")
    )
    last_whole = [e for e in whole if isinstance(e, ev.Step)][-1]
    last_part = [e for e in part if isinstance(e, ev.Step)][-1]
    assert [e.step for e in part if isinstance(e, ev.Step)] == [3, 4]
    assert last_part.loss == pytest.approx(last_whole.loss, rel=1e-6)


def test_generation_and_reward_steps_on_the_device(synth_model, emulated, tmp_path):
    path = synth_model("qwen3moe", seed=34)
    cpu, dev = Model.load(path), Model.load(path, backend=emulated)
    prompt = [1, 40, 41, 42, 43]
    sampling = replace(GREEDY, max_new_tokens=4)
    [g_dev] = generate(dev, prompt, sampling=sampling)
    assert len(g_dev.tokens) == 4
    # the cached decode on the device equals a full forward pass on the device
    full = dev.forward(np.array(prompt + list(g_dev.tokens[:-1])))
    assert list(full[len(prompt) - 1 :].argmax(-1)) == list(g_dev.tokens)
    del cpu
    session = RewardSession(
        dev, targets=TargetSpec(preset="attention"), rank=4, ratings_path=str(tmp_path / "r.jsonl"),
        config=RewardConfig(n_ctx=64, lr=1e-2, max_new_tokens=3, temperature=1.0),
        checkpoint_dir=str(tmp_path / "rs"),
    )  # fmt: skip
    answers = session.generate("hello there", n=2, seed=1)
    assert len(answers) == 2
    session.rate(0, 1.0)
    session.rate(1, -1.0)
    result = session.apply()
    assert result.applied and np.isfinite(result.loss)
    resumed = RewardSession(dev, adapter=session._checkpoint[0], ratings_path=str(tmp_path / "r.jsonl"))
    assert resumed.step == 1


def test_a_corrupt_tensor_is_named_on_the_device_too(tmp_path, emulated):
    from engine.testing import SynthSpec, random_weights, write_model

    spec = SynthSpec.for_arch("llama", seed=35)
    weights = random_weights(spec)
    weights["blk.1.attn_k.weight"][3, 5] = np.nan
    path = write_model(tmp_path / "nan.gguf", spec, weights=weights)
    model = Model.load(path, backend=emulated)
    with pytest.raises(ModelError, match="blk.1.attn_k.weight"):
        model.forward(np.array([1, 2, 3]))


def test_vectors_and_biases_of_any_stored_type_are_float32_on_the_device(tmp_path, emulated):
    """gpt-oss's (E, F) expert biases are matrices by shape but vectors by role; norms stored F16 or
    BF16 (as some conversions write them) are read as float32, the values the CPU reads."""
    from engine.io.gguf_write import write_gguf
    from engine.testing import SynthSpec, model_metadata, random_weights

    spec = SynthSpec.for_arch("gpt-oss", seed=36)
    weights = random_weights(spec)
    types = {n: ("F32" if a.ndim < 2 or n.endswith(".bias") else "F16") for n, a in weights.items()}
    types["blk.0.attn_norm.weight"] = "F16"
    types["blk.1.attn_norm.weight"] = "BF16"
    path = write_gguf(
        tmp_path / "m.gguf", spec.arch, model_metadata(spec), {n: (a, types[n]) for n, a in weights.items()}
    )
    cpu, dev = Model.load(path), Model.load(path, backend=emulated)
    for name in (
        "blk.0.attn_norm.weight",
        "blk.1.attn_norm.weight",
        "blk.0.ffn_gate_exps.bias",
        "blk.0.attn_sinks.weight",
    ):
        got = dev.weights[name]
        assert got.dtype == np.float32 and got.shape == cpu.weights.infos[name].shape, name
        np.testing.assert_array_equal(got, cpu.weights.dense(name))
    assert dev.weights["blk.0.ffn_gate_exps.weight"].dtype == np.uint16  # the stacks: bf16 bits, on use
