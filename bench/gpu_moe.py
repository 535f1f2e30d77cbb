"""GPU benchmark of the MoE expert kernels on a Qwen3-30B-A3B-shaped layer, per route, beside _grouped_mm.

The layer: C = 2048, F_exp = 768, E = 128, K = 8, bf16 expert stacks, rank-16 LoRA on gate, up and
down; P = 8 x tokens routed pairs. The routes (engine.kernels.moe_gemm.route, $TUNE_MOE_GEMM): "tc"
the v2 tensor-core kernels (moe_gemm.cu), "cublas" the v2 cuBLAS tiles (moe_cublas.py), "v1" the first
kernels (moe.cu). For each token count and route (median of --repeats, CUDA events, random inputs,
routing from random logits):

- the expert path as the engine calls it: experts_forward (with and without LoRA) and
  experts_backward (LoRA, no dW);
- every kernel and cuBLAS call of that path (events around each), with and without LoRA, and from
  them the four grouped base products (gate_up, down, down_back, dx) beside torch._grouped_mm on the
  same sorted rows and expert offsets (bf16 in and out, the vendor grouped GEMM alone: no gather,
  SwiGLU, LoRA or scatter), with TFLOP/s and the floors (FLOPs at the measured bf16 matmul rate,
  or every expert's bf16 weights once at the measured copy rate). For the cuBLAS route a product's
  time is its batched cuBLAS calls alone (its gathers and epilogues are listed among the kernels);
- the output once against a float32 per-expert loop (relative error).

Then the host synchronisations of the first route's MoE path: calls to the CuPy functions that
synchronise (patched where Python lets them be), and the decisive check: the host must get through
several layers' forward and backward while a long kernel still runs ahead of them on the stream.

    python bench/gpu_moe.py --tokens 4096 --repeats 5             # every route
    python bench/gpu_moe.py --routes tc cublas --no-sync-check
    python bench/gpu_moe.py --emulate                              # no GPU: the code path, tiny
Prints a table per size and all of them last; writes $OUT/gpu_moe.json when $OUT is set. Never
fails on speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.gpu import timed  # noqa: E402
from engine.kernels import moe_cuda  # noqa: E402
from engine.kernels.linear import LoraTerm  # noqa: E402
from engine.kernels.moe_gemm import ROUTES  # noqa: E402
from engine.kernels.runtime import CudaRuntime, Runtime  # noqa: E402

C, F, E, K, R = 2048, 768, 128, 8, 16  # Qwen3-30B-A3B layer; LoRA rank


def log(*a) -> None:
    print(*a, flush=True)


# ---- ceilings --------------------------------------------------------------------------------------


def time_events(cp, fn, repeats: int, warmup: int = 2) -> float:
    """Median seconds of fn() between CUDA events (fn only enqueues work): bench/gpu.py's `timed`."""
    return timed(cp, fn, repeats, warmup) * 1e-3


def ceilings(cp, torch) -> dict:
    out = {}
    n = 8192
    if torch is not None:
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        t = time_events(cp, lambda: torch.matmul(a, b), 10)
        out["bf16_matmul_tflops"] = 2 * n**3 / t / 1e12
        out["bf16_matmul_source"] = f"torch {torch.__version__} matmul {n}^3"
        del a, b
    else:
        a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        b = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        t = time_events(cp, lambda: cp.matmul(a, b), 10)
        out["bf16_matmul_tflops"] = 2 * n**3 / t / 1e12
        out["bf16_matmul_source"] = f"cupy float16 matmul {n}^3 (no torch: fp16 stands in for bf16)"
    a = cp.random.standard_normal((4096, 4096), dtype=cp.float32)
    t = time_events(cp, lambda: cp.matmul(a, a), 10)
    out["f32_matmul_tflops"] = 2 * 4096**3 / t / 1e12
    src = cp.random.standard_normal(256 * 2**20, dtype=cp.float32)  # 1 GiB
    dst = cp.empty_like(src)
    t = time_events(cp, lambda: dst.__setitem__(Ellipsis, src), 10)
    out["copy_gbps"] = 2 * src.nbytes / t / 1e9  # read + written
    return out


