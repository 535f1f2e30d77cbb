"""The compiled CPU twins (numba, engine.kernels.jit) against their NumPy references, through the
parity helper's "cpu" backend (tests/kernels/twin.py: each twin run in line and on two CPU workers,
bit-identical; its float32 results against the reference computed in float64): RMSNorm, RoPE, the
gated activation, attention's softmax, the head's cross-entropy rows and the whole head loss, AdamW
(bit for bit with the reference), dequantization (bit for bit with gguf-py), and `jit.exp32`. Each
twin is also checked to have run compiled (not quietly fallen back) and to run the reference, with
one log line, when compiled kernels are off. Sizes are small: the suite pays each kernel's first
compile once per checkout (numba's cache keeps it for the next run)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from engine.kernels import (
    adamw,
    adamw_cpu,
    attention,
    attention_cpu,
    cross_entropy,
    cross_entropy_cpu,
    dequant,
    dequant_cpu,
    glu,
    glu_cpu,
    jit,
    linear,
    linear_cpu,
    norm,
    norm_cpu,
    rope,
    rope_cpu,
)
from engine.kernels.linear import LoraTerm
from engine.model import ops
from tests.kernels.dequant_cases import random_raw
from tests.kernels.twin import FP32_TOL, Backend, _leaves, compare, f32, f64

pytest.importorskip("numba", reason="compiled CPU kernels need numba (pip install -e '.[cpu]')")


@pytest.fixture
def cpu() -> Backend:
    jit.reset()
    assert jit.enabled(), jit.status()
    return Backend("cpu")


def assert_close(got, ref, what: str, tol: float = FP32_TOL) -> None:
    for (path, a), (_, r) in zip(_leaves(got), _leaves(ref), strict=True):
        if r is None or isinstance(r, (str, bool, float, int)):
            continue
        c = compare(f"{what}{path}", "", a, r, tol)
        assert c.ok, c.message


def assert_bits(got, ref, what: str) -> None:
    for (path, a), (_, r) in zip(_leaves(got), _leaves(ref), strict=True):
        if isinstance(r, np.ndarray):
            assert a.shape == r.shape and a.dtype == r.dtype, (what, path, a.shape, r.shape, a.dtype, r.dtype)
            assert np.array_equal(
                np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(r).view(np.uint8)
            ), (
                what,
                path,
            )


def test_ops_table_names_the_cpu_twins():
    pairs = {
        ops.rmsnorm_forward: norm_cpu.rmsnorm_forward_cpu,
        ops.rmsnorm_backward: norm_cpu.rmsnorm_backward_cpu,
        ops.rope_forward: rope_cpu.rope_forward_cpu,
        ops.rope_backward: rope_cpu.rope_backward_cpu,
        ops.glu_forward: glu_cpu.glu_forward_cpu,
        ops.glu_backward: glu_cpu.glu_backward_cpu,
        ops.attention_forward: attention_cpu.attention_forward_cpu,
        ops.attention_backward: attention_cpu.attention_backward_cpu,
        ops.lm_head_loss: cross_entropy_cpu.lm_head_loss_cpu,
        ops.adamw_step: adamw_cpu.adamw_step_cpu,
        ops.dequant: dequant_cpu.dequant_cpu,
        ops.linear_group_forward: linear_cpu.linear_group_forward_cpu,
        ops.linear_group_backward: linear_cpu.linear_group_backward_cpu,
    }
    for op, twin in pairs.items():
        assert op.cpu is twin, op.__name__


def test_exp32_within_two_ulp(cpu):
    special = np.float32([-np.inf, np.inf, np.nan, 0.0, -0.0, -104.0, 88.73, -87.5, 1e-30])
    x = np.concatenate([np.linspace(-103.9, 88.72, 200_001, dtype=np.float32), special])
    got = np.empty_like(x)
    _exp_into(x, got)
    exact = np.exp(x.astype(np.float64))
    normal = np.isfinite(exact) & (exact >= np.finfo(np.float32).tiny) & (exact < 3.4e38)
    ulp = np.spacing(exact[normal].astype(np.float32)).astype(np.float64)
    assert (np.abs(got[normal] - exact[normal]) / ulp).max() <= 2.0
    small = exact < np.finfo(np.float32).tiny  # subnormal results: within one subnormal step
    assert np.abs(got[small] - exact[small]).max() <= 2 * np.finfo(np.float32).smallest_subnormal
    with np.errstate(over="ignore"):
        assert_bits(got[-9:], np.exp(x[-9:]).astype(np.float32), "exp32 special values")


@jit.kernel
def _exp_into(x, out):
    for i in range(x.size):
        out[i] = jit.exp32(x[i])


@pytest.mark.parametrize("case", ["qkv lora+bias, joined", "gate/up one lora, copied", "full: every dW"])
def test_linear_group_twin(cpu, fresh_rng, case):
    B, T, C, r = 2, 5, 12, 3
    outs = (12, 4, 4) if case.startswith("qkv") else (9, 9)
    x = f32(fresh_rng, B, T, C)
    whole = f32(fresh_rng, sum(outs), C)
    bounds = np.cumsum((0, *outs))
    ws = [whole[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    if "copied" in case or "full" in case:
        ws = [w.copy() for w in ws]  # separate arrays: the twin stacks them itself
    loras = [LoraTerm(f32(fresh_rng, r, C), f32(fresh_rng, n, r), 0.6) for n in outs]
    bs = [f32(fresh_rng, n) for n in outs] if "bias" in case else [None] * len(outs)
    if case.startswith("gate"):
        loras[0] = None
    if case.startswith("full"):
        loras = [None] * len(outs)
    need = (
        [True] * len(outs)
        if case.startswith("full")
        else [False, True][: len(outs)] + [False] * (len(outs) - 2)
    )
    dys = [f32(fresh_rng, B, T, n) for n in outs]

    def run(_rt):
        ys, caches = linear_cpu.linear_group_forward_cpu(x, ws, bs, loras)
        return ys, linear_cpu.linear_group_backward_cpu(dys, caches, ws, need)

    got = cpu.twice(run, f"linear group {case}")
    l64 = [None if lo is None else LoraTerm(f64(lo.A), f64(lo.B), lo.s) for lo in loras]
    ys, caches = linear.linear_group_forward_ref(f64(x), [f64(w) for w in ws], [f64(b) for b in bs], l64)
    ref = (ys, linear.linear_group_backward_ref([f64(d) for d in dys], caches, [f64(w) for w in ws], need))
    assert_close(got, ref, f"linear group {case}")
    if case.startswith(
        "qkv"
    ):  # the joined weights were used as they are, and outputs are views of one product
        assert linear_cpu.joined_rows(ws) is whole.base or linear_cpu.joined_rows(ws).base is whole
        assert linear_cpu.joined_columns(list(got[0])) is not None


def test_rmsnorm_twin(cpu, fresh_rng):
    for shape, weighted in (((2, 5, 24), True), ((3, 2, 4, 16), False), ((1, 7, 33), True)):
        x, dy = f32(fresh_rng, *shape), f32(fresh_rng, *shape)
        w = f32(fresh_rng, shape[-1]) if weighted else None

        def run(_rt, x=x, w=w, dy=dy):
            y, c = norm_cpu.rmsnorm_forward_cpu(x, w, 1e-6)
            return y, c, norm_cpu.rmsnorm_backward_cpu(dy, c, w)

        got = cpu.twice(run, f"rmsnorm {shape}")
        y_r, c_r = norm.rmsnorm_forward_ref(f64(x), f64(w), 1e-6)
        assert_close(got, (y_r, c_r, norm.rmsnorm_backward_ref(f64(dy), c_r, f64(w))), f"rmsnorm {shape}")


@pytest.mark.parametrize("style", ["norm", "neox"])
def test_rope_twin_equals_reference_bit_for_bit(cpu, fresh_rng, style):
    B, T, H, HS, n_rot = 2, 5, 3, 16, 12
    x, dy = f32(fresh_rng, B, T, H, HS), f32(fresh_rng, B, T, H, HS)
    cos, sin = rope.rope_angles(fresh_rng.integers(0, 50, (B, T)), n_rot, 10000.0)

    def run(_rt):
        y, c = rope_cpu.rope_forward_cpu(x, cos, sin, style)
        return y, rope_cpu.rope_backward_cpu(dy, c)

    got = cpu.twice(run, f"rope {style}")
    y_r, c_r = rope.rope_forward_ref(x, cos, sin, style)
    assert_bits(got, (y_r, rope.rope_backward_ref(dy, c_r)), f"rope {style}")


@pytest.mark.parametrize("act", ["silu", "swiglu_oai", "gelu"])
def test_glu_twin(cpu, fresh_rng, act):
    for order in ("C", "F", "halves"):  # halves: g and u the two column blocks of one product
        layout = "C" if order == "halves" else order
        g = np.asarray(f32(fresh_rng, 9, 40, scale=4.0 if act == "swiglu_oai" else 2.0), order=layout)
        u, dh = (np.asarray(f32(fresh_rng, 9, 40, scale=4.0), order=layout) for _ in range(2))
        if order == "halves":
            gu = np.concatenate([g, u], axis=1)
            g, u = gu[:, :40], gu[:, 40:]
        g[0, :3] = (-100.0, 90.0, 7.0)  # exp's ends, the clamp's edge

        def run(_rt, g=g, u=u, dh=dh):
            h, c = glu_cpu.glu_forward_cpu(g, u, act)
            return h, glu_cpu.glu_backward_cpu(dh, c)

        got = cpu.twice(run, f"glu {act} {order}")
        if act == "gelu":  # no kernel: the reference itself, ggml's float32 table included
            h_r, c_r = glu.glu_forward_ref(g, u, act)
            assert_bits(got, (h_r, glu.glu_backward_ref(dh, c_r)), "glu gelu")
            continue
        h_r, c_r = glu.glu_forward_ref(f64(g), f64(u), act)
        assert_close(got, (h_r, glu.glu_backward_ref(f64(dh), c_r)), f"glu {act} {order}")


@pytest.mark.parametrize("sinks", [False, True])
def test_attention_twin(cpu, fresh_rng, sinks):
    B, T, NH, NKV, HS = 2, 7, 4, 2, 8
    q, k, v = f32(fresh_rng, B, T, NH, HS), f32(fresh_rng, B, T, NKV, HS), f32(fresh_rng, B, T, NKV, HS)
    pos = np.tile(np.arange(T), (B, 1))
    seg = np.array([[0, 0, 0, 1, 1, 1, 1], [0] * T])
    mask = attention.attention_mask(pos, pos, seg, seg)
    s = f32(fresh_rng, NH) if sinks else None
    dy = f32(fresh_rng, B, T, NH * HS)

    def run(_rt):
        y, c = attention_cpu.attention_forward_cpu(q, k, v, mask, 0.3, s)
        return y, attention_cpu.attention_backward_cpu(dy, c)

    got = cpu.twice(run, "attention")
    y_r, c_r = attention.attention_forward_ref(f64(q), f64(k), f64(v), mask, 0.3, f64(s))
    assert_close(got, (y_r, attention.attention_backward_ref(f64(dy), c_r)), f"attention sinks={sinks}")


def test_ce_rows_twin(cpu, fresh_rng):
    n, V = 5, 103
    z = f32(fresh_rng, n, V, scale=5.0)
    tgt = fresh_rng.integers(0, V, n)
    wt = f32(fresh_rng, n)

    def run(_rt):
        return cross_entropy_cpu.ce_rows_cpu(z.copy(), tgt, wt, True), cross_entropy_cpu.ce_rows_cpu(
            z.copy(), tgt, wt, False
        )

    got = cpu.twice(run, "ce rows")
    ref = (
        cross_entropy.ce_rows_ref(f64(z), tgt, f64(wt), True),
        cross_entropy.ce_rows_ref(f64(z), tgt, f64(wt), False),
    )
    assert_close(got, ref, "ce rows")


@pytest.mark.parametrize("case", ["plain", "lora+cap+dw", "tied"])
def test_lm_head_loss_twin(cpu, fresh_rng, case):
    N, C, V, r = 11, 16, 70, 3
    h, w = f32(fresh_rng, N, C), f32(fresh_rng, V, C, scale=0.5)
    targets = fresh_rng.integers(-1, V, N)
    weights = np.abs(f32(fresh_rng, N))
    kw: dict = {"min_rows": 4, "max_logits_bytes": 4 * V * 4}  # blocks of 4 label rows
    if case == "lora+cap+dw":
        kw.update(lora=LoraTerm(f32(fresh_rng, r, C), f32(fresh_rng, V, r), 0.5), cap=3.0, need_dw=True)
    if case == "tied":
        kw.update(tied_lora=LoraTerm(f32(fresh_rng, V, r), f32(fresh_rng, C, r), 0.7))

    def run(_rt):
        return cross_entropy_cpu.lm_head_loss_cpu(h, w, targets, weights, **kw)

    got = cpu.twice(run, f"lm_head_loss {case}")
    kw64 = {k: (LoraTerm(f64(x.A), f64(x.B), x.s) if isinstance(x, LoraTerm) else x) for k, x in kw.items()}
    ref = cross_entropy.lm_head_loss_ref(f64(h), f64(w), targets, f64(weights), **kw64)
    assert got[1][1] == ref[1][1]
    sums = (np.float64(got[0]), np.float64(got[1][0])), (np.float64(ref[0]), np.float64(ref[1][0]))
    assert_close((*sums[0], got[2], got[3]), (*sums[1], ref[2], ref[3]), f"lm_head_loss {case}")


@pytest.mark.parametrize("kw", [{}, {"gclip": 0.0, "max_grad_norm": 0.0}, {"weight_decay": 0.0}])
def test_adamw_twin_equals_reference_bit_for_bit(cpu, fresh_rng, kw):
    shapes = [(7, 33), (4101,), (3, 4, 5), (2, 70_000)]  # 70k: two chunks
    hyper = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, gclip=0.05, max_grad_norm=1.0)
    hyper.update(kw)
    P0 = [f32(fresh_rng, *s) for s in shapes]
    M0 = [f32(fresh_rng, *s, scale=0.01) for s in shapes]
    V0 = [(fresh_rng.random(s) * 1e-4).astype(np.float32) for s in shapes]
    G = [f32(fresh_rng, *s, scale=0.05) for s in shapes]
    steps, decay = [3, 1, 7, 2], [True, False, False, True]

    def run(_rt):
        P, M, V = ([a.copy() for a in arrs] for arrs in (P0, M0, V0))
        res = adamw_cpu.adamw_step_cpu(P, G, M, V, steps, decay, **hyper)
        return P, M, V, np.array(tuple(res), np.float64)

    got = cpu.twice(run, "adamw")
    P, M, V = ([a.copy() for a in arrs] for arrs in (P0, M0, V0))
    ref = adamw.adamw_step_ref(P, G, M, V, steps, decay, **hyper)
    assert_bits(got, (P, M, V, np.array(tuple(ref), np.float64)), f"adamw {kw}")


@pytest.mark.parametrize("qtype", dequant_cpu.COMPILED_TYPES)
def test_dequant_twin_equals_reference_bit_for_bit(cpu, fresh_rng, qtype):
    raw = random_raw(qtype, (3, 4, 512), fresh_rng)

    def run(_rt):
        out = np.full((2, 4, 512), np.nan, np.float32)
        return dequant_cpu.dequant_cpu(raw, qtype), dequant_cpu.dequant_cpu(raw, qtype, rows=[2, 0], out=out)

    got = cpu.twice(run, f"dequant {qtype}")
    assert_bits(got, (dequant.dequant_ref(raw, qtype), dequant.dequant_ref(raw, qtype, rows=[2, 0])), qtype)


@pytest.mark.parametrize("qtype", tuple(dequant_cpu.CODES_KERNELS))
def test_codes_twin_equals_the_numpy_codes_bit_for_bit(cpu, fresh_rng, monkeypatch, qtype):
    """engine.io.quants.int_codes through the compiled codes kernel and through NumPy (the reference:
    what it runs where the kernel is missing): the same codes, scales and offsets, bit for bit."""
    from engine.io import quants

    raw = random_raw(qtype, (3, 4, 512), fresh_rng)
    assert quants.codes_kernel(qtype) is not None  # the compiled path is the one measured first
    got = cpu.twice(lambda _rt: quants.int_codes(raw, qtype)[:3], f"codes {qtype}")
    monkeypatch.setattr(quants, "codes_kernel", lambda q: None)
    want = quants.int_codes(raw, qtype)
    assert want[3] == quants.int_code_group(qtype)
    for a, b in zip(got, want[:3], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
    assert_bits(got[0].view(np.uint8), want[0].view(np.uint8), f"{qtype} codes")
    assert_bits(got[1:], want[1:3], f"{qtype} scales and offsets")


def test_store_dequantizes_through_the_compiled_kernels(cpu, fresh_rng, monkeypatch):
    """engine.io.quants (the weight store's path, split over threads) runs the same kernels."""
    from engine.io import quants

    calls = []
    real = dequant_cpu.blocks_kernel
    monkeypatch.setattr(quants, "blocks_kernel", lambda q: calls.append(q) or real(q))
    raw = random_raw("Q4_K", (300, 1024), fresh_rng)
    got = quants.dequantize(raw, "Q4_K", threads=2)
    assert calls == ["Q4_K"]
    assert_bits(got, dequant.dequant_ref(raw, "Q4_K"), "store Q4_K")


def test_without_compiled_kernels_the_reference_runs_and_says_so_once(fresh_rng, monkeypatch, caplog):
    monkeypatch.setenv(jit.OFF_VARIABLE, "1")
    jit.reset()
    try:
        x, w = f32(fresh_rng, 3, 8), f32(fresh_rng, 8)
        with caplog.at_level(logging.WARNING, logger="engine.kernels.jit"):
            got = [norm_cpu.rmsnorm_forward_cpu(x, w, 1e-5)[0] for _ in range(3)]
        ref = norm.rmsnorm_forward_ref(x, w, 1e-5)[0]
        for y in got:
            assert_bits(y, ref, "rmsnorm without numba")
        said = [r for r in caplog.records if "compiled CPU kernels are off" in r.getMessage()]
        assert len(said) == 1 and jit.OFF_VARIABLE in said[0].getMessage()
        assert dequant_cpu.blocks_kernel("Q4_K") is None
    finally:
        monkeypatch.delenv(jit.OFF_VARIABLE)
        jit.reset()


@pytest.mark.parametrize("arch", ["qwen2", "qwen3moe"])
def test_training_with_compiled_kernels_follows_the_numpy_reference(arch, tmp_path, monkeypatch):
    """A user's run: LoRA on every linear tensor of a float32 model (experts included), three AdamW
    steps through the model code, once with the compiled twins and once with TUNE_NO_JIT (the NumPy
    reference kernels): the same losses and adapters within float32 rounding."""
    from engine.model.model import Model
    from engine.model.targets import TargetSpec, select_targets
    from engine.testing import SynthSpec, write_model
    from engine.train.optim import AdamW, OptimConfig
    from engine.train.train_model import Trainable, loss_and_grads
    from tests.engine.test_grad_model import packed_batch

    path = write_model(tmp_path / f"{arch}.gguf", SynthSpec.for_arch(arch, seed=2, qtype="Q8_0"))

    def train(no_jit: bool):
        if no_jit:
            monkeypatch.setenv(jit.OFF_VARIABLE, "1")
        else:
            monkeypatch.delenv(jit.OFF_VARIABLE, raising=False)
        jit.reset()
        model = Model.load(path)
        names = select_targets(model.tensors, TargetSpec(preset="all"), model.config.L)
        tr = Trainable.init(model, names, rank=4, alpha=8.0, seed=1)
        opt = AdamW(tr.params(), OptimConfig(lr=1e-2, schedule="constant"))
        batch = packed_batch(model.config.V)
        losses = []
        for _ in range(3):
            res = loss_and_grads(model, tr, batch)
            opt.step(res.grads)
            losses.append(res.loss)
        return np.array(losses), tr.params()

    try:
        compiled, p1 = train(False)
        reference, p2 = train(True)
    finally:
        monkeypatch.delenv(jit.OFF_VARIABLE, raising=False)
        jit.reset()
    np.testing.assert_allclose(compiled, reference, rtol=1e-5)
    for name in p2:
        c = compare(name, arch, p1[name], p2[name].astype(np.float64), 1e-4)
        assert c.ok, c.message
