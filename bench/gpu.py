"""Speed of the engine on this machine's GPU: each CUDA kernel against ceilings measured on the same GPU,
then whole training steps of two real model shapes beside transformers + PEFT (bench/gpu_e2e.py).

Prints figures; never passes or fails on speed.

Run on a device machine (one H100; Python 3.12 with CuPy, torch, transformers and PEFT already there,
no network), in one call of about 6 minutes (hard limit: --budget-s 540 for the whole script). The
engine's only missing dependency there is gguf (pure Python): fetch its wheel here once, as
bench/gpu_check.py says (`.whl/`, ignored by git), then run with carry [".whl"]:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 \
      && python3 bench/gpu.py 2>&1 | tee $OUT/gpu_stdout.txt

It writes $OUT/gpu.txt (both tables), $OUT/gpu.json (every figure: ceilings, kernel rows, each
end-to-end run's step times, losses, gradient norms and memory) and $OUT/gpu_e2e.log (the child
processes' output). Without a GPU, `python bench/gpu.py --emulate` runs the end-to-end code path on
the g++ kernel emulator at tiny shapes (no kernel timings, no peer; about 40 s), to show it works.

1. Ceilings, measured first: a bf16 matrix product (cuBLAS gemmEx through the engine's own
   `CudaRuntime.gemm`, 8192 x 8192 x 8192, random data, fp32 accumulation) in TFLOP/s; the same in
   fp32 (CUBLAS_COMPUTE_32F_PEDANTIC, the engine's fp32 GEMMs); a 1 GiB device-to-device copy in
   GB/s, counting bytes read plus bytes written. (~10 s)
2. Each kernel, through its twin as the engine calls it (allocations and launches included), at
   a Llama-3-8B-shaped size (B*T = 4096 tokens, C = 4096, 32 query / 8 KV heads of 128, FFN 14336,
   vocabulary 128256, bf16 frozen weights, LoRA rank 16 everywhere): the median of --repeats CUDA-
   event timings after warm-up, on random data; the work it must do (bytes for memory-bound
   kernels, FLOPs for matrix ones); the achieved GB/s or TFLOP/s; the floor (work over the matching
   ceiling) and the time over that floor. Attention runs both ways the engine has, the tensor-core
   path training takes ("gemm": bf16 operands, the whole square of scores) and the flash kernels
   (fp32 SIMT, used for decoding); both are counted as the useful causal FLOPs (forward 4, backward
   10 per visible (query, key) pair and head dimension) against the bf16 ceiling. A kernel that
   raises is a row with the error. (~1-2 min, NVRTC compilation included)
3. End to end (`end_to_end_rows`, bench/gpu_e2e.py has the details): training tokens/s, step time,
   TFLOP/s, MFU and peak GPU memory of
   (a) a Qwen2.5-1.5B-shaped model at Q4_K (28 layers), LoRA on every linear tensor, and
   (b) a Qwen3-30B-A3B-shaped MoE at Q4_K cut to --moe-layers layers (default 12 of 48: the file,
       the peer's 15 GB of bf16 weights and both runs fit the call), LoRA on attention and every
       expert stack;
   and on request (`--e2e gptoss deepseek2`, also cut to --moe-layers):
   (c) a gpt-oss-20b-shaped MoE (MXFP4 experts, the rest Q8_0; sinks, every other layer a 128-token
       window, biases, clamped SwiGLU), LoRA on attention and every expert stack, beside transformers'
       GptOss (eager attention: it takes no SDPA) + PEFT;
   (d) a DeepSeek-V2-Lite-shaped MoE at Q4_K (MLA, a dense first layer, 64 routed + 2 shared experts),
       LoRA on attn_output (llama.cpp adapts no MLA projection) and every routed expert stack, beside
       transformers' DeepseekV2 + PEFT on the same tensors;
   B=4 windows x T=1024 tokens a step, rank 16, 2 warm-up + 5 measured steps (median). The engine
   runs once per weight-cache budget (`off`: QLoRA at rest, every matrix dequantized at each use;
   `auto`: bf16 copies kept while memory allows); the peer is transformers + PEFT on the same shape
   (bf16 base, random init, SDPA, `torch._grouped_mm` experts where the installed transformers has
   them, else its eager loop, said in the note). Each run is its own process; the model files are
   generated in the call (~5 s and ~20 s). FLOPs a step, the same for both sides: 4*N_active per
   token (frozen base: forward 2N, input-gradient backward 2N) + attention 6*NH*(HS + HS_v) per
   visible (query, key) pair and layer (sliding windows counted); MFU = (FLOPs / step time) / the
   bf16 ceiling of part 1. Memory: peak allocated (CuPy pool bytes in use, followed by a memory hook
   / torch.cuda.max_memory_allocated), reserved (pool total / max_memory_reserved) and device (free
   memory at the process's start less at its end); "x" columns are engine / peer. A run that fails is
   a row with its error. (~3-4 min; each run is capped, and a run the budget cannot fit is a
   "skipped" row)

The whole Qwen3-30B-A3B shape (48 layers, a 17 GB Q4_K file) end to end beside PEFT needs an H200
(141 GB): PEFT's bf16 weights alone are 61 GB and its activations at B 4 x T 1024 another ~25 GB, and
the engine with the weight cache off holds the 17 GB of Q4_K blocks plus about 1.1 GB of activations
a layer (fp32 g, u, h and the pair rows), ~70 GB; on an H100 either may run out of memory, which is
its row's error. One device call of about 8 minutes (file ~1 min, each side ~3 min):

    python bench/gpu.py --sections e2e --e2e moe --moe-layers 48 --budgets off --measure 3 --budget-s 560

    python bench/gpu.py [--sections kernels e2e] [--repeats 20] [--only attention lm_head ...]
        [--e2e dense moe gptoss deepseek2] [--moe-layers 12] [--batch 4] [--ctx 1024] [--warmup 2]
        [--measure 5] [--budgets off,auto] [--no-peer] [--budget-s 540] [--caps engine:dense=80,...]
        [--emulate]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


@dataclass
class Row:
    name: str  # what ran
    shape: str  # at what size
    ms: float  # median time per call
    work: float  # bytes moved (kind "GB/s") or FLOPs (kind "TFLOP/s")
    kind: str  # "GB/s" or "TFLOP/s"
    rate: float = 0.0  # achieved, in `kind`
    floor_ms: float = 0.0  # work over the matching ceiling
    note: str = ""


def timed(cp, fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() over `repeats` runs, each between two CUDA events."""
    for _ in range(warmup):
        fn()
    cp.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def ceilings(cp, rt, repeats: int) -> dict[str, float]:
    """Measured bf16 and fp32 GEMM TFLOP/s and device-to-device copy GB/s."""
    from engine.kernels.linear import to_bf16

    rng = cp.random.default_rng(1)
    n = 8192
    a16 = to_bf16(rt, rng.standard_normal((n, n), dtype=cp.float32))
    b16 = to_bf16(rt, rng.standard_normal((n, n), dtype=cp.float32))
    c = cp.empty((n, n), cp.float32)
    ms = timed(cp, lambda: rt.gemm(a16, b16, c, trans_b=True), repeats)
    bf16 = 2 * n**3 / ms / 1e9
    m = 4096
    a32 = rng.standard_normal((m, m), dtype=cp.float32)
    b32 = rng.standard_normal((m, m), dtype=cp.float32)
    c32 = cp.empty((m, m), cp.float32)
    ms32 = timed(cp, lambda: rt.gemm(a32, b32, c32, trans_b=True), max(3, repeats // 4))
    fp32 = 2 * m**3 / ms32 / 1e9
    size = 1 << 30
    src = cp.full(size, 7, cp.uint8)
    dst = cp.empty_like(src)
    stream = cp.cuda.get_current_stream().ptr

    def copy():
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, size, 3, stream)  # 3: device to device

    ms = timed(cp, copy, repeats)
    return {"bf16_tflops": bf16, "fp32_tflops": fp32, "copy_gbs": 2 * size / ms / 1e6}


def kernel_rows(cp, rt, N: int, repeats: int, only: set[str] | None) -> list[Row]:
    """Each twin at a Llama-3-8B-shaped size (see the module docstring)."""
    from engine.kernels import adamw, attention, cross_entropy, embedding, glu, linear, norm, rope
    from engine.kernels.linear import LoraTerm

    C, NH, NKV, HS, F, V, r = 4096, 32, 8, 128, 14336, 128256, 16
    B = 2
    T = N // B
    rng = cp.random.default_rng(2)

    def rnd(*shape, scale=1.0):
        return rng.standard_normal(shape, dtype=cp.float32) * np.float32(scale)

    rows: list[Row] = []

    def want(key: str) -> bool:
        return not only or key in only

    def add(name, shape, fn, work, kind, note=""):
        ms = timed(cp, fn, repeats)
        rows.append(Row(name, shape, ms, float(work), kind, note=note))
        print(f"  {name:<28} {shape:<32} {ms:9.3f} ms", flush=True)

    def section_norm() -> None:
        x, w, dy = rnd(N, C), rnd(C), rnd(N, C)
        _, cache = norm.rmsnorm_forward(x, w, 1e-5)
        add("rmsnorm_forward", f"({N}, {C})", lambda: norm.rmsnorm_forward(x, w, 1e-5), 12 * N * C, "GB/s")
        fn = lambda: norm.rmsnorm_backward(dy, cache, w)  # noqa: E731
        add("rmsnorm_backward", f"({N}, {C})", fn, 12 * N * C, "GB/s")
        qh, wh = rnd(N * NH, HS), rnd(HS)
        fn = lambda: norm.rmsnorm_forward(qh, wh, 1e-5)  # noqa: E731
        add("rmsnorm_forward (q heads)", f"({N * NH}, {HS})", fn, 12 * N * NH * HS, "GB/s")

    def section_rope() -> None:
        q = rnd(B, T, NH, HS)
        pos = np.tile(np.arange(T), (B, 1))
        cos, sin = (cp.asarray(a) for a in rope.rope_angles(pos, HS, 500000.0))
        for style in ("norm", "neox"):
            fn = lambda s=style: rope.rope_forward(q, cos, sin, s)  # noqa: E731
            add(f"rope_forward {style}", f"({B}, {T}, {NH}, {HS})", fn, 8 * q.size, "GB/s")

    def section_swiglu() -> None:
        g, u, dh = rnd(N, F, scale=2.0), rnd(N, F), rnd(N, F)
        _, cache = glu.glu_forward(g, u)
        add("swiglu_forward", f"({N}, {F})", lambda: glu.glu_forward(g, u), 12 * N * F, "GB/s")
        add("swiglu_backward", f"({N}, {F})", lambda: glu.glu_backward(dh, cache), 20 * N * F, "GB/s")

    def section_embedding() -> None:
        table = linear.to_bf16(rt, rnd(V, C))
        tokens = cp.asarray(np.random.default_rng(3).integers(0, V, (B, T)))
        lora = LoraTerm(rnd(V, r), rnd(C, r, scale=0.01), 2.0)
        fn = lambda: embedding.get_rows_on(rt, table, tokens)  # noqa: E731
        add("get_rows bf16", f"{N} of ({V}, {C})", fn, 6 * N * C, "GB/s")
        dx = rnd(B, T, C)
        _, cache = embedding.embedding_forward(table, tokens, lora)
        fn = lambda: embedding.embedding_backward(dx, cache)  # noqa: E731
        add("embedding_backward LoRA", f"{N} x ({V}, r {r})", fn, 4 * N * C + 8 * N * r, "GB/s",
            note="scatter-add of (N, r) rows; dB GEMM")  # fmt: skip
        dW = cp.zeros((V, C), cp.float32)
        fn = lambda: embedding.scatter_add_rows_on(rt, dW, tokens, dx)  # noqa: E731
        add("scatter_add_rows", f"{N} rows of {C}", fn, 12 * N * C, "GB/s", note="rows + distinct rows r/w")

    def section_linear() -> None:
        x = rnd(B, T, C)
        add("f32_to_bf16", f"({N}, {C})", lambda: linear.to_bf16(rt, x), 6 * N * C, "GB/s")
        for n_out, label in ((C, "attn_q"), (F, "ffn_up")):
            w16 = linear.to_bf16(rt, rnd(n_out, C, scale=C**-0.5))
            lo = LoraTerm(rnd(r, C, scale=0.01), rnd(n_out, r, scale=0.01), 2.0)
            _, cache = linear.linear_forward(x, w16, None, lo)
            dy = rnd(B, T, n_out)
            flops = 2 * N * C * n_out
            shape = f"({N}, {C}) x ({n_out}, {C})"
            fn = lambda w=w16, lo=lo: linear.linear_forward(x, w, None, lo)  # noqa: E731
            add(f"linear_forward bf16 {label}", shape, fn, flops + 4 * N * r * (C + n_out), "TFLOP/s",
                note="+ LoRA r16 fp32, x cast to bf16")  # fmt: skip
            fn = lambda w=w16, c=cache, d=dy: linear.linear_backward(d, c, w)  # noqa: E731
            add(f"linear_backward bf16 {label}", shape, fn, flops + 8 * N * r * (C + n_out), "TFLOP/s",
                note="dx + LoRA grads")  # fmt: skip

    def section_attention() -> None:
        q, k, v = rnd(B, T, NH, HS), rnd(B, T, NKV, HS), rnd(B, T, NKV, HS)
        pos = np.tile(np.arange(T), (B, 1))
        mask = cp.asarray(attention.attention_mask(pos, pos))
        visible = B * NH * T * (T + 1) / 2
        shape = f"B {B} T {T} NH {NH} NKV {NKV} HS {HS}"
        notes = {  # the engine's pick for training rows first (engine/kernels/attention_gemm.py)
            "gemm": ("bf16 tensor cores; whole square", "4 GEMMs + Z again; whole square"),
            "flash": ("fp32 SIMT; causal", "fp32 SIMT; 7 products"),
        }
        for method, (fwd_note, bwd_note) in notes.items():
            y, cache = attention.attention_forward_on(rt, q, k, v, mask, HS**-0.5, method)
            dy = rnd(*y.shape)
            fn = lambda m=method: attention.attention_forward_on(rt, q, k, v, mask, HS**-0.5, m)  # noqa: E731
            add(f"attention_forward {method}", shape, fn, 4 * visible * HS, "TFLOP/s", note=fwd_note)
            fn = lambda c=cache, d=dy: attention.attention_backward(d, c)  # noqa: E731
            add(f"attention_backward {method}", shape, fn, 10 * visible * HS, "TFLOP/s", note=bwd_note)

    def section_lm_head() -> None:
        h = rnd(N, C)
        w16 = linear.to_bf16(rt, rnd(V, C, scale=C**-0.5))
        targets = np.random.default_rng(4).integers(0, V, N)
        weights = np.ones(N, np.float32)
        lo = LoraTerm(rnd(r, C, scale=0.01), rnd(V, r, scale=0.01), 2.0)
        flops = 2 * N * C * V
        shape = f"({N}, {C}) x ({V}, {C}) bf16"
        fn = lambda: cross_entropy.lm_head_loss(h, w16, targets, weights, lora=lo, backward=False)  # noqa: E731
        add("lm_head_loss forward", shape, fn, flops, "TFLOP/s", note="1 GEMM pass + stats, LoRA")
        fn = lambda: cross_entropy.lm_head_loss(h, w16, targets, weights, lora=lo)  # noqa: E731
        add("lm_head_loss fwd+bwd", shape, fn, 3 * flops, "TFLOP/s", note="3 GEMM passes, LoRA")

    def section_adamw() -> None:
        shapes = []
        for _ in range(32):
            for n_in, n_out in ((C, C), (C, 1024), (C, 1024), (C, C), (C, F), (C, F), (F, C)):
                shapes += [(r, n_in), (n_out, r)]
        params = [rnd(*s) for s in shapes]
        grads = [rnd(*s, scale=1e-3) for s in shapes]
        m = [cp.zeros(s, cp.float32) for s in shapes]
        v = [cp.zeros(s, cp.float32) for s in shapes]
        n = sum(int(p.size) for p in params)
        step = [0]
        hyper = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, gclip=0.0, max_grad_norm=1.0)

        def adam():
            step[0] += 1
            adamw.adamw_step(params, grads, m, v, [step[0]] * len(params), [True] * len(params), **hyper)

        add("adamw_step", f"{len(params)} tensors, {n / 1e6:.1f}M values", adam, 32 * n, "GB/s",
            note="one host read per step")  # fmt: skip

    for key, section in (
        ("norm", section_norm), ("rope", section_rope), ("swiglu", section_swiglu),
        ("embedding", section_embedding), ("linear", section_linear), ("attention", section_attention),
        ("lm_head", section_lm_head), ("adamw", section_adamw),
    ):  # fmt: skip
        if not want(key):
            continue
        try:
            section()
        except Exception as exc:  # noqa: BLE001 - a failing kernel is a row, the others still run
            text = f"raised {type(exc).__name__}: {exc}".replace("\n", " ")[:300]
            rows.append(Row(key, "(raised)", float("nan"), 0.0, "GB/s", note=text))
            print(f"  {key}: {text}", flush=True)
    return rows


