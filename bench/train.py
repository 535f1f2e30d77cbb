"""Training benchmark: tokens/s, model-FLOPs utilisation and peak memory of the NumPy trainer on CPU.

For the two shapes of bench/forward.py (Qwen2.5-0.5B, and OLMoE-1B-7B scaled down) with rank-16
LoRA on every matmul tensor inside the layers (experts and router included for the MoE shape),
and full-weight training of every tensor of a small dense shape. Each shape runs in its own process
so that its peak resident memory is its own.

FLOPs counted: LoRA runs do the forward pass and the gradients of the activations through the
frozen weights (no weight gradients), about 2x the forward matmul FLOPs plus the attention backward;
full-weight runs also compute weight gradients, about 3x. The LoRA factors' own FLOPs are small and
not counted. MFU = counted FLOPs per second / the measured float32 matmul rate.

    python bench/train.py            # the real shapes (several minutes)
    python bench/train.py --quick    # small shapes, seconds
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import SHAPES, fmt_rate, forward_flops, matmul_rate, proc_status_bytes  # noqa: E402
from engine.model.model import Model  # noqa: E402
from engine.model.targets import TargetSpec, select_full, select_targets  # noqa: E402
from engine.testing import SynthSpec, write_model  # noqa: E402
from engine.train.optim import AdamW, OptimConfig  # noqa: E402
from engine.train.train_model import Trainable, loss_and_grads  # noqa: E402

SMALL_DENSE = SynthSpec.for_arch(
    "qwen2", V=8192, C=512, L=8, NH=8, NKV=2, HS=64, F=1536, tied=True, n_ctx=2048, name="small-dense"
)


def random_batch(V: int, B: int, T: int, seed: int = 0) -> SimpleNamespace:
    """B rows of T tokens, two packed samples per row, loss on every position but each sample's last."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, V, size=(B, T))
    half = T // 2
    positions = np.concatenate([np.arange(half), np.arange(T - half)])[None].repeat(B, 0)
    segments = np.concatenate([np.zeros(half, int), np.ones(T - half, int)])[None].repeat(B, 0)
    targets = np.concatenate([tokens[:, 1:], np.full((B, 1), -1)], axis=1)
    targets[:, half - 1] = -1
    n = int((targets >= 0).sum())
    weights = np.where(targets >= 0, 1.0 / n, 0.0).astype(np.float32)
    return SimpleNamespace(
        tokens=tokens, positions=positions, segments=segments, targets=targets, weights=weights
    )


def peak_rss_bytes() -> int:
    """This process's peak resident memory. VmHWM belongs to the address space, so it starts afresh in a
    spawned process, where getrusage's ru_maxrss would carry over the parent's peak across fork + exec."""
    return proc_status_bytes("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_shape(name: str, path: str, mode: str, T: int, B: int, steps: int, checkpoint: bool, q) -> None:
    """In a fresh process, so that peak RSS is this run's: load, train `steps` steps, report."""
    model = Model.load(path, dtype=np.float32)
    cfg = model.config
    if mode == "lora":
        targets = select_targets(model.tensors, TargetSpec(preset="all"), cfg.L)
        tr = Trainable.init(model, targets, rank=16, alpha=32)
    else:
        tr = Trainable.init(model, [], rank=1, full=select_full(model.tensors, ("all",), cfg.L))
    opt = AdamW(tr.params(), OptimConfig(lr=1e-4))
    batch = random_batch(cfg.V, B, T)
    loss_and_grads(model, tr, batch, checkpoint=checkpoint)  # warm up
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        res = loss_and_grads(model, tr, batch, checkpoint=checkpoint)
        opt.step(res.grads)
        times.append(time.perf_counter() - t)
    dt = float(np.median(times))
    fwd = forward_flops(cfg, T) * B
    attn = 4.0 * cfg.L * cfg.NH * cfg.HS * (T * (T + 1) / 2) * B
    flops = (3.0 * fwd if mode == "full" else 2.0 * fwd + attn) + (attn if checkpoint else 0.0)
    if checkpoint:
        flops += fwd  # the recomputed forward
    q.put(dict(
        name=name, mode=mode, arch=cfg.arch, params=model.n_params, trainable=tr.n_params, T=T, B=B,
        step_s=dt, tokens_per_s=B * T / dt, flops_per_s=flops / dt, loss=res.mean_ce,
        peak_rss=peak_rss_bytes(), checkpoint=checkpoint,
        E=cfg.E, K=cfg.K,
    ))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small shapes only")
    ap.add_argument("--ctx", type=int, default=256, help="tokens per row (default 256)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per shape (default 3, median reported)")
    ap.add_argument(
        "--checkpoint", action="store_true", help="also run with per-layer gradient checkpointing"
    )
    args = ap.parse_args()
    if args.quick:
        runs = [("qwen2-tiny", SHAPES["qwen2-tiny"], "lora"), ("olmoe-tiny", SHAPES["olmoe-tiny"], "lora"),
                ("qwen2-tiny", SHAPES["qwen2-tiny"], "full")]  # fmt: skip
    else:
        runs = [("qwen2.5-0.5b", SHAPES["qwen2.5-0.5b"], "lora"),
                ("olmoe-1b-7b-scaled", SHAPES["olmoe-1b-7b-scaled"], "lora"),
                ("small-dense", SMALL_DENSE, "full")]  # fmt: skip
    print(f"machine: {os.cpu_count()} cores, numpy {np.__version__}")
    ctx = mp.get_context("spawn")
    folder = tempfile.mkdtemp(prefix="bench-train-")
    for name, spec, mode in runs:
        path = os.path.join(folder, f"{name}.gguf")
        if not os.path.exists(path):
            write_model(path, spec)
        for checkpoint in (False, True) if args.checkpoint else (False,):
            peak = max(matmul_rate(), matmul_rate(n=3072, repeats=3))
            q = ctx.Queue()
            p = ctx.Process(target=run_shape, args=(name, path, mode, args.ctx, 1, args.steps, checkpoint, q))
            p.start()
            r = q.get()
            p.join()
            what = "rank-16 LoRA on all matmuls" if mode == "lora" else "full-weight, every tensor"
            moe = f", E={r['E']} K={r['K']}" if r["E"] else ""
            print(
                f"\n{name} ({r['arch']}{moe}, {r['params'] / 1e6:.0f}M parameters), {what}"
                f"{', layer checkpointing' if checkpoint else ''}: {r['trainable'] / 1e6:.2f}M trainable"
            )
            print(f"  {r['B']} x {r['T']} tokens/step  {r['step_s']:.2f} s/step  "
                  f"{r['tokens_per_s']:8.1f} tokens/s  "
                  f"{fmt_rate(r['flops_per_s'])}  MFU {r['flops_per_s'] / peak:5.1%} (of {fmt_rate(peak)})  "
                  f"peak RSS {r['peak_rss'] / 2**30:.2f} GiB")  # fmt: skip
    for f in os.listdir(folder):
        os.unlink(os.path.join(folder, f))
    os.rmdir(folder)


if __name__ == "__main__":
    main()
