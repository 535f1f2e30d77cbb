"""Weights as int8 codes with a scale and offset per group of 32 (engine.kernels.blockq) and the product
straight from them (engine.kernels.blockq_cpu): the codes of every type that has them give the
dequantized values bit for bit (engine.io.quants.int_codes against `dequantize`), both layouts; the
compiled product against its reference (float64) in line and on two workers, row counts that leave a
tail and cross the kernel's row blocks; the reference when compiled kernels are off; and the real
path: a GGUF file with quantized experts, its weight store handing out the codes (accounted in its
cache, evicted like float arrays), the MoE experts' CPU twin multiplying by them against the
reference on the dequantized experts."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from engine.io.gguf_file import GGUFFile
from engine.io.quants import dequantize, int_codes
from engine.kernels import blockq_cpu, jit, moe, moe_cpu
from engine.kernels.blockq import BlockQ, make_blockq, xwt_ref
from engine.kernels.linear import LoraTerm
from tests.kernels.dequant_cases import random_raw
from tests.kernels.twin import FP32_TOL, Backend, _leaves, compare, f32, f64

WITH_CODES = {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q4_K": 32, "Q5_K": 32, "MXFP4": 32,
              "IQ4_NL": 32, "IQ4_XS": 32, "Q2_K": 16, "Q3_K": 16, "Q6_K": 16}  # fmt: skip


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("qtype", WITH_CODES)
def test_codes_give_the_dequantized_values_bit_for_bit(fresh_rng, qtype):
    raw = random_raw(qtype, (8, 512), fresh_rng)
    q, s, m, g = int_codes(raw, qtype)
    assert g == WITH_CODES[qtype]
    assert q.dtype == np.int8 and q.shape == (8, 512) and s.shape == m.shape == (8, 512 // g)
    w = make_blockq(q, s, m, "in", g)
    dense = dequantize(raw, qtype)
    assert _bits_equal(w.dense(), dense), qtype
    t = w.transposed()
    assert t.along == "out" and t.q.shape == (512, 8)
    assert _bits_equal(t.dense(), np.ascontiguousarray(dense.T)), qtype
    assert _bits_equal(t.transposed().dense(), dense)
    assert w.nbytes == 8 * 512 + 2 * 8 * (512 // g) * 4  # 1.25 bytes a value (1.5 for groups of 16)


@pytest.mark.parametrize("qtype", ["F16", "F32", "BF16"])
def test_types_without_codes_say_so(fresh_rng, qtype):
    assert int_codes(random_raw(qtype, (2, 256), fresh_rng), qtype) is None


def test_make_blockq_checks_what_it_is_given():
    q = np.zeros((4, 64), np.int8)
    s = np.zeros((4, 2), np.float32)
    assert make_blockq(q, s, s).shape == (4, 64)
    with pytest.raises(ValueError, match="int8"):
        make_blockq(q.astype(np.int16), s, s)
    with pytest.raises(ValueError, match="scales must be float32"):
        make_blockq(q, s[:, :1], s)
    with pytest.raises(ValueError, match="groups of 32"):
        make_blockq(np.zeros((4, 48), np.int8), s, s)
    with pytest.raises(ValueError, match="along"):
        make_blockq(q, s, s, "rows")
    with pytest.raises(ValueError, match="groups of 8"):
        make_blockq(q, s, s, "in", 8)


def _random_blockq(rng, n_out: int, n_in: int, group: int = 32) -> BlockQ:
    q = rng.integers(-128, 128, (n_out, n_in)).astype(np.int8)
    s = (rng.random((n_out, n_in // group)) * 0.02).astype(np.float32)
    m = (rng.standard_normal((n_out, n_in // group)) * 0.1).astype(np.float32)
    return make_blockq(q, s, m, "in", group)


@pytest.fixture
def cpu() -> Backend:
    pytest.importorskip("numba", reason="compiled CPU kernels need numba (pip install -e '.[cpu]')")
    jit.reset()
    assert jit.enabled(), jit.status()
    return Backend("cpu")


@pytest.mark.parametrize("n", [1, 6, 32, 70, 131])  # a tail of rows; past one and two row blocks (64)
@pytest.mark.parametrize("along", ["in", "out"])
@pytest.mark.parametrize("group", [32, 16])
def test_product_from_codes_follows_the_reference(cpu, fresh_rng, monkeypatch, n, along, group):
    w = _random_blockq(fresh_rng, 96, 64, group)  # "out": its transpose (64, 96), groups down its columns
    w = w if along == "in" else w.transposed()
    x = f32(fresh_rng, n, w.q.shape[1])

    def no_fallback(*args):
        raise AssertionError("the reference ran instead of the compiled kernel")

    monkeypatch.setattr(blockq_cpu, "xwt_ref", no_fallback)
    assert blockq_cpu.compiled_for(w)
    got = cpu.twice(lambda _rt: blockq_cpu.xwt_cpu(x, w), f"xwt {along} n {n} group {group}")
    ref = f64(x) @ f64(w.dense()).T
    c = compare("xwt", f"{along} n {n}", got, ref, FP32_TOL)
    assert c.ok, c.message
    xs = np.asfortranarray(x)  # any layout of x
    assert np.array_equal(blockq_cpu.xwt_cpu(xs, w), got)
    with pytest.raises(ValueError, match="cannot be multiplied"):
        blockq_cpu.xwt_cpu(x[:, :32], w)


def test_product_from_codes_runs_the_reference_when_compiled_kernels_are_off(fresh_rng, monkeypatch):
    w = _random_blockq(fresh_rng, 8, 64)
    x = f32(fresh_rng, 5, 64)
    monkeypatch.setenv(jit.OFF_VARIABLE, "1")
    jit.reset()
    try:
        assert not blockq_cpu.compiled_for(w)
        assert np.array_equal(blockq_cpu.xwt_cpu(x, w), xwt_ref(x, w))
    finally:
        monkeypatch.delenv(jit.OFF_VARIABLE)
        jit.reset()
    odd = _random_blockq(fresh_rng, 6, 64)  # rows not a multiple of the kernel's 4: the reference
    assert np.array_equal(blockq_cpu.xwt_cpu(x, odd), xwt_ref(x, odd))


def _experts_model(tmp_path, qtype: str):
    """A one-layer MoE model (C = F = 256, 4 experts) whose expert stacks are stored as `qtype`. The
    codebook types, which nothing here quantizes to, get random blocks with a small scale (each value
    0.0002 times a sub-block scale up to 32 times a codebook value up to 127)."""
    from engine.model.model import Model
    from engine.testing import SynthSpec, random_weights, write_model

    if qtype not in ("IQ4_NL", "IQ4_XS"):
        spec = SynthSpec.for_arch("qwen3moe", seed=3, C=256, F_exp=256, E=4, K=2, L=1, expert_qtype=qtype)
        return Model.load(write_model(tmp_path / f"moe-{qtype}.gguf", spec))
    spec = SynthSpec.for_arch("qwen3moe", seed=3, C=256, F_exp=256, E=4, K=2, L=1, expert_qtype="Q8_0")
    weights = random_weights(spec)
    rng = np.random.default_rng(4)
    stored = {}
    for name, w in weights.items():
        if name.endswith("_exps.weight"):
            raw = random_raw(qtype, w.shape, rng)
            blocks = raw.reshape(-1, raw.shape[-1] // (w.shape[-1] // (32 if qtype == "IQ4_NL" else 256)))
            blocks[:, 0:2] = np.array([0.0002], "<f2").view(np.uint8)  # d, the block's float16 scale
            stored[name] = (raw, qtype)
    return Model.load(write_model(tmp_path / f"moe-{qtype}.gguf", spec, weights, stored=stored))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1", "Q4_K", "Q6_K", "IQ4_XS", "IQ4_NL"])
def test_experts_twin_multiplies_by_the_stores_codes(cpu, fresh_rng, tmp_path, monkeypatch, qtype):
    """The weight store of a real file gives each expert as codes, the file's layout and its transpose
    each an entry of its own (1.25 bytes a value, 1.5 with groups of 16); the experts' CPU twin
    multiplies by them and follows the reference (float64, on the dequantized experts) in every
    output and gradient, in line and on two workers; a forward alone makes no transposes."""
    model = _experts_model(tmp_path, qtype)
    store = model.weights
    names = [f"blk.0.ffn_{k}_exps.weight" for k in ("gate", "up", "down")]
    stacks = [store[n] for n in names]
    before = store.cache_bytes
    w = store.expert_codes(names[0], 1)
    per_value = 1.25 if w.group == 32 else 1.5  # codes and two float32 per group
    assert store.cache_bytes - before == w.nbytes == int(per_value * 256 * 256)
    assert store.expert_codes(names[0], 1) is w  # cached
    wt = store.expert_codes(names[0], 1, transposed=True)
    assert wt.along == "out" and np.array_equal(wt.dense(), w.dense().T)
    assert store.cache_bytes - before == 2 * w.nbytes
    with pytest.raises(IndexError):
        store.expert_codes(names[0], 4)

    N, C, E, K = 24, 256, 4, 2
    routing, _ = moe.route_forward_ref(f32(fresh_rng, N, E), K, True)
    loras = [LoraTerm(f32(fresh_rng, E, 3, C, scale=0.1), f32(fresh_rng, E, C, 3, scale=0.1), 0.5)
             for _ in names]  # gate, up, down (C = F): three draws  # fmt: skip
    x, dy = f32(fresh_rng, N, C), f32(fresh_rng, N, C)
    with threadpool_limits(1):
        moe_cpu.experts_forward_cpu(x, routing, *stacks, *loras)  # as a generation would
    transposes = [k for k in store._cache if k[0] == "codes" and k[3]]
    assert transposes == [("codes", names[0], 1, True)]  # only the one asked for above

    def run(_rt):
        y, cache = moe_cpu.experts_forward_cpu(x, routing, *stacks, *loras)
        return y, moe_cpu.experts_backward_cpu(dy, cache, *stacks)

    used = []
    monkeypatch.setattr(moe_cpu, "xwt_cpu", lambda x, w: used.append(w.along) or blockq_cpu.xwt_cpu(x, w))
    with threadpool_limits(1):  # in line with BLAS on one thread, as engine.train.threads sets it
        got = cpu.twice(run, f"experts from {qtype} codes")
    assert used.count("in") == used.count("out") > 0  # forward by the codes, backward by their transpose
    dense = [f64(np.asarray(s)) for s in stacks]
    l64 = [LoraTerm(f64(lo.A), f64(lo.B), lo.s) for lo in loras]
    r64 = moe.Routing(*(f64(a) if a.dtype == np.float32 else a for a in routing))
    y_r, c_r = moe.experts_forward_ref(f64(x), r64, *dense, *l64)
    ref = (y_r, moe.experts_backward_ref(f64(dy), c_r, *dense))
    for (path, a), (_, r) in zip(_leaves(got), _leaves(ref), strict=True):
        if isinstance(r, np.ndarray):
            c = compare(f"experts{path}", qtype, a, r, FP32_TOL)
            assert c.ok, c.message


def test_in_line_beside_a_threaded_blas_experts_are_float(cpu, fresh_rng, tmp_path, monkeypatch):
    """The codes' kernel runs on one thread: in line, with BLAS on two threads (a BLAS the engine does
    not manage), the float experts' products use both; on workers, or with one BLAS thread, codes."""
    from engine.kernels import cpu_workers

    model = _experts_model(tmp_path, "Q8_0")
    stacks = [model.weights[f"blk.0.ffn_{k}_exps.weight"] for k in ("gate", "up", "down")]
    routing, _ = moe.route_forward_ref(f32(fresh_rng, 8, 4), 2, True)
    x = f32(fresh_rng, 8, 256)
    used = []
    monkeypatch.setattr(moe_cpu, "xwt_cpu", lambda x, w: used.append(w) or blockq_cpu.xwt_cpu(x, w))
    monkeypatch.setattr(cpu_workers, "workers", lambda: 1)
    monkeypatch.setattr(moe_cpu, "workers", lambda: 1)
    with threadpool_limits(2):
        assert cpu_workers.blas_threads() == 2 and not moe_cpu.codes_pay()
        floats, _ = moe_cpu.experts_forward_cpu(x, routing, *stacks)
    assert not used
    with threadpool_limits(1):
        assert moe_cpu.codes_pay()
        coded, _ = moe_cpu.experts_forward_cpu(x, routing, *stacks)
    assert used
    np.testing.assert_allclose(coded, floats, rtol=1e-5, atol=1e-5 * float(np.abs(floats).max()))


