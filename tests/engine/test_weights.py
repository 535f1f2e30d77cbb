"""The weight store: quantized at rest, dequantized on demand, cached within a budget, buffers reused."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from engine import EngineError
from engine.io.gguf_file import GGUFFile
from engine.io.weights import ExpertStack, RowTensor, WeightStore, parse_budget, resolve_budget
from engine.kernels import jit
from engine.model.model import Model
from engine.model.targets import TargetSpec, select_targets
from engine.testing import SynthSpec, write_model
from engine.train.train_model import Trainable, loss_and_grads
from tests.engine.test_grad_model import packed_batch


def _exact(f: GGUFFile, name: str) -> np.ndarray:
    info = f.tensors[name]
    raw = f.raw(name)
    if info.qtype in ("F32", "F16"):
        return np.asarray(raw, np.float32)
    return gguf_quants.dequantize(raw, GGMLQuantizationType[info.qtype]).reshape(info.shape)


@pytest.fixture(scope="module")
def moe_q8(tmp_path_factory) -> str:
    spec = SynthSpec.for_arch("qwen3moe", C=64, F_exp=64, V=300, qtype="Q8_0", seed=4)
    return write_model(tmp_path_factory.mktemp("w") / "moe_q8.gguf", spec)


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_nothing_is_dequantized_at_load_but_the_vectors(moe_q8):
    model = Model.load(moe_q8, cache_budget=0)
    store = model.weights
    assert store.stats.misses == 0 and store.cache_bytes == 0
    assert store.stored_bytes < store.dequantized_bytes / 3  # Q8_0 at rest: about a quarter of float32
    assert isinstance(store["blk.0.ffn_up_exps.weight"], ExpertStack)
    assert isinstance(store["token_embd.weight"], RowTensor)
    assert store["blk.0.attn_norm.weight"].dtype == np.float32  # 1-D tensors are kept dequantized


def test_every_tensor_reads_exactly_as_gguf_dequantizes_it(moe_q8):
    model = Model.load(moe_q8, cache_budget=0)
    f = GGUFFile(moe_q8)
    for name in model.weights:
        np.testing.assert_array_equal(np.asarray(model.weights[name]), _exact(f, name), err_msg=name)
    stack = model.weights["blk.1.ffn_down_exps.weight"]
    np.testing.assert_array_equal(stack[2], _exact(f, "blk.1.ffn_down_exps.weight")[2])
    ids = np.array([[5, 7, 5], [299, 0, 7]])
    np.testing.assert_array_equal(
        model.weights["token_embd.weight"].take_rows(ids), _exact(f, "token_embd.weight")[ids]
    )


def test_one_expert_is_dequantized_not_the_stack(moe_q8):
    store = Model.load(moe_q8, cache_budget=0).weights
    stack = store["blk.0.ffn_gate_exps.weight"]
    before = store.stats.dequant_values
    stack[3]
    assert store.stats.dequant_values - before == stack.shape[1] * stack.shape[2]


def test_rows_of_gives_a_layers_projections_as_blocks_of_one_cached_array(moe_q8):
    model = Model.load(moe_q8, cache_budget="auto")
    f = GGUFFile(moe_q8)
    names = ("blk.1.attn_q.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight")
    blocks = model.weights.rows_of(names)
    for n, b in zip(names, blocks, strict=True):
        np.testing.assert_array_equal(b, _exact(f, n), err_msg=n)
    base = blocks[0].base
    assert all(b.base is base and b.flags.c_contiguous for b in blocks)
    assert _addr(blocks[1]) == _addr(blocks[0]) + blocks[0].nbytes  # consecutive rows of one array
    misses = model.weights.stats.misses
    again = model.weights.rows_of(names)  # cached: the same array, nothing dequantized
    assert model.weights.stats.misses == misses and _addr(again[0]) == _addr(blocks[0])
    with pytest.raises(ValueError, match="same number of columns"):
        model.weights.rows_of(("blk.1.attn_q.weight", "blk.1.attn_output.weight"))


def _layer_ranges(model, i):
    f = model.weights.file
    base = f._map.ctypes.data
    return sorted(
        (f.raw(n).ctypes.data - base, f.raw(n).nbytes)
        for n, info in model.weights.infos.items()
        if n.startswith(f"blk.{i}.") and len(info.shape) >= 2
    )


def _covered(spans):
    return set().union(*(range(s, s + n) for s, n in spans))


def test_prefetch_asks_for_the_next_layers_bytes_as_one_job_only_when_the_cache_cannot_hold_the_model(
    moe_q8, monkeypatch
):
    from engine.io import gguf_file

    jobs = []
    monkeypatch.setattr(gguf_file.Prefetcher, "read", lambda self, ranges: jobs.append(list(ranges)))
    model = Model.load(moe_q8, cache_budget=0)
    model.weights.prefetch_layer(1)
    want = _layer_ranges(model, 1)
    assert len(jobs) == 1 and len(want) > 2
    # the layer's matrices lie side by side in the file: fewer, longer reads that cover every byte of
    # them, and no more than the gaps between them
    spans = jobs[0]
    assert len(spans) < len(want) and spans == sorted(spans)
    assert _covered(want) <= _covered(spans)
    assert len(_covered(spans)) - len(_covered(want)) <= len(want) * gguf_file.Prefetcher.GAP
    jobs.clear()
    roomy = Model.load(moe_q8, cache_budget="1G")
    roomy.weights.prefetch_layer(1)
    assert not jobs


@pytest.mark.parametrize("fadvise", [True, False], ids=["posix_fadvise", "preadv"])
def test_prefetcher_loads_every_range_of_a_layer_while_the_disk_is_slow(moe_q8, monkeypatch, fadvise):
    """A layer's ranges are one job: the thread loads all of them, however long the first takes (it
    used to keep only the last two ranges waiting, so most of a layer's experts were never read)."""
    import threading

    from engine.io import gguf_file

    loaded, first = [], threading.Event()
    real = gguf_file.Prefetcher._load

    def slow_load(self, start, n):
        first.wait(5)  # the disk is busy until the engine has asked for everything
        loaded.append((start, n))
        real(self, start, n)

    monkeypatch.setattr(gguf_file.Prefetcher, "_load", slow_load)
    monkeypatch.setattr(gguf_file.Prefetcher, "CHUNK", 4096)
    if not fadvise:
        monkeypatch.delattr(gguf_file.os, "posix_fadvise", raising=False)
    model = Model.load(moe_q8, cache_budget=0)
    f = model.weights.file
    model.weights.prefetch_layer(1)
    first.set()
    assert f._prefetcher.wait(timeout=10)
    assert (f._prefetcher._buf is None) == fadvise
    assert _covered(_layer_ranges(model, 1)) <= _covered(loaded)
    assert all(n <= 4096 for _, n in loaded)
    # newer layers push out older ones that have not started: at most PENDING wait
    loaded.clear()
    first.clear()
    for i in range(model.config.L):
        model.weights.prefetch_layer(i)
    assert len(f._prefetcher._jobs) <= gguf_file.Prefetcher.PENDING
    first.set()
    assert f._prefetcher.wait(timeout=10)
    last = model.config.L - 1
    assert _covered(_layer_ranges(model, last)) <= _covered(loaded)
    model.weights.file.close()
    assert f._prefetcher is None