# ---- inputs ----------------------------------------------------------------------------------------


def bf16_bits_dev(cp, a):
    u = a.astype(cp.float32).view(cp.uint32)
    return ((u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)


def make_layer(cp, T: int, lora: bool) -> dict:
    rnd = cp.random.standard_normal
    L = {
        "logits": rnd((T, E), dtype=cp.float32),
        "x": rnd((T, C), dtype=cp.float32),
        "dy": rnd((T, C), dtype=cp.float32),
    }
    for n, (n_out, n_in) in {"gate": (F, C), "up": (F, C), "down": (C, F)}.items():
        L[f"w_{n}"] = bf16_bits_dev(cp, rnd((E, n_out, n_in), dtype=cp.float32) * (n_in**-0.5))
        L[f"lora_{n}"] = (
            LoraTerm(
                rnd((E, R, n_in), dtype=cp.float32) * (n_in**-0.5),
                rnd((E, n_out, R), dtype=cp.float32) * (R**-0.5),
                2.0,
            )
            if lora
            else None
        )
    return L


def W(L):
    return L["w_gate"], L["w_up"], L["w_down"]


def loras(L):
    return L["lora_gate"], L["lora_up"], L["lora_down"]


# ---- per-kernel times -------------------------------------------------------------------------------

# The four grouped base products and, per route, the kernels (or cuBLAS calls) that do them
ROLES = ("gate_up", "down", "down_back", "dx")
ROLE_KERNELS = {
    "v1": {"gate_up": ("moe_gate_up_bf16",), "down": ("moe_down_bf16",), "down_back": ("moe_down_back_bf16",),
           "dx": ("moe_dx_bf16",)},
    "tc": {"gate_up": ("mg_gate_up",), "down": ("mg_scatter_nt",), "down_back": ("mg_down_back",),
           "dx": ("mg_scatter_nn",)},
}  # fmt: skip


def cublas_roles(c: int, f: int) -> dict[str, tuple[str, ...]]:
    """The cuBLAS route's calls of each product, by the names KernelTimer gives them."""
    return {"gate_up": (f"cublas nt n{f} k{c}",), "down": (f"cublas nt n{c} k{f}",),
            "down_back": (f"cublas nn n{f} k{c}",), "dx": (f"cublas nn n{c} k{f}",)}  # fmt: skip


ROLE_KERNELS["cublas"] = cublas_roles(C, F)


def role_flops(P: int) -> dict[str, float]:
    return {"gate_up": 2.0 * P * C * 2 * F, "down": 2.0 * P * F * C, "down_back": 2.0 * P * C * F,
            "dx": 2.0 * P * 2 * F * C}  # fmt: skip


class EventClock:
    """CUDA events on the current stream (GPU)."""

    def __init__(self, cp):
        self.cp = cp

    def mark(self):
        e = self.cp.cuda.Event()
        e.record()
        return e

    def seconds(self, a, b) -> float:
        b.synchronize()
        return self.cp.cuda.get_elapsed_time(a, b) * 1e-3


class WallClock:
    """perf_counter (the emulator: launches run to completion before they return)."""

    def mark(self):
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        return b - a


class KernelTimer(Runtime):
    """Another runtime, timing every kernel it launches and every cuBLAS grouped product
    (`gemm_indexed`, named "cublas nt|nn n<N> k<K>") between two clock marks."""

    def __init__(self, rt: Runtime, clock):
        self.rt, self.xp, self.clock = rt, rt.xp, clock
        self.events: list[tuple[str, object, object]] = []

    def launch(self, source, kernel, grid, block, args, shared_mem=0):
        a = self.clock.mark()
        self.rt.launch(source, kernel, grid, block, args, shared_mem)
        self.events.append((kernel, a, self.clock.mark()))

    def gemm_indexed(self, a, b, index, out, *, trans_b=False, alpha=1.0, beta=0.0):
        name = f"cublas {'nt' if trans_b else 'nn'} n{out.shape[2]} k{a.shape[2]}"
        t = self.clock.mark()
        self.rt.gemm_indexed(a, b, index, out, trans_b=trans_b, alpha=alpha, beta=beta)
        self.events.append((name, t, self.clock.mark()))

    def gemm(self, *args, **kwargs):
        self.rt.gemm(*args, **kwargs)

    def address(self, a) -> int:
        return self.rt.address(a)

    def collect(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for name, a, b in self.events:
            out[name] += self.clock.seconds(a, b)
        self.events.clear()
        return dict(out)


def kernel_times(rt: Runtime, clock, L: dict, route: str, repeats: int, lora: bool) -> dict[str, float]:
    """Mean seconds per kernel of one MoE layer's forward + backward (LoRA on or off) on `route`."""
    os.environ["TUNE_MOE_GEMM"] = route
    timer = KernelTimer(rt, clock)
    lo = loras(L) if lora else (None, None, None)
    per: dict[str, float] = defaultdict(float)
    for _ in range(repeats):
        r2, _ = moe_cuda.route_forward_on(timer, L["logits"], K, True)
        _, ec = moe_cuda.experts_forward_on(timer, L["x"], r2, *W(L), *lo)
        moe_cuda.experts_backward_on(timer, L["dy"], ec, *W(L), need_dw=False)
        for k, v in timer.collect().items():
            per[k] += v / repeats
    return dict(per)


def role_times(route: str, per_kernel: dict[str, float]) -> dict[str, float]:
    """Seconds of each grouped base product on `route` (the sum of its kernels or cuBLAS calls)."""
    return {
        role: sum(per_kernel.get(k, 0.0) for k in ROLE_KERNELS[route][role])
        for role in ROLES
        if any(k in per_kernel for k in ROLE_KERNELS[route][role])
    }


def weight_bytes() -> float:
    return 3.0 * E * F * C * 2  # bf16


# ---- baselines and checks ---------------------------------------------------------------------------


def grouped_mm_baseline(cp, torch, L, routing, repeats: int) -> dict:
    """torch._grouped_mm on the same sorted rows and expert offsets, one call per grouped product:
    gate_up (P, C) x (E, C, 2F), down (P, F) x (E, F, C), down_back (P, C) x (E, C, F), dx (P, 2F) x
    (E, 2F, C); bf16 in and out, the gather done outside the timing (the vendor GEMM alone)."""
    if torch is None or not hasattr(torch, "_grouped_mm"):
        return {"error": "torch or torch._grouped_mm not available"}
    try:
        order = torch.as_tensor(routing.order, device="cuda").long()
        offs = torch.as_tensor(routing.offsets[1:], device="cuda").int()
        x = torch.as_tensor(L["x"], device="cuda")
        P = order.shape[0]
        xs = x[order // K].to(torch.bfloat16).contiguous()  # (P, C)
        wg = torch.as_tensor(L["w_gate"], device="cuda").view(torch.bfloat16)
        wu = torch.as_tensor(L["w_up"], device="cuda").view(torch.bfloat16)
        wd = torch.as_tensor(L["w_down"], device="cuda").view(torch.bfloat16)
        w_gu = torch.cat([wg, wu], dim=1)  # (E, 2F, C)
        hs = torch.randn(P, F, device="cuda", dtype=torch.bfloat16)
        dgu = torch.randn(P, 2 * F, device="cuda", dtype=torch.bfloat16)
        calls = {
            "gate_up": lambda: torch._grouped_mm(xs, w_gu.transpose(1, 2), offs=offs),
            "down": lambda: torch._grouped_mm(hs, wd.transpose(1, 2), offs=offs),
            "down_back": lambda: torch._grouped_mm(xs, wd, offs=offs),
            "dx": lambda: torch._grouped_mm(dgu, w_gu, offs=offs),
        }
        out = {f"{k}_s": time_events(cp, fn, repeats) for k, fn in calls.items()}
        return out | {"torch": torch.__version__}
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot run is a line in the report
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def check_against_loop(cp, L, routing, y) -> float:
    """‖y − y_loop‖ / ‖y_loop‖ with y_loop from a float32 per-expert loop on the bf16 weight values
    (host offsets: this check may synchronise; the MoE path itself never does)."""
    off = cp.asnumpy(routing.offsets)
    order = routing.order
    T = L["x"].shape[0]
    pair_out = cp.zeros((T * K, C), dtype=cp.float32)

    def val(bits):
        return (bits.astype(cp.uint32) << 16).view(cp.float32)

    xb = val(bf16_bits_dev(cp, L["x"]))  # the kernels round x to bf16 as they stage it
    for e in range(E):
        lo, hi = int(off[e]), int(off[e + 1])
        if lo == hi:
            continue
        pairs = order[lo:hi]
        xe = xb[pairs // K]
        g = xe @ val(L["w_gate"][e]).T
        u = xe @ val(L["w_up"][e]).T
        h = g / (1 + cp.exp(-g)) * u
        pair_out[pairs] = val(bf16_bits_dev(cp, h)) @ val(L["w_down"][e]).T
    ref = (pair_out.reshape(T, K, C) * routing.weights[:, :, None]).sum(axis=1)
    return float(cp.linalg.norm(y - ref) / cp.linalg.norm(ref))


# ---- host synchronisations --------------------------------------------------------------------------

_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
"""


class SyncCounter:
    """Counts calls to the CuPy entry points that wait for the device, where they can be patched."""

    TARGETS = (
        ("cupy.cuda.Stream", "synchronize"),
        ("cupy.cuda.Device", "synchronize"),
        ("cupy.cuda.Event", "synchronize"),
        ("cupy.cuda.runtime", "deviceSynchronize"),
        ("cupy.cuda.runtime", "streamSynchronize"),
        ("cupy", "asnumpy"),
        ("cupy.ndarray", "get"),
        ("cupy.ndarray", "item"),
        ("cupy.ndarray", "tolist"),
        ("cupy.ndarray", "__int__"),
        ("cupy.ndarray", "__float__"),
        ("cupy.ndarray", "__bool__"),
        ("cupy.ndarray", "__index__"),
    )

    def __init__(self, cp):
        self.cp = cp
        self.counts: dict[str, int] = defaultdict(int)
        self.patched: list[str] = []
        self.unpatchable: list[str] = []
        self._saved: list[tuple[object, str, object]] = []

    def _owner(self, path: str):
        obj = self.cp
        for part in path.split(".")[1:]:
            obj = getattr(obj, part)
        return obj

    def __enter__(self):
        for path, attr in self.TARGETS:
            key = f"{path}.{attr}"
            try:
                owner = self._owner(path)
                orig = getattr(owner, attr)
            except AttributeError:
                continue

            def wrapper(*a, _orig=orig, _key=key, **kw):
                self.counts[_key] += 1
                return _orig(*a, **kw)

            try:
                setattr(owner, attr, wrapper)
                self._saved.append((owner, attr, orig))
                self.patched.append(key)
            except (TypeError, AttributeError):
                self.unpatchable.append(key)
        return self

    def __exit__(self, *exc):
        for owner, attr, orig in reversed(self._saved):
            setattr(owner, attr, orig)
        self._saved.clear()


def host_sync_check(cp, L, layers: int = 4) -> dict:
    def layer():
        routing, rcache = moe_cuda.route_forward(L["logits"], K, True)
        _, cache = moe_cuda.experts_forward(L["x"], routing, *W(L), *loras(L))
        _, dweights, _, _, _ = moe_cuda.experts_backward(L["dy"], cache, *W(L), need_dw=False)
        moe_cuda.route_backward(dweights, rcache)

    spin = cp.RawKernel(_SPIN, "spin")
    spin((1,), (1,), (np.int64(1000),))
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    spin((1,), (1,), (np.int64(20_000_000),))
    b.record()
    b.synchronize()
    cycles = int(20_000_000 * 1.0 / (cp.cuda.get_elapsed_time(a, b) * 1e-3))  # ~1 s
    layer()
    cp.cuda.get_current_stream().synchronize()
    with SyncCounter(cp) as counter:
        t0 = time.perf_counter()
        spin((1,), (1,), (np.int64(cycles),))
        for _ in range(layers):
            layer()
        host = time.perf_counter() - t0
    cp.cuda.get_current_stream().synchronize()
    total = time.perf_counter() - t0
    return {
        "layers": layers,
        "counted_syncs": sum(counter.counts.values()),
        "counts": dict(counter.counts),
        "patched": counter.patched,
        "unpatchable": counter.unpatchable,
        "host_s": host,
        "total_s": total,
        "host_blocked": host > 0.5 * total,
    }


# ---- main -------------------------------------------------------------------------------------------


def bench_size(cp, torch, T: int, repeats: int, ceil: dict, routes: list[str]) -> dict:
    """One token count: the layer path per route (events around whole calls), every kernel per route
    with and without LoRA, the four grouped products against torch._grouped_mm and the floors."""
    L = make_layer(cp, T, lora=True)
    os.environ["TUNE_MOE_GEMM"] = routes[0]
    routing, rcache = moe_cuda.route_forward(L["logits"], K, True)
    row = {"tokens": T, "pairs": T * K, "routes": {}}
    P = T * K
    flops = role_flops(P)
    wb = weight_bytes()
    row["floors_s"] = {
        r: max(
            flops[r] / (ceil["bf16_matmul_tflops"] * 1e12),
            wb * (2 / 3 if r in ("gate_up", "dx") else 1 / 3) / (ceil["copy_gbps"] * 1e9),
        )
        for r in ROLES
    }
    row["grouped_mm"] = grouped_mm_baseline(cp, torch, L, routing, repeats)
    rt = CudaRuntime()
    clock = EventClock(cp)
    for route in routes:
        os.environ["TUNE_MOE_GEMM"] = route
        rec: dict = {}
        try:
            _, cache = moe_cuda.experts_forward(L["x"], routing, *W(L), *loras(L))
            y0, _ = moe_cuda.experts_forward(L["x"], routing, *W(L))
            rec["rel_err_vs_f32_loop"] = check_against_loop(cp, L, routing, y0)
            rec["experts_forward_s"] = time_events(
                cp, lambda: moe_cuda.experts_forward(L["x"], routing, *W(L)), repeats
            )
            rec["experts_forward_lora_s"] = time_events(
                cp, lambda: moe_cuda.experts_forward(L["x"], routing, *W(L), *loras(L)), repeats
            )
            rec["experts_backward_lora_s"] = time_events(
                cp, lambda c=cache: moe_cuda.experts_backward(L["dy"], c, *W(L), need_dw=False), repeats
            )
            for lora in (False, True):
                per = kernel_times(rt, clock, L, route, repeats, lora)
                rec["kernels_lora_s" if lora else "kernels_s"] = per
                rec["roles_lora_s" if lora else "roles_s"] = role_times(route, per)
        except Exception as exc:  # noqa: BLE001 - a route that fails is a line in the report
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        row["routes"][route] = rec
        cp.get_default_memory_pool().free_all_blocks()
    dweights = cp.random.standard_normal((T, K), dtype=cp.float32)
    row["route_forward_s"] = time_events(cp, lambda: moe_cuda.route_forward(L["logits"], K, True), repeats)
    row["route_backward_s"] = time_events(cp, lambda: moe_cuda.route_backward(dweights, rcache), repeats)
    return row


def format_table(rows: list[dict], ceil: dict, sync: dict | None) -> str:
    out = [
        f"ceilings: bf16 matmul {ceil['bf16_matmul_tflops']:.0f} TFLOP/s ({ceil['bf16_matmul_source']}), "
        f"f32 matmul {ceil['f32_matmul_tflops']:.1f} TFLOP/s, copy {ceil['copy_gbps']:.0f} GB/s",
        f"layer C={C} F={F} E={E} K={K}, bf16 stacks, LoRA r={R}; times in ms (median of the calls, mean "
        "per kernel)",
    ]
    for r in rows:
        P, g = r["pairs"], r["grouped_mm"]
        flops = role_flops(P)
        out.append(f"-- {r['tokens']} tokens ({P} pairs); route_forward {r['route_forward_s'] * 1e3:.3f}, "
                   f"route_backward {r['route_backward_s'] * 1e3:.3f}")  # fmt: skip
        out.append(f"{'grouped product':<12} {'torch gmm':>10} " + " ".join(
            f"{route + ' (x torch, TF/s, +LoRA)':>34}" for route in r["routes"]))  # fmt: skip
        for role in ROLES:
            t_ref = g.get(f"{role}_s")
            cells = []
            for rec in r["routes"].values():
                t = rec.get("roles_s", {}).get(role)
                tl = rec.get("roles_lora_s", {}).get(role)
                if t is None:
                    cells.append(f"{'-':>34}")
                    continue
                ratio = f"{t / t_ref:5.2f}x" if t_ref else "  n/a"
                lora = f"{tl * 1e3:7.3f}" if tl is not None else "      -"
                cells.append(f"{t * 1e3:7.3f} ({ratio}, {flops[role] / t / 1e12:4.0f}) {lora}".rjust(34))
            ref = f"{t_ref * 1e3:10.3f}" if t_ref else f"{'n/a':>10}"
            out.append(f"{role:<12} {ref} " + " ".join(cells))
        floors = " ".join(f"{k} {v * 1e3:.3f}" for k, v in r["floors_s"].items())
        out.append(f"floors (max of FLOPs at the bf16 rate, weight bytes at the copy rate): {floors}")
        for route, rec in r["routes"].items():
            if "error" in rec:
                out.append(f"{route}: FAILED {rec['error']}")
                continue
            out.append(
                f"{route:>7}: experts fwd {rec['experts_forward_s'] * 1e3:.2f}, fwd+LoRA "
                f"{rec['experts_forward_lora_s'] * 1e3:.2f}, "
                f"bwd+LoRA {rec['experts_backward_lora_s'] * 1e3:.2f} ms; "
                f"error vs fp32 loop {rec['rel_err_vs_f32_loop']:.1e}"
            )
            top = sorted(rec["kernels_lora_s"].items(), key=lambda kv: -kv[1])[:8]
            out.append("         kernels (+LoRA): " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in top))
        if "error" in g:
            out.append(f"torch._grouped_mm: {g['error']}")
    if sync is not None:
        out.append(
            f"host syncs over {sync['layers']} MoE layers (fwd+bwd, route {sync['route']}): "
            f"{sync['counted_syncs']} counted in patched calls ({len(sync['patched'])} patched, "
            f"{len(sync['unpatchable'])} not patchable); "
            f"host {'BLOCKED' if sync['host_blocked'] else 'not blocked'}: "
            f"{sync['host_s'] * 1e3:.1f} ms while a {sync['total_s'] * 1e3:.0f} ms kernel ran ahead"
        )
    return "\n".join(out)


def emulate(routes: list[str]) -> int:
    """No GPU: each route's layer through the kernel timer on the g++ emulator at a tiny shape (the
    code path of the per-kernel timings and the role table; no times worth reading)."""
    global C, F, E, K, R
    from tests.kernels.emu_runtime import EmuRuntime

    C, F, E, K, R = 64, 32, 8, 2, 4
    ROLE_KERNELS["cublas"] = cublas_roles(C, F)
    rt = EmuRuntime()
    rt.xp = np
    rng = np.random.default_rng(0)
    T = 24
    L = {k: rng.standard_normal(shape).astype(np.float32) for k, shape in
         (("logits", (T, E)), ("x", (T, C)), ("dy", (T, C)))}  # fmt: skip
    for n, (n_out, n_in) in {"gate": (F, C), "up": (F, C), "down": (C, F)}.items():
        w = (rng.standard_normal((E, n_out, n_in)) * n_in**-0.5).astype(np.float32)
        L[f"w_{n}"] = ((w.view(np.uint32) + 0x8000) >> 16).astype(np.uint16)
        A = rng.standard_normal((E, R, n_in)).astype(np.float32) * 0.1
        L[f"lora_{n}"] = LoraTerm(A, rng.standard_normal((E, n_out, R)).astype(np.float32) * 0.1, 2.0)
    row = {"tokens": T, "pairs": T * K, "routes": {}, "route_forward_s": 0.0, "route_backward_s": 0.0}
    row |= {"floors_s": dict.fromkeys(ROLES, 1.0), "grouped_mm": {"error": "no torch under --emulate"}}
    for route in routes:
        rec = {"rel_err_vs_f32_loop": float("nan"), "experts_forward_s": 0.0, "experts_forward_lora_s": 0.0,
               "experts_backward_lora_s": 0.0}  # fmt: skip
        for lora in (False, True):
            per = kernel_times(rt, WallClock(), L, route, 1, lora=lora)
            rec["kernels_lora_s" if lora else "kernels_s"] = per
            rec["roles_lora_s" if lora else "roles_s"] = role_times(route, per)
            assert set(rec["roles_s"]) == set(ROLES), (route, sorted(per))
        row["routes"][route] = rec
    ceil = {"bf16_matmul_tflops": float("nan"), "bf16_matmul_source": "none (emulated)",
            "f32_matmul_tflops": float("nan"), "copy_gbps": float("nan")}  # fmt: skip
    log(format_table([row], ceil, None))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES,
                    help="MoE expert routes to time (engine.kernels.moe_gemm.route)")  # fmt: skip
    ap.add_argument("--no-sync-check", action="store_true", help="skip the host synchronisation check")
    ap.add_argument("--emulate", action="store_true", help="no GPU: the code path on the g++ emulator")
    args = ap.parse_args(argv)
    if args.emulate:
        return emulate(args.routes)
    import cupy as cp

    try:
        import torch
    except ImportError:
        torch = None
    log(f"device: {cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)['name'].decode()}")
    t0 = time.perf_counter()
    moe_cuda.route_forward(cp.zeros((1, E), cp.float32), K, True)  # compile and load the kernels
    log(f"routing kernels compiled and loaded in {time.perf_counter() - t0:.1f} s")
    ceil = ceilings(cp, torch)
    log(f"ceilings: {ceil}")
    rows = []
    for T in args.tokens:
        t = time.perf_counter()
        rows.append(bench_size(cp, torch, T, args.repeats, ceil, args.routes))
        cp.get_default_memory_pool().free_all_blocks()
        log(f"{T} tokens done in {time.perf_counter() - t:.1f} s")
        log(format_table(rows[-1:], ceil, None))
    sync = None
    if not args.no_sync_check:
        os.environ["TUNE_MOE_GEMM"] = args.routes[0]
        sync = host_sync_check(cp, make_layer(cp, 512, lora=True)) | {"route": args.routes[0]}
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_moe.json"), "w") as f:
            json.dump({"ceilings": ceil, "rows": rows, "host_sync": sync}, f, indent=1, default=str)
    log(format_table(rows, ceil, sync))
    return 0


if __name__ == "__main__":
    sys.exit(main())