@pytest.mark.parametrize("shape", [(768, 256), (256, 768), (64, 96), (12, 64), (64, 36)])
@pytest.mark.parametrize("along", ["in", "out"])
@pytest.mark.parametrize("group", [32, 16])
def test_transpose_twin_equals_the_reference(fresh_rng, shape, along, group):
    """blockq_cpu.transposed_cpu (8 x 8 blocks of bytes in 64-bit words) against BlockQ.transposed,
    bit for bit; sides not a multiple of 8 go through the reference."""
    n, k = shape
    if (k if along == "in" else n) % group:
        pytest.skip("groups do not divide that side")
    groups = (n, k // group) if along == "in" else (n // group, k)
    q = fresh_rng.integers(-128, 128, shape).astype(np.int8)
    w = make_blockq(q, f32(fresh_rng, *groups), f32(fresh_rng, *groups), along, group)
    got, want = blockq_cpu.transposed_cpu(w), w.transposed()
    assert (got.along, got.group) == (want.along, want.group)
    for a, b in zip(got[:3], want[:3], strict=True):
        assert a.flags.c_contiguous and a.dtype == b.dtype and np.array_equal(a, b)


def _q8_expert(f, name, e):
    return dequantize(f.raw(name), "Q8_0").reshape(f.tensors[name].shape)[e]


def test_store_evicts_codes_like_float_arrays(tmp_path, monkeypatch):
    """A cache budget that holds every expert's codes but not the float experts beside them: codes and
    float arrays come and go together; the store never hands an expert's codes out as a reusable float
    buffer, and its byte count stays true. Under that budget codes are made on each use, in the file's
    layout only, where a compiled kernel makes them."""
    model = _experts_model(tmp_path, "Q8_0")
    store = model.weights
    store.set_budget(store.codes_bytes)
    names = [f"blk.0.ffn_{k}_exps.weight" for k in ("gate", "up", "down")]
    for _ in range(2):
        for name in names:
            for e in range(4):
                assert store.expert_codes(name, e, transposed=True) is not None  # both layouts
                store.expert(name, e)  # a float expert of the same shape: may reuse only float buffers
    held = sum(v.nbytes for v in store._cache.values())
    assert store.cache_bytes == held <= store.budget + store.working_set
    assert store.stats.misses > 2 * len(names) * 4  # entries were evicted and made again
    f = GGUFFile(store.path)
    for name in names:  # whatever was evicted and reused, every value is still the file's
        exact = dequantize(f.raw(name), "Q8_0").reshape(f.tensors[name].shape)
        for e in range(4):
            assert np.array_equal(store.expert(name, e), exact[e])
            assert np.array_equal(store.expert_codes(name, e, transposed=True).dense(), exact[e].T)
    # a budget under the codes' size: the file's layout is made on each use by the compiled kernel
    # (cheaper than dequantizing), never its transpose (the backward then multiplies by floats)
    store.set_budget(store.codes_bytes - 1)
    assert moe_cpu.expert_codes(store[names[0]], 0, True, transposed=True) is None
    made = store.stats.misses
    assert np.array_equal(store.expert_codes(names[0], 0).dense(), _q8_expert(f, names[0], 0))
    assert store.stats.misses == made + 1
    monkeypatch.setenv(jit.OFF_VARIABLE, "1")  # no compiled kernel: float experts
    jit.reset()
    try:
        assert store.expert_codes(names[0], 1) is None
    finally:
        monkeypatch.delenv(jit.OFF_VARIABLE)
        jit.reset()


def test_types_without_codes_multiply_through_float_experts(tmp_path):
    model = _experts_model(tmp_path, "F16")
    stack = model.weights["blk.0.ffn_gate_exps.weight"]
    assert stack.codes(0) is None and moe_cpu.expert_codes(stack, 0, True) is None


@pytest.mark.parametrize(("budget", "layouts"), [("1G", {"in", "out"}), ("off", {"in"})])
def test_a_training_step_from_codes_follows_the_numpy_reference(tmp_path, monkeypatch, budget, layouts):
    """A user's step on a Q4_K MoE model (LoRA on attention and every expert) with BLAS on one thread,
    as the engine sets it beside a busy core: experts multiplied from codes (both layouts where the
    cache keeps them; with the cache off, codes made on each use forward and float experts backward);
    the same loss and gradients as the NumPy reference kernels (TUNE_NO_JIT: float experts) within
    float32 rounding."""
    pytest.importorskip("numba", reason="compiled CPU kernels need numba (pip install -e '.[cpu]')")
    from engine.model.targets import TargetSpec, select_targets
    from engine.train.train_model import Trainable, loss_and_grads
    from tests.engine.test_grad_model import packed_batch

    used = []
    monkeypatch.setattr(moe_cpu, "xwt_cpu", lambda x, w: used.append(w) or blockq_cpu.xwt_cpu(x, w))

    def step(no_jit: bool):
        if no_jit:
            monkeypatch.setenv(jit.OFF_VARIABLE, "1")
        jit.reset()
        try:
            model = _experts_model(tmp_path, "Q4_K")
            model.weights.set_budget(budget)
            names = select_targets(model.tensors, TargetSpec(preset="all"), model.config.L)
            tr = Trainable.init(model, names, rank=4, alpha=8.0, seed=1)
            for _, B in tr.pairs.values():
                B[...] = 0.05
            with threadpool_limits(1):
                return loss_and_grads(model, tr, packed_batch(model.config.V))
        finally:
            monkeypatch.delenv(jit.OFF_VARIABLE, raising=False)
            jit.reset()

    coded = step(False)
    assert {w.along for w in used} == layouts
    reference = step(True)
    assert coded.loss == pytest.approx(reference.loss, rel=1e-6)
    scale = max(float(np.abs(g).max()) for g in reference.grads.values())
    for n, g in reference.grads.items():
        np.testing.assert_allclose(coded.grads[n], g, rtol=1e-4, atol=1e-5 * scale, err_msg=n)