def end_to_end_rows(args: argparse.Namespace, ceil: dict[str, float], log) -> tuple[list[Row], list[dict]]:
    """Whole training steps timed end to end (bench/gpu_e2e.py): a `Row` per run for the kernel
    table (work = FLOPs of a step, against the bf16 ceiling) and the full records for the e2e table."""
    from bench.gpu_e2e import CAPS, E2EOptions, run_end_to_end

    caps = dict(CAPS)
    for item in filter(None, (args.caps or "").split(",")):  # "engine:dense=80,peer:dense=60"
        key, _, value = item.partition("=")
        caps[key] = float(value)
    opts = E2EOptions(
        shapes=tuple(args.e2e), moe_layers=args.moe_layers, batch=args.batch, ctx=args.ctx,
        warmup=args.warmup, measure=args.measure, budgets=tuple(args.budgets.split(",")),
        peer=not args.no_peer, emulate=args.emulate, workdir=args.workdir, deadline=args.deadline, caps=caps,
    )  # fmt: skip
    if args.child_cap_s:
        opts = replace(opts, caps={key: args.child_cap_s for key in opts.caps})
    records = run_end_to_end(opts, ceil.get("bf16_tflops", float("nan")), log=log)
    rows = []
    for r in records:
        if not r.get("ok"):
            continue
        name = f"e2e {r['model']} {r['who']} {r['setting'].rsplit(', ', 1)[-1]}"[:30]
        shape = f"{r['layers']}L, B {args.batch} x T {args.ctx}"
        note = f"{r['tokens_per_s']:.0f} tokens/s"
        rows.append(Row(name, shape, 1e3 * r["step_s"], r["flops_per_step"], "TFLOP/s", note=note))
    return rows, records


