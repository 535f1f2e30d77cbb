"""Memory benchmark of QLoRA at rest: peak resident memory, seconds per step and the share of each step
spent dequantizing, for a rank-16 LoRA run on every linear tensor (experts included for MoE), with the
weight cache off and with the default ("auto") budget; beside the engine's own memory estimate.

A model is a real GGUF file (`--model PATH`) or a generated shape (`--shape NAME`): the project's
writer puts random but valid quantized blocks straight into the file (a few thousand blocks quantized
once, then tiled with random offsets), so a 17 GB MoE file takes a minute to write, not a day to
quantize; it is deleted afterwards unless `--keep`. Free disk is checked first. Each run is its own
process (peak RSS is VmHWM, the high-water mark of resident memory, file pages included) and trains
through `engine.Trainer` on a generated dataset, as a user's run would.

    python bench/memory.py --model SmolLM2-135M-Instruct.Q4_1.gguf --steps 20
    python bench/memory.py --shape qwen2.5-7b --steps 2 --budgets off
    python bench/memory.py --shape qwen3-30b-a3b --steps 1 --budgets off --preset moe

Figures, not verdicts: a benchmark never passes or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import QWEN3_30B_A3B, proc_status_bytes  # noqa: E402
from engine.io.gguf_write import LazyTensor, write_gguf  # noqa: E402
from engine.io.quantize import quantize  # noqa: E402
from engine.testing import SynthSpec, model_metadata, tensor_shapes  # noqa: E402

GIB = 2**30

SHAPES = {
    # Qwen2.5-7B: 28 layers, 3584 wide, 28 query / 4 KV heads of 128, FFN 18944, vocab 152064, untied
    "qwen2.5-7b": SynthSpec.for_arch(
        "qwen2", V=152064, C=3584, L=28, NH=28, NKV=4, HS=128, F=18944, tied=False, qtype="Q4_K",
        n_ctx=32768, name="qwen2.5-7b-shaped",
    ),
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    # small shapes to try the bench itself
    "tiny-dense": SynthSpec.for_arch(
        "qwen2", V=4096, C=256, L=4, NH=4, NKV=2, HS=64, F=768, tied=False, qtype="Q4_K", n_ctx=1024
    ),
    "tiny-moe": SynthSpec.for_arch(
        "qwen3moe", V=4096, C=256, L=4, NH=4, NKV=2, HS=64, E=16, K=4, F_exp=256, qtype="Q4_K", n_ctx=1024
    ),
}  # fmt: skip


# --- generating a model -------------------------------------------------------------------------


def _block_pool(qtype: str, n_blocks: int = 4096, seed: int = 0) -> np.ndarray:
    """Valid blocks of `qtype` (bytes, (n_blocks, type_size)) quantized from random normal values."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((n_blocks // 8, 8 * 256)) * 0.02).astype(np.float32)
    raw = quantize(values, qtype)  # (rows, bytes per row) of whole blocks
    type_size = raw.shape[-1] // (values.shape[-1] // _block_size(qtype))
    return raw.reshape(-1, type_size)


def _block_size(qtype: str) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]


def _random_blocks(pool: np.ndarray, shape: tuple[int, ...], qtype: str, seed: int) -> np.ndarray:
    """Stored bytes (*rows, row bytes) of a tensor: blocks drawn from the pool at random."""
    rng = np.random.default_rng(seed)
    per_row = shape[-1] // _block_size(qtype)
    n = int(np.prod(shape[:-1])) * per_row
    idx = rng.integers(0, pool.shape[0], n)
    return pool[idx].reshape(*shape[:-1], per_row * pool.shape[1])


def generate_model(spec: SynthSpec, path: str) -> str:
    """Write `spec` as a GGUF file of random valid `spec.qtype` blocks (norms as F32)."""
    pool = _block_pool(spec.qtype)
    shapes = tensor_shapes(spec)
    tensors = {}
    for i, (name, shape) in enumerate(shapes.items()):
        if len(shape) == 1:
            tensors[name] = ((1.0 + 0.05 * np.random.default_rng(i).standard_normal(shape)).astype(
                np.float32), "F32")  # fmt: skip
        else:
            tensors[name] = (
                LazyTensor(shape, lambda shape=shape, i=i: _random_blocks(pool, shape, spec.qtype, i)),
                spec.qtype,
            )
    return write_gguf(path, spec.arch, model_metadata(spec), tensors)


def file_bytes_of(spec: SynthSpec) -> int:
    from engine.io.gguf_write import tensor_bytes

    return sum(tensor_bytes(s, spec.qtype if len(s) > 1 else "F32") for s in tensor_shapes(spec).values())


def write_dataset(path: str, n: int = 400, seed: int = 0) -> str:
    """Chats of plain words, long enough to fill many windows of a few hundred tokens."""
    rng = np.random.default_rng(seed)
    words = "the of and to in is was for on are as with his they at be this from have or by one".split()
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            q = " ".join(rng.choice(words, 20))
            a = " ".join(rng.choice(words, 120))
            msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            f.write(json.dumps({"messages": msgs}) + "\n")
    return path


# --- one measured run (a child process) ---------------------------------------------------------


