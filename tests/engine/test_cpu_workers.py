"""Independent pieces on CPU worker threads (engine.kernels.cpu_workers): item order, every worker
used, errors and nesting, BLAS threads set to one inside and restored after, the gate on OpenBLAS's
spin; and the ops that use them (MoE experts, AdamW) giving the same bits with workers as in line."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.kernels import adamw_cpu, cpu_workers, moe, moe_cpu
from engine.kernels.cpu_workers import CpuWorkers, spin_is_short
from engine.testing import random_experts
from engine.train import threads
from engine.train.optim import AdamW, OptimConfig


def two_workers() -> CpuWorkers:
    w = CpuWorkers()
    w.set_count(2)
    return w


def test_results_come_back_in_item_order_from_both_workers():
    w = two_workers()
    both = threading.Barrier(2, timeout=10)  # broken (an error) unless two threads run pieces at once
    names = set()

    def piece(i: int) -> int:
        if i < 2:
            both.wait()
        names.add(threading.current_thread().name)
        return i * i

    assert w.run_each(piece, list(range(40))) == [i * i for i in range(40)]
    assert len(names) == 2
    assert w.run_each(piece, []) == []


def test_the_first_error_is_raised_after_every_worker_stopped_and_the_pool_still_works():
    w = two_workers()
    started = []

    def piece(i: int) -> int:
        started.append(i)
        if i == 3:
            raise ValueError(f"piece {i} is bad")
        return i

    with pytest.raises(ValueError, match="piece 3 is bad"):
        w.run_each(piece, list(range(200)))
    assert len(started) < 200  # pieces after the failure were skipped
    assert w.run_each(lambda i: i + 1, [1, 2, 3]) == [2, 3, 4]


def test_a_run_inside_a_piece_runs_in_line():
    w = two_workers()
    outer = w.run_each(lambda i: w.run_each(lambda j: (i, j), [0, 1, 2]), [0, 1, 2, 3])
    assert outer == [[(i, j) for j in range(3)] for i in range(4)]


def test_blas_runs_one_thread_inside_pieces_and_gets_its_count_back():
    w = two_workers()
    libs = w._libs()
    if not libs:
        pytest.skip("no BLAS that threadpoolctl can set")
    before = [lib.num_threads for lib in libs]
    try:
        for lib in libs:
            lib.set_num_threads(2)  # what engine.train.threads set for a step
        inside = w.run_each(lambda i: [lib.num_threads for lib in libs], [0, 1, 2, 3])
        assert all(counts == [1] * len(libs) for counts in inside)
        assert [lib.num_threads for lib in libs] == [2] * len(libs)
    finally:
        for lib, n in zip(libs, before, strict=True):
            lib.set_num_threads(n)


def test_one_worker_runs_in_line_on_the_calling_thread():
    w = CpuWorkers()
    w.set_count(1)
    here = threading.current_thread().name
    assert w.run_each(lambda i: threading.current_thread().name, [0, 1, 2]) == [here] * 3


@pytest.mark.parametrize(
    "value, short", [("20", True), ("24", True), ("4", True), ("28", False), ("", False), ("x", False)]
)
def test_workers_need_a_short_openblas_spin(value, short):
    assert spin_is_short({"OPENBLAS_THREAD_TIMEOUT": value}) is short
    assert spin_is_short({}) is False


def test_set_workers_follows_the_blas_count_where_the_spin_is_short(monkeypatch):
    proc = CpuWorkers()
    monkeypatch.setattr(cpu_workers, "_PROCESS", proc)
    monkeypatch.setattr(proc, "blas_allows_workers", lambda: True)
    cpu_workers.set_workers(2)
    assert cpu_workers.workers() == 2
    cpu_workers.set_workers(None)
    assert cpu_workers.workers() == 1
    monkeypatch.setattr(proc, "blas_allows_workers", lambda: False)  # long spin, or not OpenBLAS
    cpu_workers.set_workers(2)
    assert cpu_workers.workers() == 1


def test_the_process_blas_controller_publishes_its_count(tmp_path, monkeypatch):
    for key in threads.USER_SETTINGS:
        monkeypatch.delenv(key, raising=False)
    stat = tmp_path / "stat"
    stat.write_text("procs_running 0\n", encoding="ascii")  # nobody else busy: 2 threads
    monkeypatch.setattr("threadpoolctl.threadpool_limits", lambda limits, user_api: None)
    published = []
    monkeypatch.setattr(threads, "set_workers", published.append)
    threads.BlasThreads(cores=2, stat=str(stat), task_dir=str(tmp_path / "none"), publish=True).adjust()
    threads.BlasThreads(cores=2, stat=str(stat), task_dir=str(tmp_path / "none")).adjust()
    assert published == [2]  # the process's controller only


# --- the ops: same bits with two workers as in line ---------------------------------------------


def moe_case(seed: int, E: int = 8, K: int = 2, N: int = 24, C: int = 32, F: int = 48, r: int = 4):
    rng = np.random.default_rng(seed)
    x, routing, ws, loras, dy = random_experts(
        rng, N, C, F, E, K, r, w_scale=0.2, lora_scale=0.1, s=1.5, renorm=True
    )
    b_gate = rng.standard_normal((E, F), dtype=np.float32)
    b_down = rng.standard_normal((E, C), dtype=np.float32)
    biases = (b_gate, None, b_down)
    return x, routing, ws, loras, dy, biases


def flat_arrays(obj) -> list[np.ndarray]:
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, dict):
        return [a for k in sorted(obj) for a in flat_arrays(obj[k])]
    if isinstance(obj, (tuple, list)):
        return [a for o in obj for a in flat_arrays(o)]
    return []


def assert_same_bits(a, b) -> None:
    fa, fb = flat_arrays(a), flat_arrays(b)
    assert len(fa) == len(fb) > 0
    for u, v in zip(fa, fb, strict=True):
        assert u.dtype == v.dtype and u.shape == v.shape
        assert np.array_equal(np.ascontiguousarray(u).view(np.uint8), np.ascontiguousarray(v).view(np.uint8))


def run_moe(case, ext: bool):
    x, routing, ws, loras, dy, biases = case
    if ext:
        b_gate, b_up, b_down = biases
        y, cache = moe_cpu.experts_forward_cpu(
            x, routing, *ws, *loras, b_gate=b_gate, b_up=b_up, b_down=b_down
        )
        back = moe_cpu.experts_backward_cpu(dy, cache, *ws, need_dw=True, need_db=True)
    else:
        y, cache = moe_cpu.experts_forward_cpu(x, routing, *ws, *loras)
        back = moe_cpu.experts_backward_cpu(dy, cache, *ws, need_dw=True)
    return y, back


def spy_on_runs(monkeypatch) -> list[tuple[int, bool]]:
    """Record (items, in_line) of every run_each from now on."""
    runs = []
    real = cpu_workers.CpuWorkers.run_each

    def spy(self, fn, items, *, in_line=False):
        runs.append((len(items), in_line))
        return real(self, fn, items, in_line=in_line)

    monkeypatch.setattr(cpu_workers.CpuWorkers, "run_each", spy)
    return runs


@pytest.mark.parametrize("ext", [False, True], ids=["plain", "biases"])
@pytest.mark.parametrize("seed", [0, 1])
def test_experts_give_the_same_bits_on_two_workers(monkeypatch, ext, seed):
    case = moe_case(seed)
    in_line = run_moe(case, ext)
    monkeypatch.setattr(cpu_workers, "_PROCESS", two_workers())
    monkeypatch.setattr(moe_cpu, "PIECE_MIN_FLOPS", 0.0)  # these tiny experts are worth workers here
    runs = spy_on_runs(monkeypatch)
    assert_same_bits(in_line, run_moe(case, ext))
    assert len(runs) == 2 and all(n > 1 and not line for n, line in runs)  # forward and backward


@pytest.mark.parametrize("ext", [False, True], ids=["plain", "biases"])
def test_tiny_experts_stay_in_line(monkeypatch, ext):
    monkeypatch.setattr(cpu_workers, "_PROCESS", two_workers())
    runs = spy_on_runs(monkeypatch)
    run_moe(moe_case(0), ext)  # ~0.1 MFLOP an expert
    assert len(runs) == 2 and all(line for _, line in runs)
    logits = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    routing, _ = moe.route_forward_ref(logits, 8, False)  # 256 tokens over 64 experts, top 8
    assert not moe_cpu.experts_in_line(routing, 1024, 512)  # the OLMoE shape: ~100 MFLOP an expert


def optimizer_case():
    rng = np.random.default_rng(7)
    shapes = {"big": (300, 700), "mid": (64, 48), "vec": (33,), "odd": (3, 5, 7)}  # big: 4 chunks
    params = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
    params["strided"] = rng.standard_normal((40, 60), dtype=np.float32)[:, ::2]  # not contiguous
    grads = [{k: rng.standard_normal(p.shape, dtype=np.float32) for k, p in params.items()} for _ in range(3)]
    return params, grads


def run_optimizer():
    params, grads = optimizer_case()
    opt = AdamW(params, OptimConfig(lr=1e-2, weight_decay=0.1, max_grad_norm=1.0, gclip=1.5))
    stats = [opt.step(g) for g in grads]
    return params, opt, stats


def test_adamw_gives_the_same_bits_on_two_workers(monkeypatch):
    p1, o1, s1 = run_optimizer()
    monkeypatch.setattr(cpu_workers, "_PROCESS", two_workers())
    runs = spy_on_runs(monkeypatch)
    assert_same_bits(run_optimizer()[0], p1)  # 240k values: updated in line
    assert runs and all(line for _, line in runs)
    monkeypatch.setattr(adamw_cpu, "PARALLEL_MIN_VALUES", 0)
    runs.clear()
    p2, o2, s2 = run_optimizer()
    assert any(n > 1 and not line for n, line in runs)
    assert_same_bits(p1, p2)
    assert_same_bits(o1._m, o2._m)
    assert_same_bits(o1._v, o2._v)
    assert s1 == s2  # grad, update and param norms: the same float sums in the same order
