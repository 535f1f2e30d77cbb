"""The fused training step with MoE layers (engine.train.moe_step inside engine.train.dense_step) on
the kernel emulator: no GPU needed.

A MoE model's fused step must train as the generic op-by-op path does (the reference), count the
tokens routed to each expert on the device (read once, at the step's end, with its scalars), replay
as a captured graph to the same bits as its eager run with no host read, upload or foreign
allocation inside, and launch a bounded number of operations a layer. Tiny models (2 layers, 4
experts, top-2): the emulator runs every kernel on the CPU.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from engine.testing import SynthSpec, write_model
from engine.train import events as ev
from tests.engine.test_dense_step import _steps, _trainer
from tests.kernels.emulate import compiler

pytestmark = pytest.mark.skipif(compiler() is None, reason="the kernel emulator needs g++")


ATTN = ("attn_q", "attn_k", "attn_v", "attn_output")
EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
SHARED = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
# device operations of a MoE layer's training step (attention included), counted on the emulator:
# 123 measured for qwen3moe and Mixtral (about 40 of them the array glue of the grouped-GEMM host code),
# plus the shared expert's 33 on qwen2moe (156); the bound leaves room for a few, not for a per-expert loop
MAX_OPS_PER_MOE_LAYER = {"qwen3moe": 130, "mixtral": 130, "qwen2moe": 165}


def _moe_model(tmp_path, arch: str, L: int = 2) -> str:
    """A tiny MoE model of `arch` ("mixtral": llama with experts)."""
    extra = {"E": 4, "K": 2, "F": 0} if arch == "mixtral" else {}
    spec = SynthSpec.for_arch("llama" if arch == "mixtral" else arch, L=L, seed=7, qtype="Q8_0", **extra)
    return write_model(tmp_path / f"{arch}-{L}.gguf", spec)


def _targets(arch: str) -> tuple[str, ...]:
    """Attention, router, routed experts (and the shared expert where the model has one)."""
    return ATTN + ("ffn_gate_inp",) + EXPERTS + (SHARED if arch == "qwen2moe" else ())


def _run(trainer, n: int):
    """n steps: their Step events and the expert counts each step reported."""
    steps, counts = [], []
    for _ in range(n):
        seen = []
        s = trainer.train_step(seen.append)
        assert isinstance(s, ev.Step), s
        steps.append(s)
        usage = [e for e in seen if isinstance(e, ev.ExpertUsage)]
        assert len(usage) == 1, seen
        counts.append(np.asarray(usage[0].counts))
    return steps, counts


# olmoe (q/k norm over the whole projection: a pass of its own) runs captured: its widening glue replays
# qwen3moe's and Mixtral's layers are checked by parts: their attention by the dense step's qwen3 and
# llama parity, their MoE layer (router, routed experts) by olmoe's and qwen2moe's here
@pytest.mark.parametrize("arch,mode", [("qwen2moe", "eager"), ("olmoe", "graph")])
def test_fused_moe_step_trains_as_the_generic_path(tmp_path, arch, mode):
    path = _moe_model(tmp_path, arch)
    generic, _ = _trainer(path, "generic", patterns=_targets(arch))
    fused, _ = _trainer(path, mode, patterns=_targets(arch))
    assert fused._fused_why is None and generic._fused is None
    (a, ca), (b, cb) = _run(generic, 3), _run(fused, 3)
    assert fused._fused is not None and fused._fused.moe is not None
    assert (fused._graph is not None) == (mode == "graph")
    for x, y in zip(a, b, strict=True):
        # bf16 router, attention and expert products against the generic path's fp32 LoRA and router
        assert abs(x.mean_ce - y.mean_ce) <= 5e-3 * x.mean_ce, (x.mean_ce, y.mean_ce)
        assert abs(x.grad_norm - y.grad_norm) <= 3e-2 * x.grad_norm, (x.grad_norm, y.grad_norm)
    assert b[-1].mean_ce < b[0].mean_ce
    # the same experts chosen: every real token's K choices counted, padding rows left out (a bf16
    # logit may tip a near tie to another expert: a few of the 2 x 64 x 2 choices a layer)
    K = fused.model.config.K
    for x, y, s in zip(ca, cb, b, strict=True):
        assert x.shape == y.shape == (2, 4) and y.dtype == np.int64
        assert (y.sum(axis=1) == K * s.tokens).all(), (y, s.tokens)
        assert np.abs(x - y).sum() <= 8, (x, y)
    # every factor moved as the reference's did (Adam's sign-like steps: see test_dense_step)
    params_a, params_b = generic.trainable.params(), fused.trainable.params()
    assert sorted(params_a) == sorted(params_b)
    assert any("exps" in n for n in params_b) and any("ffn_gate_inp" in n for n in params_b)
    for name in params_a:
        pa, pb = np.asarray(params_a[name]), np.asarray(params_b[name])
        assert np.linalg.norm(pa - pb) <= 0.2 * np.linalg.norm(pa), name


def test_moe_graph_replay_equals_the_eager_step_and_reads_the_host_once_a_step(tmp_path, caplog):
    path = _moe_model(tmp_path, "qwen2moe")
    eager, _ = _trainer(path, "eager", steps=4, patterns=_targets("qwen2moe"))
    graph, rt = _trainer(path, "graph", steps=4, patterns=_targets("qwen2moe"))
    with caplog.at_level(logging.WARNING, logger="engine.train.trainer"):
        a, ca = _run(eager, 4)
        _run(graph, 1)  # eager warm-up
        rt.reset()
        # captured (a host read, upload or unreplayable op inside would raise), then replayed
        b, cb = _run(graph, 3)
    assert "runs eagerly" not in caplog.text
    assert rt.counts.get("capture") == 1 and graph._graph.replays == 3  # the captured step runs as a replay
    assert "alloc" not in rt.counts  # the step's buffers are static; the MoE temporaries in the graph's pool
    assert rt.counts.get("launch", 0) == rt.counts.get("gemm", 0) == 0  # the replays ran everything
    assert rt.counts.get("read") == 3  # one a step: scalars and expert counts together
    assert rt.counts.get("upload") == 3 * 8  # the batch, its padding rows, the optimizer's coefficients
    for x, y in zip(a[1:], b, strict=True):
        assert (x.loss, x.grad_norm, x.mean_ce) == (y.loss, y.grad_norm, y.mean_ce)
    for x, y in zip(ca[1:], cb, strict=True):
        assert np.array_equal(x, y)
    for name, p in eager.trainable.params().items():
        assert np.array_equal(np.asarray(p), np.asarray(graph.trainable.params()[name])), name
    sa, sb = eager.optimizer.state_dict(), graph.optimizer.state_dict()
    assert sa["step_count"] == sb["step_count"] == 4
    assert all(np.array_equal(np.asarray(sa[k]), np.asarray(sb[k])) for k in sa if k.startswith(("m.", "v.")))


def test_the_expert_counts_of_more_than_eight_moe_layers_are_joined_inside_a_capture():
    """The counts join every MoE layer's top-k choices on the device without CuPy's joining of more
    than 8 small arrays, which uploads a table of their addresses: refused inside a capture (seen on
    an H200: the 12- and 48-layer Qwen3-30B-A3B shapes ran eagerly). The emulator refuses it too."""
    from engine.train.moe_step import MoeBlocks
    from tests.kernels.emu_runtime import EmuCaptureError, RecordingRuntime

    rt = RecordingRuntime()
    xp, Lm, N, K, E = rt.xp, 9, 6, 2, 4
    choices = [np.random.default_rng(j).integers(0, E, (N, K)).astype(np.int32) for j in range(Lm)]
    caches = [(xp.asarray(c), None, None) for c in choices]
    with pytest.raises(EmuCaptureError, match="stack of 9 arrays"), rt.capture():
        xp.stack([c[0] for c in caches])
    blocks = MoeBlocks.__new__(MoeBlocks)  # the buffers count() reads, as __init__ makes them
    blocks.step = type("Step", (), {"xp": xp})()
    blocks.topk, blocks.pad = xp.empty((Lm, N, K), xp.int32), xp.zeros(N, xp.int32)
    blocks.expert_ids, blocks.counts = xp.arange(E, dtype=xp.int32), xp.zeros((Lm, E), xp.float64)
    blocks.pad[N - 1] = E  # a padding row: its choices count for no expert
    with rt.capture() as graph:
        blocks.count([(c[0],) for c in caches])
    graph.replay()
    want = [np.bincount(c[: N - 1].ravel(), minlength=E) for c in choices]
    assert np.array_equal(np.asarray(blocks.counts), np.array(want, np.float64))


def _ops_per_step(tmp_path, arch: str, L: int, budget: str) -> int:
    trainer, rt = _trainer(_moe_model(tmp_path, arch, L=L), "eager", budget=budget, patterns=_targets(arch))
    _steps(trainer, 1)
    rt.reset()
    _steps(trainer, 1)
    assert trainer._fused is not None
    return rt.device_ops()


@pytest.mark.parametrize("arch", ["qwen2moe"])  # qwen3moe's layer is qwen2moe's without the shared expert
def test_a_moe_layer_costs_a_bounded_number_of_device_operations(tmp_path, arch):
    """A layer is the difference between a 2-layer and a 1-layer model; with the cache off (QLoRA at
    rest) every weight is dequantized again at each use (measured: 13 more on qwen3moe, 19 on
    qwen2moe)."""
    got = {}
    for budget in ("auto", "off"):
        (tmp_path / budget).mkdir()
        one, two = (_ops_per_step(tmp_path / budget, arch, L, budget) for L in (1, 2))
        got[budget] = two - one
        print(f"{arch} cache {budget}: {two - one} device operations a MoE layer, {2 * one - two} besides")
    assert got["auto"] <= MAX_OPS_PER_MOE_LAYER[arch]
    assert got["off"] <= MAX_OPS_PER_MOE_LAYER[arch] + 25


@pytest.mark.parametrize(
    "arch,why",
    [
        ("gemma3", "GELU FFN"),
        ("gpt-oss", "clamped-SwiGLU experts"),
        ("deepseek", "ungated shared experts"),
    ],
)
def test_moe_models_the_fused_step_cannot_take_say_why_once_and_train_generically(
    tmp_path, caplog, arch, why
):
    spec = SynthSpec.for_arch(arch, L=2, seed=7, qtype="Q8_0")
    path = write_model(tmp_path / f"{arch}.gguf", spec)
    with caplog.at_level(logging.INFO, logger="engine.train.trainer"):
        trainer, _ = _trainer(path, "graph", patterns=ATTN)
        _steps(trainer, 2)
    assert trainer._fused is None and why in trainer._fused_why
    said = [r for r in caplog.records if "generic op-by-op path" in r.getMessage()]
    assert len(said) == 1 and why in said[0].getMessage()


def test_tune_moe_step_0_takes_the_generic_step_and_says_so(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("TUNE_MOE_STEP", "0")
    with caplog.at_level(logging.INFO, logger="engine.train.trainer"):
        trainer, _ = _trainer(_moe_model(tmp_path, "qwen3moe"), "graph", patterns=_targets("qwen3moe"))
        _steps(trainer, 1)
    assert trainer._fused is None and "TUNE_MOE_STEP=0" in trainer._fused_why


def test_moe_cache_off_refills_the_expert_stacks_and_trains_the_same(tmp_path):
    """Cache off (QLoRA at rest): one set of expert, router and shared-expert buffers refilled at each
    use, forward and backward; the same bf16 weights as the dequantized-once buffers, so the same bits."""
    path = _moe_model(tmp_path, "qwen2moe")
    auto, _ = _trainer(path, "eager", budget="auto", patterns=_targets("qwen2moe"))
    off, _ = _trainer(path, "eager", budget="off", patterns=_targets("qwen2moe"))
    (a, ca), (b, cb) = _run(auto, 2), _run(off, 2)
    assert auto._fused.persistent and not off._fused.persistent and off._fused.moe.raw is not None
    for x, y in zip(a, b, strict=True):
        assert (x.loss, x.grad_norm) == (y.loss, y.grad_norm)
    assert all(np.array_equal(x, y) for x, y in zip(ca, cb, strict=True))
