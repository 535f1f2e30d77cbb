"""Forward-pass benchmark: prefill and decode tokens/s of the NumPy engine on CPU.

Writes random-weight models shaped like Qwen2.5-0.5B and like OLMoE-1B-7B (scaled down to fit),
loads them, and prints prefill tokens/s, decode tokens/s, and the share of this machine's measured
float32 matmul rate that the forward pass achieves (model FLOPs utilisation).

    python bench/forward.py            # the two real shapes (a few minutes, ~6 GB of memory)
    python bench/forward.py --quick    # small shapes, seconds
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (  # noqa: E402
    SHAPES,
    fmt_rate,
    forward_flops,
    matmul_params_per_token,
    matmul_rate,
)
from engine.model.generate import GREEDY, SamplingConfig, generate  # noqa: E402
from engine.model.model import Model  # noqa: E402
from engine.testing import write_model  # noqa: E402


def bench_shape(name: str, prefill: int, decode: int, peak: float, folder: str) -> None:
    spec = SHAPES[name]
    t = time.perf_counter()
    path = write_model(os.path.join(folder, f"{name}.gguf"), spec)
    t_write = time.perf_counter() - t
    t = time.perf_counter()
    model = Model.load(path, dtype=np.float32)
    t_load = time.perf_counter() - t
    cfg = model.config
    n_params = model.n_params
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, cfg.V, size=(1, prefill))
    model.forward(tokens[:, :16])  # warm up
    t = time.perf_counter()
    model.forward(tokens)
    t_prefill = time.perf_counter() - t
    prefill_flops = forward_flops(cfg, prefill)
    cfg_decode = SamplingConfig(**{**GREEDY.__dict__, "max_new_tokens": decode})
    prompt = tokens[0, :32]
    t = time.perf_counter()
    [g] = generate(model, prompt, sampling=cfg_decode)
    t_gen = time.perf_counter() - t
    # time of the decode steps alone: subtract a prefill of the 32-token prompt
    t = time.perf_counter()
    model.forward(prompt[None], last_only=True)
    t_prompt = time.perf_counter() - t
    t_decode = max(t_gen - t_prompt, 1e-9)
    n_dec = len(g.tokens)
    # decode is bound by memory: every step streams the weights a token touches (float32 in memory)
    weight_bytes = 4 * matmul_params_per_token(cfg)
    decode_flops = sum(forward_flops(cfg, 1, 32 + i) for i in range(n_dec - 1))
    print(
        f"\n{name}: {cfg.arch}, {n_params / 1e6:.0f}M parameters, L={cfg.L} C={cfg.C} NH={cfg.NH} "
        f"NKV={cfg.NKV} HS={cfg.HS}"
        + (f" E={cfg.E} K={cfg.K} F_exp={cfg.F_exp}" if cfg.E else f" F={cfg.F}")
        + f" V={cfg.V}; weights F16 on disk, float32 in memory"
    )
    print(
        f"  write {t_write:.1f} s, load+dequantize {t_load:.1f} s, "
        f"weights stored {model.weights.stored_bytes / 2**30:.2f} GiB, "
        f"dequantized {model.weights.dequantized_bytes / 2**30:.2f} GiB"
    )
    print(
        f"  prefill  {prefill:5d} tokens: {prefill / t_prefill:8.1f} tokens/s  "
        f"{fmt_rate(prefill_flops / t_prefill):>14}  MFU {prefill_flops / t_prefill / peak:6.1%}"
    )
    print(
        f"  decode   {n_dec:5d} tokens: {(n_dec - 1) / t_decode:8.1f} tokens/s  "
        f"{fmt_rate(decode_flops / t_decode):>14}  MFU {decode_flops / t_decode / peak:6.1%}  "
        f"weights read {weight_bytes * (n_dec - 1) / t_decode / 1e9:5.1f} GB/s"
    )
    del model
    os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small shapes only")
    ap.add_argument(
        "--prefill", type=int, default=256, help="prompt tokens for the prefill timing (default 256)"
    )
    ap.add_argument("--decode", type=int, default=32, help="tokens to decode (default 32)")
    ap.add_argument("--shapes", nargs="*", help=f"subset of {', '.join(SHAPES)}")
    args = ap.parse_args()
    shapes = args.shapes or (
        ["qwen2-tiny", "olmoe-tiny"] if args.quick else ["qwen2.5-0.5b", "olmoe-1b-7b-scaled"]
    )
    threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("OPENBLAS_NUM_THREADS") or "default"
    print(f"machine: {os.cpu_count()} cores, BLAS threads {threads}, numpy {np.__version__}")
    with tempfile.TemporaryDirectory() as folder:
        for name in shapes:
            # the ceiling is re-measured next to each shape, and the best is used: a busy machine
            # lowers it, and an underestimated ceiling would overstate utilisation
            peak = max(matmul_rate(), matmul_rate(n=3072, repeats=3))
            print(f"measured float32 matmul rate (best of 2048^3 and 3072^3): {fmt_rate(peak)}")
            bench_shape(name, args.prefill, args.decode, peak, folder)


if __name__ == "__main__":
    main()
