"""Where a CPU training step spends its time: every op of `engine.model.ops`, the head's parts, AdamW
and the weight store's dequantization timed by wrappers (self time: an op's own, its timed callees'
taken off), on the workloads of bench/vs_peers.py (dense LoRA, MoE LoRA, full fine-tuning), with the
machine named first: the CPU, the BLAS threadpoolctl finds (library, version, kernel, threads),
the OpenBLAS variables in force, NumPy's float32 GEMM rate, numba's presence and the load average.

    python bench/cpu_profile.py                         # all three workloads, 2 warm-up + 4 timed steps
    python bench/cpu_profile.py --workloads full --steps 20
    python bench/cpu_profile.py --no-jit                # the NumPy reference path (TUNE_NO_JIT=1)
    python bench/cpu_profile.py --model big.gguf --budget off --warmup 0 --steps 1

"gemm" rows are the products inside the linear maps, experts and head (the BLAS calls with the
bias and LoRA adds around them); the other rows are what the issue calls "time outside the GEMMs".
Prints figures; never passes or fails.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_flags() -> str:
    """The wide-vector features that matter here (AVX-512, bf16, AMX), from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    keep = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni")
                    return " ".join(k for k in keep if k in flags) or "no AVX2"
    except OSError:
        pass
    return "?"