def finish(rows: list[Row], ceil: dict[str, float]) -> None:
    for row in rows:
        if row.kind == "GB/s":
            row.rate = row.work / row.ms / 1e6
            row.floor_ms = row.work / ceil["copy_gbs"] / 1e6
        else:
            row.rate = row.work / row.ms / 1e9
            bf16 = "bf16" in row.name or "lm_head" in row.name or row.name.startswith("e2e ")
            ceiling = ceil["bf16_tflops"] if bf16 else ceil["fp32_tflops"]
            if "attention" in row.name:
                ceiling = ceil["bf16_tflops"]  # useful (causal) FLOPs at the bf16 rate, for both methods
            row.floor_ms = row.work / ceiling / 1e9


def table(rows: list[Row], ceil: dict[str, float]) -> str:
    lines = [
        f"ceilings: bf16 GEMM {ceil['bf16_tflops']:.0f} TFLOP/s, fp32 GEMM {ceil['fp32_tflops']:.1f} "
        f"TFLOP/s, device copy {ceil['copy_gbs']:.0f} GB/s (read + write)",
        f"{'kernel':<30} {'shape':<36} {'ms':>9} {'achieved':>16} {'floor ms':>9} {'x floor':>8}  note",
    ]
    for r in rows:
        over = r.ms / r.floor_ms if r.floor_ms else float("nan")
        lines.append(
            f"{r.name:<30} {r.shape[:36]:<36} {r.ms:>9.3f} {r.rate:>9.1f} {r.kind:<7}{r.floor_ms:>8.3f} "
            f"{over:>8.1f}  {r.note}"
        )
    return "\n".join(lines)


