"""The CPU's MoE experts multiplied straight from int8 codes (engine.kernels.blockq_cpu) against the
same experts dequantized to float32 and multiplied by OpenBLAS, on the MoE workload's file of
bench/vs_peers.py (OLMoE shape scaled: E 64, top 8, C 1024, F 512, Q8_0; written here if missing).

Two figures, each the median of `--reps` runs after a warm-up:
- one layer's experts, forward and backward (engine.kernels.moe_cpu, LoRA rank 16 on gate, up and
  down, 256 tokens) on the CPU workers the engine would use, once with the store's expert stacks
  (codes) and once with float32 arrays of the same experts;
- the 64 gate products alone on one thread: x (32, 1024) @ W_e^T from codes and from float32, and
  the backward's dy (32, 512) @ W_e from the transposed codes and from float32.

    python bench/expert_codes.py
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/expert_codes.py   # NumPy's AVX-512 kernels

With `--model FILE.gguf [--budget off] [--layer N]`: that file's layer N experts alone, with the cache
budget given, as the store gives them (codes where it makes them: with the cache off, the forward's
made on each use) against the same experts dequantized on each use (no codes), forward and backward.

Prints figures; never passes or fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import engine  # noqa: E402, F401  before NumPy: the OpenBLAS spin the engine asks for (engine/_blas_env.py)

# isort: split
import numpy as np  # noqa: E402

from bench.cpu_profile import machine_lines  # noqa: E402
from bench.vs_peers import WORKLOADS, model_path  # noqa: E402


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


class _Uncoded:
    """An expert stack without its codes: moe_cpu multiplies by its experts as float32."""

    def __init__(self, stack) -> None:
        self._stack = stack
        self.shape = stack.shape

    def __getitem__(self, e: int) -> np.ndarray:
        return self._stack[e]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--model", help="a GGUF file with routed experts (default: the MoE workload's)")
    ap.add_argument("--budget", default="auto", help="cache budget with --model (auto, off, 4G)")
    ap.add_argument("--layer", type=int, default=0, help="the layer whose experts run")
    a = ap.parse_args()
    from threadpoolctl import threadpool_limits

    from engine.kernels import cpu_workers
    from engine.kernels.blockq_cpu import xwt_cpu
    from engine.kernels.moe_cpu import experts_backward_cpu, experts_forward_cpu
    from engine.model.model import Model
    from engine.testing import random_experts, write_model
    from engine.train.threads import adjust_blas_threads

    spec = WORKLOADS["moe"]["spec"]
    path = a.model or model_path(spec)
    if not a.model and not os.path.exists(path):
        write_model(path, spec)
    for line in machine_lines():
        print(line)
    model = Model.load(path, cache_budget=a.budget if a.model else "auto")
    stacks = [model.weights[f"blk.{a.layer}.ffn_{k}_exps.weight"] for k in ("gate", "up", "down")]
    # --model: the experts dequantized on each use (a stack without codes) rather than all at once
    floats = [_Uncoded(s) for s in stacks] if a.model else [np.asarray(s) for s in stacks]
    E, F, C = stacks[0].shape
    K = model.config.K
    if stacks[0].codes(0) is None:
        sys.exit("the store gives no codes for these experts (type, or a cache budget under their size)")
    rng = np.random.default_rng(0)
    x, routing, _, loras, dy = random_experts(rng, 256, C, F, E, K, 16, w_scale=0.03, lora_scale=0.03,
                                              s=2.0, renorm=False)  # fmt: skip
    adjust_blas_threads()  # the BLAS threads and CPU workers a training step gets

    def layer(weights):
        def forward():
            return experts_forward_cpu(x, routing, *weights, *loras)

        def both():
            _, cache = forward()
            experts_backward_cpu(dy, cache, *weights)

        fwd = median_ms(forward, a.reps)
        return fwd, median_ms(both, a.reps) - fwd

    print(f"one layer's experts (E {E}, top {K}, C {C}, F {F}, 256 tokens, LoRA r16), "
          f"{cpu_workers.workers()} CPU worker(s):")  # fmt: skip
    for what, weights in (("codes", stacks), ("float32", floats)):
        fwd, bwd = layer(weights)
        print(f"  {what:8} forward {fwd:6.1f} ms  backward {bwd:6.1f} ms")
    if a.model:
        return
    xe = rng.standard_normal((32, C), dtype=np.float32)
    de = rng.standard_normal((32, F), dtype=np.float32)
    codes = [stacks[0].codes(e) for e in range(E)]
    transposes = [stacks[0].codes(e, transposed=True) for e in range(E)]
    with threadpool_limits(1):
        runs = {
            "forward, codes": lambda: [xwt_cpu(xe, w) for w in codes],
            "forward, float32": lambda: [floats[0][e] @ xe.T for e in range(E)],
            "backward, codes": lambda: [xwt_cpu(de, w) for w in transposes],
            "backward, float32": lambda: [de @ floats[0][e] for e in range(E)],
        }
        print(f"the {E} gate products of 32 rows, one thread:")
        flops = 2.0 * E * 32 * F * C
        for what, fn in runs.items():
            ms = median_ms(fn, a.reps)
            print(f"  {what:18} {ms:6.1f} ms  {flops / ms / 1e6:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