def machine_lines() -> list[str]:
    """The CPU, BLAS, OpenBLAS variables, GEMM rate, numba and load: what every figure depends on."""
    import numpy as np
    from threadpoolctl import threadpool_info

    from bench.common import matmul_rate

    lines = [f"CPU: {cpu_name()}, {os.cpu_count()} cores ({cpu_flags()})"]
    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            lines.append(
                f"BLAS: {lib.get('internal_api')} {lib.get('version')}, kernel {lib.get('architecture')}, "
                f"{lib.get('num_threads')} threads ({os.path.basename(lib.get('filepath', ''))})"
            )
    env = {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")}
    lines.append("OpenBLAS variables: " + (", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "none"))
    rate = max(matmul_rate(), matmul_rate(n=3072, repeats=3))
    lines.append(f"NumPy {np.__version__} float32 GEMM (2048^3 / 3072^3): {rate / 1e9:.0f} GFLOP/s")
    try:
        from engine.kernels import jit

        lines.append(f"compiled CPU kernels: {jit.status()}")
    except ImportError:  # a checkout from before them (to profile it against this one)
        lines.append("compiled CPU kernels: none in this checkout")
    lines.append(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return lines


class Timers:
    """Wall time per name, total and self (time in timed callees taken off), and calls."""

    def __init__(self) -> None:
        self.total: collections.Counter = collections.Counter()
        self.self_: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self._stack: list[list[float]] = []  # per open timer: [child time]

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._stack.append([0.0])
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t
                child = self._stack.pop()[0]
                self.total[name] += dt
                self.self_[name] += dt - child
                self.calls[name] += 1
                if self._stack:
                    self._stack[-1][0] += dt

        return timed

    def reset(self) -> None:
        self.total.clear()
        self.self_.clear()
        self.calls.clear()


# what is timed: (module, attribute, row name)
GEMM_ROWS = {
    "linear_forward",
    "linear_backward",
    "linear_group_forward",
    "linear_group_backward",
    "experts_forward",
    "experts_backward",
    "head gemm",
}


def install(t: Timers) -> None:
    from engine.io import weights
    from engine.kernels import cross_entropy
    from engine.model import layers, ops
    from engine.train import optim

    for name in ops.__all__:
        fn = getattr(ops, name)
        if callable(fn) and hasattr(fn, "reference"):
            setattr(ops, name, t.wrap(name, fn))
    # the head's parts (self time of lm_head_loss: the softmax / cross-entropy rows)
    cross_entropy.project_ref = t.wrap("head gemm", cross_entropy.project_ref)
    cross_entropy.head_backward = t.wrap("head gemm", cross_entropy.head_backward)
    optim.AdamW.step = t.wrap("adamw", optim.AdamW.step)
    weights.WeightStore._dequantize = t.wrap("dequantize", weights.WeightStore._dequantize)
    layers.add_grad = t.wrap("add_grad", layers.add_grad)


MOE_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def io_counters() -> tuple[int, float]:
    """(bytes this process read from storage, CPU seconds it used) so far."""
    read = 0
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    read = int(line.split()[1])
    except OSError:
        pass
    t = os.times()
    return read, t.user + t.system


def profile(
    workload: str, steps: int, warmup: int, model_file: str | None = None, budget: str = "auto"
) -> None:
    import numpy as np

    from bench import vs_peers
    from engine.model.model import Model
    from engine.testing import write_model

    if model_file:  # a GGUF file: LoRA on attention and the routed experts (or every linear of a dense one)
        w = dict(
            mode="lora", targets=MOE_TARGETS, what=f"{os.path.basename(model_file)}, cache budget {budget}"
        )
        path = model_file
    else:
        w = vs_peers.WORKLOADS[workload]
        path = vs_peers.model_path(w["spec"])
        if not os.path.exists(path):
            write_model(path, w["spec"])
    _, step_once = vs_peers.our_step(Model.load(path, cache_budget=budget), w)
    t = Timers()
    install(t)
    times = []
    read0 = cpu0 = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            t.reset()
            read0, cpu0 = io_counters()
        _, seconds = step_once()
        if i >= warmup:
            times.append(seconds)
    read1, cpu1 = io_counters()
    step = float(np.median(times))
    mean = float(np.mean(times))
    print(f"\n-- {w['what']}: step {step * 1e3:.1f} ms median ({' '.join(f'{x * 1e3:.0f}' for x in times)}),"
          f" {vs_peers.T / step:.1f} tok/s; load {os.getloadavg()[0]:.2f}; per step: read from storage "
          f"{(read1 - read0) / steps / 2**30:.2f} GiB, CPU {(cpu1 - cpu0) / steps:.2f} s")  # fmt: skip
    print(f"{'':2}{'op':<22} {'calls':>6} {'self ms':>9} {'% step':>7} {'total ms':>9}")
    rows = sorted(t.self_.items(), key=lambda kv: -kv[1])
    gemm = other = 0.0
    for name, s in rows:
        per = s / steps * 1e3
        if name in GEMM_ROWS:
            gemm += per
        else:
            other += per
        print(f"{'':2}{name:<22} {t.calls[name] / steps:6.0f} {per:9.1f} {per / (mean * 1e3):7.1%} "
              f"{t.total[name] / steps * 1e3:9.1f}")  # fmt: skip
    rest = mean * 1e3 - gemm - other
    print(f"{'':2}{'(untimed: glue, Python)':<22} {'':>6} {rest:9.1f} {rest / (mean * 1e3):7.1%}")
    print(
        f"{'':2}gemm rows {gemm:.0f} ms, everything else {other + rest:.0f} ms "
        f"of a {mean * 1e3:.0f} ms mean step"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="dense,moe,full")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-jit", action="store_true", help="the NumPy reference path (TUNE_NO_JIT=1)")
    ap.add_argument("--model", help="a GGUF file instead of the workloads (LoRA on attention + experts)")
    ap.add_argument("--budget", default="auto", help="the weight cache budget with --model (auto, off, 4G)")
    a = ap.parse_args()
    if a.no_jit:
        os.environ["TUNE_NO_JIT"] = "1"
    from engine._blas_env import SPIN_LOG2

    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", SPIN_LOG2)  # as the engine asks (NumPy not loaded yet)
    for line in machine_lines():
        print(line)
    if a.model:
        profile("", a.steps, a.warmup, a.model, a.budget)
        return
    for name in a.workloads.split(","):
        profile(name, a.steps, a.warmup)


if __name__ == "__main__":
    main()