def test_prefetcher_reads_ranges_in_the_background_and_closes(moe_q8):
    from engine.io.gguf_file import Prefetcher

    p = Prefetcher(moe_q8)
    p.read([(0, 4096), (4096, 10_000)])
    assert p.wait(timeout=10)
    p.close()
    assert not p._thread.is_alive()


def test_take_rows_dequantizes_only_the_rows_asked_for(moe_q8):
    store = Model.load(moe_q8, cache_budget=0).weights
    before = store.stats.dequant_values
    store.take_rows("token_embd.weight", np.array([[4, 4, 9], [9, 4, 11]]))
    assert store.stats.dequant_values - before == 3 * 64


def test_row_chunks_stream_the_head_within_the_block_size(moe_q8):
    store = Model.load(moe_q8, cache_budget=0).weights
    # blocks of 32 rows of 64 floats, one buffer reused: copy each while it is current
    blocks = [(lo, hi, w.copy()) for lo, hi, w in store.row_chunks("output.weight", max_bytes=64 * 4 * 32)]
    assert len(blocks) == -(-300 // 32) and all(b[2].shape[0] <= 32 for b in blocks)
    assert [b[0] for b in blocks] == list(range(0, 300, 32))
    whole = _exact(GGUFFile(moe_q8), "output.weight")
    np.testing.assert_array_equal(np.concatenate([b[2] for b in blocks]), whole)
    assert store.cache_bytes == 0  # a streamed head is not cached


def test_budget_decides_what_stays_cached(moe_q8):
    off = Model.load(moe_q8, cache_budget=0)
    on = Model.load(moe_q8, cache_budget="1G")
    tokens = np.array([1, 17, 200, 5, 9, 33])
    a1, b1 = off.forward(tokens), on.forward(tokens)
    # the cache changes speed, and results only within float32 rounding: a budget that holds every
    # expert's int8 codes multiplies by them both ways (WeightStore.expert_codes), a smaller one makes
    # the file's layout on each use (compiled) and multiplies the backward by float experts
    name = "blk.0.ffn_gate_exps.weight"
    assert on.weights.expert_codes(name, 0, transposed=True) is not None
    assert off.weights.expert_codes(name, 0, transposed=True) is None
    assert (off.weights.expert_codes(name, 0) is not None) == jit.enabled()
    np.testing.assert_allclose(a1, b1, rtol=1e-5, atol=1e-5 * float(np.abs(a1).max()))
    misses_off, misses_on = off.weights.stats.misses, on.weights.stats.misses
    a2, b2 = off.forward(tokens), on.forward(tokens)
    np.testing.assert_array_equal(a2, a1)
    np.testing.assert_array_equal(b2, b1)
    assert on.weights.stats.misses == misses_on  # second pass: every weight from the cache
    assert off.weights.stats.misses > misses_off  # cache off: dequantized again
    assert off.weights.cache_bytes <= off.weights.working_set
    assert on.weights.cache_bytes > off.weights.cache_bytes


def test_evicted_buffers_are_reused_but_never_while_held(moe_q8):
    store = Model.load(moe_q8, cache_budget=0).weights
    store.working_set = 0  # keep nothing beyond what is being read
    q0 = store["blk.0.attn_q.weight"]
    held = q0.copy()
    q1 = store["blk.1.attn_q.weight"]
    assert _addr(q1) != _addr(q0)  # q0 is still held by this test
    np.testing.assert_array_equal(q0, held)
    del q0, q1
    q0 = store["blk.0.attn_q.weight"]
    addr = _addr(q0)
    del q0
    q1 = store["blk.1.attn_q.weight"]
    assert _addr(q1) == addr  # same shape, nobody holds it: the buffer is reused


def test_training_follows_the_cache_budget_within_rounding_and_checkpointing_bit_for_bit(moe_q8):
    batch = packed_batch(300)
    results = []
    for budget, ckpt in (("off", False), ("1G", False), ("off", True)):
        model = Model.load(moe_q8, dtype=np.float32, cache_budget=budget)
        targets = select_targets(model.tensors, TargetSpec(preset="all"), model.config.L)
        tr = Trainable.init(model, targets, rank=2, seed=1)
        for _, B in tr.pairs.values():
            B[...] = 0.05
        results.append(loss_and_grads(model, tr, batch, checkpoint=ckpt))
    off, on, off_ckpt = results
    assert off_ckpt.loss == off.loss  # checkpointing recomputes the same bits
    for n, g in off.grads.items():
        np.testing.assert_array_equal(off_ckpt.grads[n], g, err_msg=n)
    # a budget that holds the experts' codes multiplies by them: the same within float32 rounding (of
    # the largest gradient: the router's are sums that cancel to ~1e-8, all rounding)
    assert on.loss == pytest.approx(off.loss, rel=1e-6)
    scale = max(float(np.abs(g).max()) for g in off.grads.values())
    for n, g in off.grads.items():
        np.testing.assert_allclose(on.grads[n], g, rtol=1e-4, atol=1e-5 * scale, err_msg=n)


@pytest.mark.parametrize(
    "text,value",
    [("auto", "auto"), (None, "auto"), ("off", 0), ("0", 0), ("512M", 512 << 20), ("2.5G", int(2.5 * 2**30)),
     ("4gib", 4 << 30), (1234, 1234)],
)  # fmt: skip
def test_budget_settings(text, value):
    assert parse_budget(text) == value


@pytest.mark.parametrize("bad", ["lots", "-1G", -5, float("nan"), "1X"])
def test_bad_budget_names_the_value(bad):
    with pytest.raises(EngineError, match="budget"):
        parse_budget(bad)


def test_auto_budget_keeps_the_reserve_and_a_headroom():
    assert resolve_budget("auto", reserve=1 << 50) == 0
    assert 0 < resolve_budget("auto") < resolve_budget("auto", reserve=0) + 1


def test_store_refuses_other_dtypes(moe_q8):
    with pytest.raises(Exception, match="float32 or float64"):
        WeightStore(GGUFFile(moe_q8), ["blk.0.attn_q.weight"], np.float16)


def test_threads_reading_experts_side_by_side_get_exact_values_and_a_true_count(moe_q8):
    """The store dequantizes outside its lock (CPU workers read their experts side by side): threads
    asking for the same and for different experts of a small cache get the exact values, one copy of
    each is cached, and the cache's byte count is what it holds."""
    from concurrent.futures import ThreadPoolExecutor

    store = Model.load(moe_q8, cache_budget=64 * 64 * 4 * 5).weights
    f = GGUFFile(moe_q8)
    names = [n for n, i in store.infos.items() if len(i.shape) == 3]
    exact = {n: _exact(f, n) for n in names}
    E = store.infos[names[0]].shape[0]
    asks = [(names[k % len(names)], (k * 7) % E) for k in range(400)]

    def read(ask):
        name, e = ask
        return np.array_equal(store.expert(name, e), exact[name][e])

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(read, asks))
    held = list(store._cache.items())
    assert len({k for k, _ in held}) == len(held)
    assert store.cache_bytes == sum(v.nbytes for _, v in held)
    assert store.stats.dequant_values >= store.stats.misses * 64 * 64 > 0
