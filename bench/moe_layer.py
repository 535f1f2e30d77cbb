"""One MoE layer's routed experts on the CPU: forward and backward times of the NumPy path the
trainer runs (the CPU twin, engine.kernels.moe_cpu.experts_forward_cpu / experts_backward_cpu),
with rank-r LoRA on the three expert tensors, and the rate of its base products against this
machine's float32 matmul rate and the rate of a ~32-row expert product in the two layouts OpenBLAS is given
(`x @ W.T` and `W @ x.T`, bench/CPU_NOTES.md). The layer is timed in line and on the CPU workers
the trainer uses when BLAS has two or more threads (engine.kernels.cpu_workers).

Default: the OLMoE shape of bench/vs_peers.py (C = 1024, F_exp = 512, E = 64, K = 8, 256 tokens,
rank 16), random weights and routing. Prints figures; never passes or fails.

    python bench/moe_layer.py
    python bench/moe_layer.py --tokens 512 --experts 128 --top-k 8 --width 2048 --ffn 768
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# the OpenBLAS spin the engine asks for (engine/_blas_env.py), set here because NumPy loads first
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import fmt_rate, matmul_rate  # noqa: E402
from engine.kernels import cpu_workers, moe_cpu  # noqa: E402
from engine.testing import random_experts  # noqa: E402
from engine.train.heap import keep_step_buffers  # noqa: E402


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--width", type=int, default=1024, help="model width C")
    p.add_argument("--ffn", type=int, default=512, help="expert width F")
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="CPU workers of the second timing (default 2)")
    a = p.parse_args(argv)
    N, C, F, E, K, r = a.tokens, a.width, a.ffn, a.experts, a.top_k, a.rank
    rng = np.random.default_rng(0)
    x, routing, (w_gate, w_up, w_down), loras, dy = random_experts(
        rng, N, C, F, E, K, r, w_scale=0.03, lora_scale=0.01, s=2.0, renorm=False
    )
    cache = None

    def forward():
        nonlocal cache
        _, cache = moe_cpu.experts_forward_cpu(x, routing, w_gate, w_up, w_down, *loras)

    def backward():
        moe_cpu.experts_backward_cpu(dy, cache, w_gate, w_up, w_down)

    keep_step_buffers()  # as the trainer does before its first step
    times = {}
    for count in (1, a.workers):  # in line, then on the CPU workers (engine.kernels.cpu_workers)
        cpu_workers.set_workers(count)
        for _ in range(2):
            forward()
            backward()
        times[count] = median_time(forward, a.repeats), median_time(backward, a.repeats)
    cpu_workers.set_workers(None)
    base = 3 * 2 * N * K * C * F  # the three base products of every routed pair, one pass
    rows = N * K // E
    xs = rng.standard_normal((E, rows, C), dtype=np.float32)
    t_xw = median_time(lambda: [xs[e] @ w_gate[e].T for e in range(E)], a.repeats)
    t_wx = median_time(lambda: [w_gate[e] @ xs[e].T for e in range(E)], a.repeats)
    flops_one = 2 * E * rows * C * F
    print(f"MoE layer: {N} tokens, C={C}, F={F}, E={E}, K={K}, LoRA rank {r} on gate/up/down; "
          f"float32 matmul rate here {fmt_rate(matmul_rate())}")  # fmt: skip
    for count, (t_fwd, t_bwd) in times.items():
        how = "in line (BLAS as it is)" if count == 1 else f"{count} CPU workers, 1 BLAS thread each"
        print(f"  {how}:")
        print(f"    forward  {t_fwd * 1e3:7.1f} ms  base products at {fmt_rate(base / t_fwd)}")
        print(f"    backward {t_bwd * 1e3:7.1f} ms  base products (dx) at {fmt_rate(base / t_bwd)}")
    print(f"  one {rows}-row product per expert: x @ W.T {fmt_rate(flops_one / t_xw)}, "
          f"W @ x.T {fmt_rate(flops_one / t_wx)}")  # fmt: skip


if __name__ == "__main__":
    main()