def child(args) -> None:
    """Train `--steps` steps through engine.Trainer; print one JSON line of figures."""
    from engine import Step, TargetSpec, TrainConfig, Trainer

    preset = {"all": TargetSpec(preset="all"), "moe": TargetSpec(preset="none", patterns=(
        "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"))}[
        args.preset]  # fmt: skip
    config = TrainConfig(
        targets=preset, rank=16, alpha=32, n_ctx=args.ctx, steps=args.steps, lr=1e-4,
        cache_budget=args.budget, checkpoint_layers=args.checkpoint, norms_every=1_000_000,
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer = Trainer(args.model, args.data, config)
    steps: list[dict] = []
    plan = {}

    def on_event(e) -> None:
        if type(e).__name__ == "Started":
            plan.update(e.plan.memory_bytes)
        if isinstance(e, Step):
            store = trainer.model.weights.stats
            steps.append(dict(s=e.tokens / e.tokens_per_s, tokens=e.tokens, dequant_s=store.dequant_seconds))

    result = trainer.run(on_event)
    wall = time.perf_counter() - t0
    if type(result).__name__ == "Failed":
        print(json.dumps({"failed": result.message}))
        return
    deq = np.diff([0.0] + [s["dequant_s"] for s in steps])
    print(json.dumps(dict(
        steps=[s["s"] for s in steps], tokens=[s["tokens"] for s in steps], dequant=deq.tolist(),
        peak_rss=proc_status_bytes("VmHWM"), estimate=plan, wall=wall,
        budget=trainer.model.weights.budget, checkpoint=trainer.memory.checkpoint,
        cache_peak=trainer.model.weights.stats.peak_cache_bytes,
    )))  # fmt: skip


def run_child(model: str, data: str, budget: str, a, checkpoint: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model", model, "--data", data,
           "--budget", budget, "--steps", str(a.steps), "--ctx", str(a.ctx), "--preset", a.preset,
           "--checkpoint", checkpoint]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()
        return {"failed": tail[-1] if tail else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", help="a GGUF file")
    src.add_argument("--shape", choices=sorted(SHAPES), help="generate a model of this shape")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument(
        "--budgets",
        default="off,auto",
        help="cache budgets to run, comma-separated; BUDGET:on runs it with layer checkpointing",
    )
    ap.add_argument(
        "--preset",
        choices=("all", "moe"),
        default="all",
        help="all: every linear tensor (experts included); moe: attention + routed experts",
    )
    ap.add_argument(
        "--checkpoint",
        default="auto",
        choices=("auto", "on", "off"),
        help="layer checkpointing (default auto: the memory plan decides)",
    )
    ap.add_argument("--keep", action="store_true", help="keep a generated model file")
    ap.add_argument("--dir", default=None, help="where to write generated files (default: a temp folder)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--budget", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    if not a.model and not a.shape:
        ap.error("give --model PATH or --shape NAME")
    folder = a.dir or tempfile.mkdtemp(prefix="bench-memory-")
    os.makedirs(folder, exist_ok=True)
    made = None
    if a.shape:
        spec = SHAPES[a.shape]
        made = os.path.join(folder, f"{a.shape}.gguf")
        need = file_bytes_of(spec)
        free = shutil.disk_usage(folder).free
        if not os.path.exists(made) and free < need * 1.1:  # a kept file is used as it is
            sys.exit(f"{folder}: {free / GIB:.1f} GiB free, the {a.shape} file needs {need / GIB:.1f} GiB")
        if not os.path.exists(made):
            t = time.perf_counter()
            generate_model(spec, made)
            print(f"wrote {made} ({os.path.getsize(made) / GIB:.2f} GiB) in {time.perf_counter() - t:.0f} s")
        model = made
    else:
        model = a.model
    data = write_dataset(os.path.join(folder, "data.jsonl"))
    size = os.path.getsize(model)
    print(f"model {model}: {size / GIB:.2f} GiB; rank-16 LoRA ({a.preset}), context {a.ctx}, "
          f"{a.steps} steps; {os.cpu_count()} cores")  # fmt: skip
    print(f"{'budget':>8} {'ckpt':>5} {'peak RSS':>10} {'x file':>7} {'s/step':>8} {'tok/s':>8} "
          f"{'dequant':>8} {'estimate':>10} {'est err':>8}")  # fmt: skip
    try:
        for item in a.budgets.split(","):
            budget, _, ckpt = item.partition(":")
            r = run_child(model, data, budget, a, ckpt or a.checkpoint)
            if "failed" in r:
                print(f"{budget:>8}  failed: {r['failed']}")
                continue
            steps = r["steps"][1:] if len(r["steps"]) > 2 else r["steps"]  # the first step warms caches
            deq = r["dequant"][1:] if len(r["dequant"]) > 2 else r["dequant"]
            s = float(np.median(steps))
            tok = float(np.median(r["tokens"]))
            share = float(np.sum(deq) / np.sum(steps))
            est = r["estimate"]["total"]
            print(f"{budget:>8} {'on' if r['checkpoint'] else 'off':>5} {r['peak_rss'] / GIB:9.2f}G "
                  f"{r['peak_rss'] / size:6.2f}x {s:8.2f} {tok / s:8.1f} {share:7.0%} {est / GIB:9.2f}G "
                  f"{(est - r['peak_rss']) / r['peak_rss']:+7.0%}")  # fmt: skip
            print(f"{'':>8} steps (s): {' '.join(f'{x:.2f}' for x in r['steps'])}; dequantizing (s): "
                  f"{' '.join(f'{x:.2f}' for x in r['dequant'])}; cache budget {r['budget'] / GIB:.2f} GiB "
                  f"(peak {r['cache_peak'] / GIB:.2f} GiB); wall {r['wall']:.0f} s")  # fmt: skip
            parts = {k: v for k, v in r["estimate"].items() if k in (
                "stored", "mapped", "cache", "buffers", "trainable", "gradients", "activations", "transient",
                "head", "runtime")}  # fmt: skip
            print(f"{'':>8} estimate: " + ", ".join(f"{k} {v / 2**20:.0f}M" for k, v in parts.items()))
    finally:
        if made and not a.keep:
            os.unlink(made)
        os.unlink(data)
        if not a.dir:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