def main() -> int:
    t0 = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", nargs="*", default=["kernels", "e2e"], choices=("kernels", "e2e"))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=4096, help="kernels: B*T tokens (B = 2)")
    ap.add_argument("--only", nargs="*", help="norm rope swiglu embedding linear attention lm_head adamw")
    ap.add_argument(
        "--e2e",
        nargs="*",
        default=["dense", "moe"],
        choices=("dense", "moe", "dense17", "gptoss", "deepseek2"),
    )
    ap.add_argument("--moe-layers", type=int, default=12, help="layers of the Qwen3-30B-A3B shape (48 real)")
    ap.add_argument("--batch", type=int, default=4, help="e2e: windows per step")
    ap.add_argument("--ctx", type=int, default=1024, help="e2e: tokens per window")
    ap.add_argument("--warmup", type=int, default=2, help="e2e: steps before the measured ones")
    ap.add_argument("--measure", type=int, default=5, help="e2e: measured steps (fewer when time is short)")
    ap.add_argument("--budgets", default="off,auto", help="e2e: the engine's weight-cache budgets")
    ap.add_argument("--no-peer", action="store_true", help="e2e: the engine only, no transformers + PEFT")
    ap.add_argument("--workdir", default=None, help="e2e: keep the generated model files here")
    ap.add_argument("--child-cap-s", type=float, default=0.0, help="e2e: seconds each run may take (0: CAPS)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="seconds for the whole script")
    ap.add_argument("--caps", default="", help="e2e: seconds per child, e.g. engine:dense=80,peer:dense=60")
    ap.add_argument(
        "--emulate",
        action="store_true",
        help="no GPU: e2e on the g++ emulator, tiny shapes, no kernels or peer",
    )
    args = ap.parse_args()
    args.deadline = time.monotonic() + args.budget_s - (time.perf_counter() - t0)
    out = os.environ.get("OUT")
    logs: list[str] = []

    def log(text: str) -> None:
        logs.append(text)
        print(text, flush=True)

    if args.emulate:
        args.batch, args.ctx, args.warmup, args.measure = min(args.batch, 1), min(args.ctx, 32), 1, 1
        args.no_peer = True
        name = "g++ kernel emulator (no GPU)"
        ceil = {"bf16_tflops": float("nan"), "fp32_tflops": float("nan"), "copy_gbs": float("nan")}
        rows: list[Row] = []
    else:
        try:
            import cupy as cp

            from engine.kernels.runtime import cuda_runtime

            rt = cuda_runtime()
            props = cp.cuda.runtime.getDeviceProperties(0)
        except Exception as exc:  # noqa: BLE001
            print(f"no usable CUDA GPU: {type(exc).__name__}: {exc}")
            return 2
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        free, total = cp.cuda.runtime.memGetInfo()
        log(f"device: {name}, {props['multiProcessorCount']} SMs, L2 {props['l2CacheSize'] / 2**20:.0f} MiB, "
            f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free; CuPy {cp.__version__}")  # fmt: skip
        try:
            ceil = ceilings(cp, rt, args.repeats)
            log(f"ceilings measured ({time.perf_counter() - t0:.0f} s): {ceil}")
        except Exception as exc:  # noqa: BLE001 - the rest still runs, against no ceiling
            ceil = {"bf16_tflops": float("nan"), "fp32_tflops": float("nan"), "copy_gbs": float("nan")}
            log(f"ceilings failed: {type(exc).__name__}: {exc}")
        rows = []
        if "kernels" in args.sections:
            try:
                rows = kernel_rows(cp, rt, args.tokens, args.repeats, set(args.only) if args.only else None)
            except Exception as exc:  # noqa: BLE001 - the e2e part still runs
                log(f"kernel timings stopped: {type(exc).__name__}: {exc}")
            log(f"kernels done ({time.perf_counter() - t0:.0f} s)")
        cp.get_default_memory_pool().free_all_blocks()  # the children measure their own memory
        cp.get_default_pinned_memory_pool().free_all_blocks()
    records: list[dict] = []
    if "e2e" in args.sections:
        try:
            e2e, records = end_to_end_rows(args, ceil, log)
            rows += e2e
        except Exception as exc:  # noqa: BLE001 - a row, never a crash
            log(f"end-to-end part failed: {type(exc).__name__}: {exc}")
            records = [{"model": "-", "layers": 0, "who": "-", "setting": "-", "ok": False,
                        "error": f"{type(exc).__name__}: {exc}"}]  # fmt: skip
    finish(rows, ceil)
    text = table(rows, ceil) if not args.emulate else f"device: {name}"
    if records:
        from bench.gpu_e2e import E2EOptions, e2e_table, profile_text

        opts = E2EOptions(batch=args.batch, ctx=args.ctx, warmup=args.warmup, measure=args.measure)
        text = profile_text(records) + "\n\n" + text
        text += "\n\n" + e2e_table(records, ceil["bf16_tflops"], opts)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gpu.txt"), "w") as f:
            f.write(f"device {name}\n{text}\n")
        with open(os.path.join(out, "gpu.json"), "w") as f:
            json.dump({"device": name, "ceilings": ceil, "rows": [asdict(r) for r in rows], "e2e": records,
                       "args": {k: v for k, v in vars(args).items() if k != "deadline"}}, f, indent=1,
                      default=str)  # fmt: skip
        with open(os.path.join(out, "gpu_e2e.log"), "w") as f:
            f.write("\n".join(logs) + "\n")
    print(f"({time.perf_counter() - t0:.0f} s)")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
