"""Data-parallel training on this machine's cores: step time, bytes sent per rank per step and time
in communication for 1, 2 and 4 local ranks, and a paper estimate of a Qwen3-30B-A3B-shaped LoRA
run across 4 machines on 1 GbE and 10 GbE from those figures.

    python bench/distributed.py [--ranks 1 2 4] [--shapes olmoe-1b-7b-scaled qwen2-tiny] [--steps 6]
        [--batch 4] [--ctx 256] [--rank 16] [--allreduce-mb 1 16 64]

Each row is one run of `engine.Trainer` (rank-16 LoRA on every linear tensor, experts included;
the global batch is the same for every rank count: --batch windows of --ctx tokens a step), each
rank a process started by MPICH's `mpiexec` (1 rank: the single collective, no MPI). Figures are
medians over the steps after the first (warm-up):
- step s: the step's wall time on rank 0; tok/s: the global batch's tokens over it;
- payload MB: the bytes each rank gives the gradient all-reduce (fp32 LoRA gradients, the loss
  and token counts); sent MB/rank: what a bandwidth-optimal all-reduce sends from each rank,
  2 (N-1)/N of the payload;
- transfer ms: from every rank's arrival to the sums being in place (the communication itself);
  wait ms: waiting for the slowest rank to arrive (load imbalance, not the network); both per
  step, the largest over the ranks.
Then all-reduces alone (every rank arriving together, --allreduce-mb payloads) give the local
transport's rate. The estimate at the end takes the 30B shape's adapter size from its tensor shapes,
the compute rate measured by the 1-rank run, and the network's bandwidth.

On a 2-core machine, 2 and 4 ranks share 2 cores: the rows show what communication costs, not
a speed-up (that needs cores or machines per rank). Benchmarks print figures; they never pass or fail.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MB = 1e6


def write_inputs(folder: str, shape: str) -> tuple[str, str]:
    from bench.common import SHAPES
    from engine.testing import write_model

    model = write_model(os.path.join(folder, f"{shape}.gguf"), SHAPES[shape])
    data = os.path.join(folder, "data.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for i in range(256):
            q = f"question {i}: " + " ".join(f"w{(i * 7 + j) % 97}" for j in range(10))
            a = " ".join(f"a{(i * 5 + j) % 89}" for j in range(20))
            turns = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            f.write(json.dumps({"messages": turns}) + "\n")
    return model, data


# --- one rank ----------------------------------------------------------------------------------------


def worker(args) -> None:
    import numpy as np

    from engine.model.targets import TargetSpec
    from engine.train import events as ev
    from engine.train.collective import open_collective
    from engine.train.trainer import TrainConfig, Trainer

    comm = open_collective(args.collective)
    cfg = TrainConfig(
        targets=TargetSpec(preset="all"), rank=args.rank, alpha=2.0 * args.rank, lr=1e-4, steps=args.steps,
        n_ctx=args.ctx, batch_size=args.batch, grad_accum=1, schedule="constant", seed=0,
    )  # fmt: skip
    rows = []
    last = {"t": 0.0}

    def on_event(e) -> None:
        if isinstance(e, ev.Step):
            s = comm.stats
            rows.append(
                {"seconds": e.elapsed_s - last["t"], "tokens": e.tokens, "sent": s.sent_bytes,
                 "payload": s.payload_bytes, "transfer": s.transfer_s, "wait": s.wait_s}
            )  # fmt: skip
            last["t"] = e.elapsed_s
            s.reset()

    tr = Trainer(args.model, args.data, cfg, collective=comm)
    result = tr.run(on_event)
    if isinstance(result, ev.Failed):
        sys.exit(f"rank {comm.rank}: {result.message}")
    # all-reduces alone: every rank arrives together (a barrier first), payloads of --allreduce-mb
    alone = []
    for mb in args.allreduce_mb if comm.size > 1 else []:
        x = [np.ones(int(mb * MB / 4), np.float32)]
        times = []
        for _ in range(5):
            comm.barrier()
            comm.stats.reset()
            comm.allreduce(x)
            times.append(comm.stats.transfer_s)
        alone.append({"mb": mb, "seconds": statistics.median(times), "sent": comm.stats.sent_bytes})
    figures = {"rank": comm.rank, "size": comm.size, "steps": rows, "alone": alone,
               "trainable": tr.trainable.n_params}  # fmt: skip
    with open(os.path.join(args.out, f"rank{comm.rank}.json"), "w", encoding="utf-8") as f:
        json.dump(figures, f)
    comm.close()


# --- the table ---------------------------------------------------------------------------------------


def run_ranks(n: int, model: str, data: str, args, folder: str) -> list[dict]:
    from engine.train.collective import find_mpiexec

    out = os.path.join(folder, f"out-{os.path.basename(model)}-{n}")
    os.makedirs(out, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--data", data,
          "--out", out, "--steps", str(args.steps), "--batch", str(args.batch), "--ctx", str(args.ctx),
          "--rank", str(args.rank), "--allreduce-mb", *[str(x) for x in args.allreduce_mb]]  # fmt: skip
    env = dict(os.environ)
    if n > 1:  # as --ranks does: the cores shared between the ranks (one rank: the engine's own choice)
        env.setdefault("OPENBLAS_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    if n == 1:
        command = [*me, "--collective", "single"]
    else:
        mpiexec = find_mpiexec()
        if mpiexec is None:
            sys.exit("no mpiexec: pip install -e '.[mpi]'")
        command = [mpiexec, "-n", str(n), *me, "--collective", "mpi"]
    subprocess.run(command, check=True, env=env)
    return [json.load(open(os.path.join(out, f"rank{r}.json"), encoding="utf-8")) for r in range(n)]


def summarize(ranks: list[dict]) -> dict:
    steps = [r["steps"][1:] for r in ranks]  # the first step warms caches
    n = len(steps[0])
    med = statistics.median
    return {
        "ranks": len(ranks),
        "step_s": med(s["seconds"] for s in steps[0]),
        "tok_s": med(s["tokens"] / s["seconds"] for s in steps[0]),
        "payload_mb": med(s["payload"] for s in steps[0]) / MB,
        "sent_mb": med(s["sent"] for s in steps[0]) / MB,
        "transfer_ms": max(med(s[i]["transfer"] for i in range(n)) for s in steps) * 1e3,
        "wait_ms": max(med(s[i]["wait"] for i in range(n)) for s in steps) * 1e3,
        "trainable": ranks[0]["trainable"],
        "alone": ranks[0]["alone"],
    }


def lora_params(spec, preset: str, rank: int) -> int:
    from engine.model.lora import lora_shapes
    from engine.testing import tensor_shapes

    kinds = {"attention": ("attn_q", "attn_k", "attn_v", "attn_output"),
             "experts": ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}[preset]  # fmt: skip
    total = 0
    for name, shape in tensor_shapes(spec).items():
        if name.startswith("blk.") and name.split(".")[2] in kinds:
            a, b = lora_shapes(name, shape, rank)
            total += math.prod(a) + math.prod(b)
    return total


GPU_TOK_S_12L = 11000.0  # bench/GPU_NOTES.md: the 12-layer Qwen3-30B-A3B shape on one H100, engine, cache off


def estimate(rows: list[dict], shape: str, args) -> None:
    """A Qwen3-30B-A3B-shaped LoRA run across 4 machines, from the measured figures."""
    from bench.common import QWEN3_30B_A3B as big
    from bench.common import SHAPES, matmul_params_per_token

    one = next(r for r in rows if r["ranks"] == 1)
    # the 1-rank run's training rate in matmul FLOPs: forward 2, backward to the inputs 2 per weight
    rate = one["tok_s"] * 4 * matmul_params_per_token(_config(SHAPES[shape]))
    tokens = 4 * 1024  # a global batch of 4 windows of 1024 tokens, a quarter on each machine
    cpu_s = 4 * matmul_params_per_token(_config(big)) * tokens / 4 / rate
    gpu_s = tokens / 4 / (GPU_TOK_S_12L * 12 / 48)  # 48 layers: about a quarter of the 12-layer rate
    print(f"\n## Estimate: Qwen3-30B-A3B shape (48 L, C 2048, 128 experts of 768, top 8), 4 machines, "
          f"{tokens} tokens a step (1024 on each), rank-{args.rank} LoRA, fp32 gradients")  # fmt: skip
    print(f"compute a step on each machine: {cpu_s:.0f} s on a CPU like this one ({rate / 1e9:.1f} GFLOP/s "
          f"measured by the 1-rank {shape} run), {gpu_s:.2f} s on an H100 ({GPU_TOK_S_12L:.0f} tok/s for 12 "
          "layers, bench/GPU_NOTES.md, taken as a quarter of that for 48)")  # fmt: skip
    local = next((r["alone"] for r in rows if r["alone"]), [])
    if local:
        best = max(a["sent"] / a["seconds"] for a in local)
        print(f"this machine's MPI (shared memory) sent up to {best / MB:.0f} MB/s per rank in an all-reduce")
    print("| LoRA on | gradients | sent per machine | 1 GbE: s (share: CPU, H100) | 10 GbE: s (share) |")
    print("|---|---|---|---|---|")
    for preset in ("attention", "attention + experts"):
        n = lora_params(big, "attention", args.rank)
        if preset != "attention":
            n += lora_params(big, "experts", args.rank)
        payload = 4 * n
        sent = payload * 2 * 3 / 4  # ring all-reduce over 4 machines
        cells = []
        for bw in (117 * MB, 1170 * MB):  # what TCP carries on 1 GbE and 10 GbE
            t = sent / bw
            cells.append(f"{t:.2f} s ({100 * t / (cpu_s + t):.0f}%, {100 * t / (gpu_s + t):.0f}%)")
        print(f"| {preset} ({n / 1e6:.0f}M values) | {payload / MB:,.0f} MB | {sent / MB:,.0f} MB | "
              f"{cells[0]} | {cells[1]} |")  # fmt: skip


def _config(spec):
    """What bench.common.matmul_params_per_token reads, from a shape's numbers."""
    from types import SimpleNamespace

    return SimpleNamespace(C=spec.C, NH=spec.NH, NKV=spec.NKV, HS=spec.HS, L=spec.L, V=spec.V,
                           F=spec.F, E=spec.E, K=spec.K, F_exp=spec.F_exp, F_shexp=spec.F_shexp,
                           is_moe=spec.E > 0)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--shapes", nargs="+", default=["olmoe-1b-7b-scaled", "qwen2-tiny"])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--allreduce-mb", type=float, nargs="+", default=[1, 16, 64])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--collective", default="single", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    when = time.strftime("%Y-%m-%d %H:%M")
    print(f"# bench/distributed.py, {when}, {os.cpu_count()} cores; batch {args.batch} x {args.ctx} tokens "
          f"a step, rank-{args.rank} LoRA on every linear tensor")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for shape in args.shapes:
            model, data = write_inputs(folder, shape)
            rows = [summarize(run_ranks(n, model, data, args, folder)) for n in args.ranks]
            print(f"\n## {shape}: {rows[0]['trainable']:,} trainable values")
            print("| ranks | step s | tok/s | payload MB | sent MB/rank | transfer ms | wait ms | transfer |")
            print("|---|---|---|---|---|---|---|---|")
            for r in rows:
                share = 100 * r["transfer_ms"] / 1e3 / r["step_s"]
                cells = [f"{r['step_s']:.3f}", f"{r['tok_s']:.0f}", f"{r['payload_mb']:.2f}",
                         f"{r['sent_mb']:.2f}", f"{r['transfer_ms']:.1f}", f"{r['wait_ms']:.1f}",
                         f"{share:.1f}%"]  # fmt: skip
                print(f"| {r['ranks']} | " + " | ".join(cells) + " |")
            for r in rows:
                for a in r["alone"]:
                    rate = a["sent"] / a["seconds"] / MB
                    print(f"all-reduce alone, {r['ranks']} ranks, {a['mb']:g} MB: "
                          f"{a['seconds'] * 1e3:.1f} ms, {rate:.0f} MB/s sent per rank")  # fmt: skip
            if shape == args.shapes[0]:
                estimate(rows, shape, args)


if __name__ == "__main__":
    main()
