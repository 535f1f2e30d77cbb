"""Issue 29's device checks of the fused dense step: graph replay against the eager step, and the
loss curve against the generic (fp32 LoRA) path. Prints figures and PASS/FAIL lines.

    python bench/gpu_29.py replay [--arch moe] [--emulate]   # 4 steps each way: warm-up, capture, 3 replays
    python bench/gpu_29.py curve --steps 50 [--arch moe] [--emulate]

replay: the same model, data and initial adapter trained with gpu_step "eager" and "graph"; the
losses, gradient norms and every LoRA factor after each of the 3 replayed batches must be equal bit
for bit. curve: gpu_step "graph" against "generic" (the op-by-op path: fp32 LoRA products, fp32
activations) over --steps steps; the largest relative difference of the per-step mean
cross-entropy must be within 1%. The model is a Qwen2-shaped file of --layers layers (Q4_K),
smaller than the 1.5B of bench/gpu.py so both runs fit the device call; with --arch moe it is the
Qwen3-30B-A3B shape of bench/gpu.py (128 experts, top-8) cut to --layers layers, LoRA on attention
and every expert stack (issue 30: the MoE layers inside the captured step), and the replay compares
each step's expert counts too. --emulate runs both on the g++ kernel emulator at a tiny size (a dry
run of the code, not a measurement); with --arch moe the tiny MoE model takes --layers layers, so
more than 8 exercises the join of every layer's expert choices that a capture once refused.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.gpu_e2e import DENSE_TARGETS, MOE_TARGETS, SHAPES, TINY, text_samples, write_shaped  # noqa: E402
from engine.testing import SynthSpec  # noqa: E402


def _backend(emulate: bool):
    from engine.backend import Backend, select_backend

    if emulate:
        from tests.kernels.emu_runtime import RecordingRuntime  # captures graphs as CUDA does

        rt = RecordingRuntime()
        return Backend("emulated", rt.xp, "", rt)
    return select_backend("cuda:0")


def _run(path, mode, steps, a):
    from engine.model.model import Model
    from engine.model.targets import TargetSpec
    from engine.train import events as ev
    from engine.train.trainer import TrainConfig, Trainer

    model = Model.load(path, backend=_backend(a.emulate), cache_budget=a.budget)
    targets = MOE_TARGETS if a.arch == "moe" else DENSE_TARGETS
    cfg = TrainConfig(
        targets=TargetSpec(preset="none", patterns=targets), rank=16, alpha=32, n_ctx=a.ctx,
        batch_size=a.batch, steps=steps, lr=a.lr, schedule="constant", max_grad_norm=1.0,
        cache_budget=a.budget, checkpoint_layers="off", norms_every=0, seed=0, gpu_step=mode,
    )  # fmt: skip
    tr = Trainer(model, text_samples(a.batch * steps, int(1.3 * a.ctx) + 16), cfg)
    assert isinstance(tr.start(), ev.Started)
    out, params, counts = [], [], []
    t0 = time.perf_counter()
    for _ in range(steps):
        seen = []
        s = tr.train_step(seen.append)
        counts += [np.asarray(e.counts) for e in seen if isinstance(e, ev.ExpertUsage)]
        if isinstance(s, ev.Failed):
            raise RuntimeError(f"{mode}: {s.message}")
        out.append(s)
        if mode != "generic" and steps <= 8:
            params.append(
                {k: np.asarray(model.backend.to_host(v)).copy() for k, v in tr.trainable.params().items()}
            )
    model.backend.synchronize()
    dt = time.perf_counter() - t0
    print(
        f"{mode}: {steps} steps in {dt:.1f} s; fused {tr._fused is not None}, graph {tr._graph is not None}"
        + (f" (generic: {tr._fused_why})" if tr._fused is None else "")
    )
    if a.check == "replay" and counts:
        params[-1]["expert counts"] = np.stack(counts)  # every step's, compared with the tensors
    return out, params, tr._graph is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check", choices=("replay", "curve"))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--arch", choices=("dense", "moe"), default="dense")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--budget", default="auto")
    ap.add_argument("--emulate", action="store_true")
    a = ap.parse_args()
    if a.arch == "moe":
        spec = replace(TINY["moe"], L=a.layers) if a.emulate else replace(SHAPES["moe"], L=a.layers)
        if a.emulate:
            a.batch, a.ctx = 2, 32
    elif a.emulate:
        spec = SynthSpec.for_arch("qwen2", V=512, C=256, L=2, NH=2, NKV=1, HS=128, F=512, tied=True,
                                  qtype="Q4_K", n_ctx=256, name="tiny")  # fmt: skip
        a.batch, a.ctx = 2, 64
    else:
        spec = SynthSpec.for_arch("qwen2", V=151936, C=1536, L=a.layers, NH=12, NKV=2, HS=128, F=8960,
                                  tied=True, qtype="Q4_K", n_ctx=32768, name="qwen2.5-1.5b")  # fmt: skip
    folder = tempfile.mkdtemp(prefix="gpu29-")
    path = write_shaped(spec, os.path.join(folder, "model.gguf"))
    if a.check == "replay":
        (e, pe, _), (g, pg, captured) = _run(path, "eager", 4, a), _run(path, "graph", 4, a)
        same = all((x.loss, x.grad_norm) == (y.loss, y.grad_norm) for x, y in zip(e, g, strict=True))
        diff = [k for i in range(1, 4) for k in pe[i] if not np.array_equal(pe[i][k], pg[i][k])]
        for x, y in zip(e, g, strict=True):
            print(
                f"  step {x.step}: loss {x.loss!r} / {y.loss!r}, grad norm {x.grad_norm!r} / {y.grad_norm!r}"
            )
        ok = same and not diff and captured
        why = f" (captured: {captured}; scalars equal: {same}; tensors differing: {diff[:5]})"
        print(
            f"{'PASS' if ok else 'FAIL'} graph replay equals the eager step bit for bit over 3 batches"
            + (f" ({spec.name}, {spec.L} layers; expert counts too)" if a.arch == "moe" else "")
            + ("" if ok else why)
        )
    else:
        (f, _, _), (r, _, _) = _run(path, "graph", a.steps, a), _run(path, "generic", a.steps, a)
        rel = [abs(x.mean_ce - y.mean_ce) / abs(y.mean_ce) for x, y in zip(f, r, strict=True)]
        worst = int(np.argmax(rel))
        print("  step  fused-graph  generic-fp32")
        for x, y in list(zip(f, r, strict=True))[:: max(1, a.steps // 10)]:
            print(f"  {x.step:4d}  {x.mean_ce:11.5f}  {y.mean_ce:12.5f}")
        print(
            f"{'PASS' if max(rel) <= 0.01 else 'FAIL'} loss curve within 1% of the fp32 path over {a.steps} "
            f"steps (largest {100 * max(rel):.3f}% at step {worst + 1}; {spec.L} layers, "
            f"B {a.batch} x T {a.ctx})"
        )
    os.unlink(path)


if __name__ == "__main__":
    main()
