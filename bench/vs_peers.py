"""CPU training side by side: our engine against transformers + PEFT (and llama.cpp's llama-finetune
when a build is given), on the same GGUF files and settings, one process per run.

Three workloads (sequence 256, batch 1, AdamW, 2 warm-up steps then 5 measured, median tokens/s):

- dense LoRA: rank 16, alpha 32, on all 7 linear kinds of a Qwen2.5-0.5B-shaped model at Q8_0;
- MoE LoRA: rank 16, alpha 32, on attention and every routed expert of an OLMoE-shaped model
  (64 experts, top 8; scaled to 4 layers of 1024 as bench/common.py's olmoe-1b-7b-scaled) at Q8_0;
- full fine-tuning of every tensor of a 5.5M-parameter dense model in F32.

The files are written once by the project's writer (Q8_0 through its quantizer). The peer loads
exactly the same weights (dequantized by our engine, which is bit-exact with gguf-py) into
transformers' modeling code in float32 (bench/hf_peer.py), with PEFT's LoRA (experts through
`target_parameters`); full fine-tuning is plain torch AdamW. Peak memory is each process's
VmHWM (resident high-water mark). MFU is the FLOPs a step must do (forward 2·N·T, backward 2·N·T
for LoRA or 4·N·T with weight gradients, attention included) over the float32 matmul rate NumPy
measured in this run.

    /path/to/venv-with-torch/bin/python bench/vs_peers.py          # all workloads, ours and the peers
    python bench/vs_peers.py --only ours --workloads dense         # our engine alone
    python bench/vs_peers.py --workloads full --steps 40 --rounds 3   # short steps: more of them, alternated
    python bench/vs_peers.py --llama-finetune ~/llama.cpp/build/bin/llama-finetune

The peers are extras of this script (`pip install torch==2.13.0 transformers peft`), never
dependencies of the project. Prints figures; never passes or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import SHAPES, forward_flops, matmul_rate, proc_status_bytes  # noqa: E402
from engine._blas_env import SPIN_LOG2  # noqa: E402
from engine.testing import SynthSpec, write_model  # noqa: E402

WORKLOADS = {
    "dense": dict(
        spec=replace(SHAPES["qwen2.5-0.5b"], qtype="Q8_0"),
        mode="lora",
        targets=("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"),
        what="LoRA r16 on all 7 linears, Qwen2.5-0.5B shape, Q8_0",
    ),
    "moe": dict(
        spec=replace(SHAPES["olmoe-1b-7b-scaled"], qtype="Q8_0"),
        mode="lora",
        targets=("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps",
                 "ffn_down_exps"),
        what="LoRA r16 on attention + every expert, OLMoE shape (E=64, K=8), Q8_0",
    ),
    "full": dict(
        spec=SynthSpec.for_arch(
            "qwen2", V=8192, C=256, L=4, NH=4, NKV=2, HS=64, F=768, tied=True, n_ctx=1024, name="dense-5.5m"
        ),
        mode="full",
        targets=(),
        what="full fine-tune, 5.5M dense, F32",
    ),
}  # fmt: skip
T, WARMUP, MEASURED, RANK, ALPHA, LR = 256, 2, 5, 16, 32.0, 1e-4


def batch_tokens(V: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, V, size=(1, T)).astype(np.int64)


def make_batch(V: int):
    """One window of T random tokens, labels the next token, every label weighted 1/n."""
    from types import SimpleNamespace

    tokens = batch_tokens(V)
    targets = np.concatenate([tokens[:, 1:], np.full((1, 1), -1)], axis=1)
    n = int((targets >= 0).sum())
    return SimpleNamespace(
        tokens=tokens, positions=np.arange(T)[None], segments=np.zeros((1, T), np.int64), targets=targets,
        weights=np.where(targets >= 0, 1.0 / n, 0.0).astype(np.float32),
    )  # fmt: skip


def step_flops(spec: SynthSpec, mode: str) -> float:
    cfg = _config_of(spec)
    fwd = forward_flops(cfg, T)
    attn = 4.0 * cfg.L * cfg.NH * cfg.HS * (T * (T + 1) / 2)
    return 3.0 * fwd if mode == "full" else 2.0 * fwd + attn


def _config_of(spec: SynthSpec):
    from engine.io.gguf_file import GGUFFile
    from engine.model.archs import ModelConfig

    return ModelConfig.from_gguf(GGUFFile(model_path(spec)))


# --- the runs (each in its own process) ---------------------------------------------------------------


def our_step(model, w: dict):
    """The engine's training step on workload `w` (LoRA on its targets, or every weight trained): the
    Trainable, and a function that takes one step on the benchmark batch as engine.Trainer does on the
    CPU and returns its result and its seconds."""
    from engine.model.targets import TargetSpec, select_full, select_targets
    from engine.train.heap import keep_step_buffers
    from engine.train.optim import AdamW, OptimConfig
    from engine.train.threads import adjust_blas_threads
    from engine.train.train_model import Trainable, loss_and_grads

    cfg = model.config
    if w["mode"] == "lora":
        names = select_targets(model.tensors, TargetSpec(preset="none", patterns=w["targets"]), cfg.L)
        tr = Trainable.init(model, names, rank=RANK, alpha=ALPHA)
    else:
        tr = Trainable.init(model, [], rank=1, full=select_full(model.tensors, ("all",), cfg.L))
    opt = AdamW(tr.params(), OptimConfig(lr=LR, max_grad_norm=0.0))
    batch = make_batch(cfg.V)

    def step():
        adjust_blas_threads()  # what engine.Trainer does before each CPU step
        keep_step_buffers()
        t = time.perf_counter()
        res = loss_and_grads(model, tr, batch)
        opt.step(res.grads)
        return res, time.perf_counter() - t

    return tr, step


def run_ours(path: str, w: dict) -> dict:
    from engine.model.model import Model

    tr, step = our_step(Model.load(path), w)
    times = []
    for i in range(WARMUP + MEASURED):
        res, seconds = step()
        if i >= WARMUP:
            times.append(seconds)
    return dict(times=times, rss=proc_status_bytes("VmHWM"), trainable=tr.n_params, loss=res.mean_ce)


def run_peft(path: str, w: dict) -> dict:
    import torch

    from bench.hf_peer import HF_CLASS, build_hf_model
    from engine.model.model import Model

    torch.manual_seed(0)
    ours = Model.load(path, cache_budget="off")
    spec = w["spec"]
    weights = {n: np.asarray(ours.weights.dense(n), np.float32) for n in ours.weights}
    arch = spec.arch
    model = build_hf_model(arch, HF_CLASS[(arch, bool(spec.E))], spec, weights, torch.float32,
                           experts="grouped_mm" if spec.E else "eager")  # fmt: skip
    del weights, ours
    model.train()
    if w["mode"] == "lora":
        from peft import LoraConfig, get_peft_model

        hf_names = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
                    "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}  # fmt: skip
        modules = [hf_names[t] for t in w["targets"] if t in hf_names]
        params = []
        if any(t.endswith("_exps") for t in w["targets"]):
            params = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
        lcfg = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=modules,
                          target_parameters=params or None)  # fmt: skip
        model = get_peft_model(model, lcfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=LR)
    ids = torch.from_numpy(batch_tokens(spec.V))
    times = []
    for i in range(WARMUP + MEASURED):
        t = time.perf_counter()
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= WARMUP:
            times.append(time.perf_counter() - t)
    trained = sum(p.numel() for p in trainable)
    return dict(times=times, rss=proc_status_bytes("VmHWM"), trainable=trained, loss=float(out.loss))


def run_llama_finetune(path: str, w: dict, binary: str) -> dict:
    """llama.cpp's llama-finetune (full fine-tuning of F32 models, AdamW), one window of T tokens a
    step: each step's time from the timestamps of its log lines ("M.SS.mmm.uuu I epoch ..." after
    every step), the first WARMUP steps left out; peak RSS of the process."""
    import re
    import resource

    data = os.path.join(tempfile.gettempdir(), "vs-peers-finetune.txt")
    words = "the of and to in is was for on are as with"  # 12 words: 40 lines make ~2 windows of T tokens
    with open(data, "w", encoding="utf-8") as f:
        f.write(" ".join(words for _ in range(40 * (WARMUP + MEASURED))))
    out_model = os.path.join(tempfile.gettempdir(), "vs-peers-finetuned.gguf")
    cmd = [binary, "-m", path, "-f", data, "-c", str(T), "-b", str(T), "-ub", str(T), "--epochs", "1",
           "-ngl", "0", "-lr", str(LR), "-o", out_model]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    if os.path.exists(out_model):
        os.remove(out_model)
    log = out.stderr + out.stdout
    # llama.cpp's log stamps are minutes.seconds.milliseconds.microseconds
    found = re.findall(r"(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) I epoch", log)
    stamps = [int(m) * 60 + int(sec) + int(ms) / 1e3 + int(us) / 1e6 for m, sec, ms, us in found]
    steps = np.diff(stamps)[WARMUP - 1 :] if len(stamps) > WARMUP else np.array([])
    if out.returncode != 0 or steps.size == 0:
        tail = "\n".join(log.splitlines()[-5:])
        raise RuntimeError(f"llama-finetune failed (exit {out.returncode}) or logged no steps:\n{tail}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return dict(times=[float(t) for t in steps[:MEASURED]], rss=rss, trainable=0, loss=float("nan"))


def child(args) -> None:
    w = WORKLOADS[args.workload]
    path = model_path(w["spec"])
    if args.who == "ours":
        r = run_ours(path, w)
    elif args.who == "peft":
        r = run_peft(path, w)
    else:
        r = run_llama_finetune(path, w, args.llama_finetune)
    print(json.dumps(r))


# --- the table ----------------------------------------------------------------------------------------


def model_path(spec: SynthSpec) -> str:
    return os.path.join(tempfile.gettempdir(), f"vs-peers-{spec.name}-{spec.arch}-{spec.qtype}.gguf")


def measure(who: str, workload: str, python: str, args) -> dict | None:
    cmd = [python, os.path.abspath(__file__), "--child", who, "--workload", workload]
    cmd += ["--steps", str(MEASURED)]
    if args.llama_finetune:
        cmd += ["--llama-finetune", args.llama_finetune]
    env = dict(os.environ, PYTHONPATH=ROOT)
    # the OpenBLAS spin our engine asks for when it is imported before NumPy, as in the app and the
    # CLI (engine/_blas_env.py); this script loads NumPy first, so each child is given it (torch's
    # own BLAS does not read it)
    env.setdefault("OPENBLAS_THREAD_TIMEOUT", SPIN_LOG2)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        print(f"  {who} on {workload}: failed: {tail}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="dense,moe,full")
    ap.add_argument("--steps", type=int, default=MEASURED, help=f"measured steps a run (default {MEASURED})")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each engine, alternated; their steps are pooled (default 1)")  # fmt: skip
    ap.add_argument("--only", choices=("ours", "peers"), help="run only our engine, or only the peers")
    ap.add_argument("--peer-python", default=sys.executable, help="a Python with torch, transformers, peft")
    ap.add_argument("--llama-finetune", help="path of a llama.cpp llama-finetune binary (full fine-tuning)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    args = ap.parse_args()
    globals()["MEASURED"] = args.steps  # the run functions read it
    if args.child:
        args.who = args.child
        child(args)
        return
    from bench.cpu_profile import machine_lines

    rate = max(matmul_rate(), matmul_rate(n=3072, repeats=3))
    for line in machine_lines():  # the CPU, the BLAS and its kernel, the GEMM rate, numba, the load
        print(line)
    print(f"sequence {T}, batch 1, {WARMUP} warm-up + {MEASURED} measured steps, "
          f"{args.rounds} run(s) of each, alternated")  # fmt: skip
    rows = []
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        path = model_path(w["spec"])
        if not os.path.exists(path):
            write_model(path, w["spec"])
        flops = step_flops(w["spec"], w["mode"])
        who = []
        if args.only != "peers":
            who.append(("ours", sys.executable))
        if args.only != "ours":
            who.append(("peft", args.peer_python))
            if args.llama_finetune and w["mode"] == "full":
                who.append(("llama-finetune", sys.executable))
        results, runs = {}, {}
        for _ in range(args.rounds):  # ours, peer, ours, peer, ...: drift on the host hits both alike
            for label, python in who:
                r = measure(label, name, python, args)
                if r is None:
                    continue
                if label in runs:
                    runs[label]["times"] += r["times"]
                    runs[label]["rss"] = max(runs[label]["rss"], r["rss"])
                else:
                    runs[label] = r
        for label, r in runs.items():
            times = np.array(r["times"])
            tok = T / times
            results[label] = r | dict(med=float(np.median(tok)), lo=float(tok.min()), hi=float(tok.max()),
                                      mfu=flops / float(np.median(times)) / rate)  # fmt: skip
        rows.append((name, w["what"], results))
    print(f"\n{'workload':<9} {'who':<15} {'tokens/s median (min-max)':>27} {'peak RSS':>10} {'MFU':>6} "
          f"{'ours/peer tok/s':>16} {'ours/peer RSS':>14}")  # fmt: skip
    for name, what, results in rows:
        print(f"-- {what}")
        ours = results.get("ours")
        for label, r in results.items():
            ratio = ratio_rss = ""
            if ours is not None and label != "ours":
                ratio = f"{ours['med'] / r['med']:.2f}x"
                ratio_rss = f"{ours['rss'] / r['rss']:.2f}x" if r["rss"] else "-"
            spread = f"{r['med']:.1f} ({r['lo']:.1f}-{r['hi']:.1f})"
            shown = "torch" if label == "peft" and name == "full" else label  # full fine-tuning: no PEFT
            print(f"{name:<9} {shown:<15} {spread:>27} {r['rss'] / 2**30:9.2f}G {r['mfu']:6.0%} "
                  f"{ratio:>16} {ratio_rss:>14}")  # fmt: skip
        if ours is not None:
            steps = " ".join(f"{t:.2f}" for t in ours["times"])
            print(f"{'':<9} ours step times (s): {steps}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
