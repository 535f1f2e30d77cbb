"""Shared pieces of the benchmarks: the machine's measured matmul rate, FLOP counts, model shapes.

Benchmarks print figures; they never pass or fail on speed.
"""

from __future__ import annotations

import time

import numpy as np

from engine.model.archs import ModelConfig
from engine.testing import SynthSpec

# Qwen3-30B-A3B: 48 layers, 2048 wide, 32 query / 4 KV heads of 128, 128 experts (8 used) of 768, in Q4_K
# (the GPU benches' MoE model; too big for this machine's float32)
QWEN3_30B_A3B = SynthSpec.for_arch(
    "qwen3moe", V=151936, C=2048, L=48, NH=32, NKV=4, HS=128, E=128, K=8, F_exp=768, qtype="Q4_K",
    n_ctx=32768, name="qwen3-30b-a3b-shaped",
)  # fmt: skip

# Real models' shapes, and versions scaled to fit a 2-core, 24 GiB machine in float32.
SHAPES = {
    # Qwen2.5-0.5B: 24 layers, 896 wide, 14 query / 2 KV heads of 64, FFN 4864, vocab 151936, tied output
    "qwen2.5-0.5b": SynthSpec.for_arch(
        "qwen2",
        V=151936,
        C=896,
        L=24,
        NH=14,
        NKV=2,
        HS=64,
        F=4864,
        tied=True,
        qtype="F16",
        n_ctx=4096,
        name="qwen2.5-0.5b-shaped",
    ),
    # OLMoE-1B-7B: 16 layers, 2048 wide, 16 heads of 128, 64 experts (8 used) of width 1024, vocab 50304.
    # Scaled down: 4 layers, 1024 wide, 8 heads of 128, experts of width 512; expert count and top-k kept.
    "olmoe-1b-7b-scaled": SynthSpec.for_arch(
        "olmoe",
        V=50304,
        C=1024,
        L=4,
        NH=8,
        NKV=8,
        HS=128,
        E=64,
        K=8,
        F_exp=512,
        qtype="F16",
        n_ctx=4096,
        name="olmoe-1b-7b-scaled",
    ),
    # small shapes for a quick look (--quick)
    "qwen2-tiny": SynthSpec.for_arch(
        "qwen2", V=4096, C=256, L=4, NH=4, NKV=2, HS=64, F=768, tied=True, n_ctx=1024
    ),
    "olmoe-tiny": SynthSpec.for_arch(
        "olmoe", V=4096, C=256, L=4, NH=4, NKV=4, HS=64, E=16, K=4, F_exp=128, n_ctx=1024
    ),
}


def proc_status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in bytes: "VmRSS" (resident now) or
    "VmHWM" (the peak, which starts afresh in a spawned process); 0 where there is none (not Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def matmul_rate(n: int = 2048, repeats: int = 5, dtype=np.float32) -> float:
    """Best observed FLOP/s of an n x n x n matmul: the ceiling the model code is compared with."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    a @ b  # warm up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best


def matmul_params_per_token(cfg: ModelConfig) -> int:
    """Weights each token multiplies with: attention, FFN (or K experts, shared expert, router), output."""
    attn = cfg.C * cfg.NH * cfg.HS * 2 + cfg.C * cfg.NKV * cfg.HS * 2
    if cfg.is_moe:
        ffn = cfg.K * 3 * cfg.C * cfg.F_exp + cfg.E * cfg.C + 3 * cfg.C * cfg.F_shexp
    else:
        ffn = 3 * cfg.C * cfg.F
    return cfg.L * (attn + ffn) + cfg.V * cfg.C


def forward_flops(cfg: ModelConfig, T: int, past: int = 0) -> float:
    """FLOPs of a forward pass over T new tokens after `past` cached ones (matmuls and attention)."""
    dense = 2.0 * matmul_params_per_token(cfg) * T
    # q.k and p.v: for token t, 2 * 2 * NH * HS * (past + t + 1) per layer
    keys = T * past + T * (T + 1) / 2
    attn = 4.0 * cfg.L * cfg.NH * cfg.HS * keys
    return dense + attn


def fmt_rate(x: float) -> str:
    return f"{x / 1e9:.1f} GFLOP/s"
