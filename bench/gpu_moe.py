"""GPU benchmark of the MoE kernels on a Qwen3-30B-A3B-shaped layer: times, ceilings, host syncs.

The layer: C = 2048, F_exp = 768, E = 128, K = 8, bf16 expert stacks, rank-16 LoRA on gate, up and
down; tokens 256..4096 (P = 8 x tokens routed pairs). For each token count it times (median of
--repeats, CUDA events, fresh random inputs, routing from random logits):

- the MoE path as the engine calls it: route_forward, experts_forward (with and without LoRA),
  experts_backward (LoRA, no dW; and full-weight dW for the smaller sizes), route_backward;
- each kernel of that path on its own (events around every launch), with its FLOPs, so that the
  grouped base matmuls (moe_gate_up, moe_down, moe_down_back, moe_dx) can be read against the
  ceilings: the measured bf16 cuBLAS matmul rate, and the floor of bf16 weight bytes over the measured
  copy bandwidth (every expert's weights are read at least once per matmul);
- torch._grouped_mm on the same sorted rows and offsets, when torch is importable (the baseline:
  a vendor grouped GEMM, without our gather, SwiGLU, LoRA and scatter).

It also checks the output once against a float32 per-expert loop (relative error), and counts host
synchronisations on the MoE path: calls to the CuPy functions that synchronise (patched where
Python lets them be), and the decisive check: the host must get through several layers' forward and
backward while a long kernel still runs ahead of them on the stream.

    python bench/gpu_moe.py                    # every size (a few minutes with compilation)
    python bench/gpu_moe.py --tokens 256 1024 --repeats 5
Prints a table last; writes everything to $OUT/gpu_moe.json when $OUT is set. Never fails on speed.
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

from engine.kernels import moe  # noqa: E402
from engine.kernels.linear import LoraTerm  # noqa: E402
from engine.kernels.runtime import CudaRuntime  # noqa: E402

C, F, E, K, R = 2048, 768, 128, 8, 16  # Qwen3-30B-A3B layer; LoRA rank


def log(*a) -> None:
    print(*a, flush=True)


# ---- ceilings --------------------------------------------------------------------------------------


def time_events(cp, fn, repeats: int, warmup: int = 2) -> float:
    """Median seconds of fn() between CUDA events (fn only enqueues work)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
    return float(np.median(times))


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


class KernelTimer(CudaRuntime):
    """The GPU runtime, recording CUDA events around every kernel the *_on bodies launch."""

    def __init__(self, cp):
        super().__init__()
        self.cp = cp
        self.events: list[tuple[str, object, object]] = []

    def launch(self, source, kernel, grid, block, args, shared_mem=0):
        a, b = self.cp.cuda.Event(), self.cp.cuda.Event()
        a.record()
        super().launch(source, kernel, grid, block, args, shared_mem)
        b.record()
        self.events.append((kernel, a, b))

    def collect(self) -> dict[str, float]:
        if self.events:
            self.events[-1][2].synchronize()
        out: dict[str, float] = defaultdict(float)
        for name, a, b in self.events:
            out[name] += self.cp.cuda.get_elapsed_time(a, b) * 1e-3
        self.events.clear()
        return dict(out)


def kernel_flops(T: int, lora: bool, need_dw: bool) -> dict[str, float]:
    P = T * K
    out = {
        "moe_gate_up_bf16": 2.0 * P * C * 2 * F,
        "moe_down_bf16": 2.0 * P * F * C,
        "moe_down_back_bf16": 2.0 * P * C * F,
        "moe_dx_bf16": 2.0 * P * 2 * F * C,
    }
    if need_dw:
        out["moe_outer_f32"] = 3 * 2.0 * P * F * C
    if lora:  # gate/up/down factors: the rank-r products and their gradients
        out["moe_rows_f32"] = 2.0 * P * R * (2 * C + F) + 2.0 * P * R * (C + 2 * F)
        out["moe_outer_f32"] = out.get("moe_outer_f32", 0.0) + 2.0 * P * R * 2 * (2 * C + 2 * F + C + F)
    return out


def weight_bytes() -> float:
    return 3.0 * E * F * C * 2  # bf16


# ---- baselines and checks ---------------------------------------------------------------------------


def grouped_mm_baseline(cp, torch, L, routing, repeats: int) -> dict:
    """torch._grouped_mm over the sorted rows: gate+up as one (P, C) x (E, C, 2F), down (P, F) x (E, F, C)."""
    if torch is None or not hasattr(torch, "_grouped_mm"):
        return {"error": "torch or torch._grouped_mm not available"}
    try:
        order = torch.as_tensor(routing.order, device="cuda").long()
        offs = torch.as_tensor(routing.offsets[1:], device="cuda").int()
        x = torch.as_tensor(L["x"], device="cuda")
        xs = x[order // K].to(torch.bfloat16).contiguous()  # (P, C), the gather done outside the timing
        wg = torch.as_tensor(L["w_gate"], device="cuda").view(torch.bfloat16)
        wu = torch.as_tensor(L["w_up"], device="cuda").view(torch.bfloat16)
        wd = torch.as_tensor(L["w_down"], device="cuda").view(torch.bfloat16)
        w_gu = torch.cat([wg, wu], dim=1).transpose(1, 2)  # (E, C, 2F), column-major per expert
        w_d = wd.transpose(1, 2)  # (E, F, C)
        hs = torch.randn(xs.shape[0], F, device="cuda", dtype=torch.bfloat16)
        t_gu = time_events(cp, lambda: torch._grouped_mm(xs, w_gu, offs=offs), repeats)
        t_d = time_events(cp, lambda: torch._grouped_mm(hs, w_d, offs=offs), repeats)
        return {"gate_up_s": t_gu, "down_s": t_d, "torch": torch.__version__}
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
        routing, rcache = moe.route_forward(L["logits"], K, True)
        _, cache = moe.experts_forward(L["x"], routing, *W(L), *loras(L))
        _, dweights, _, _, _ = moe.experts_backward(L["dy"], cache, *W(L), need_dw=False)
        moe.route_backward(dweights, rcache)

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


def bench_size(cp, torch, T: int, repeats: int, ceil: dict, dw_max_tokens: int) -> dict:
    L = make_layer(cp, T, lora=True)
    L0 = dict(L, lora_gate=None, lora_up=None, lora_down=None)
    routing, rcache = moe.route_forward(L["logits"], K, True)
    _, cache = moe.experts_forward(L["x"], routing, *W(L), *loras(L))
    y0, cache0 = moe.experts_forward(L["x"], routing, *W(L))
    row = {"tokens": T, "pairs": T * K}
    row["rel_err_vs_f32_loop"] = check_against_loop(cp, L0, routing, y0)
    row["route_forward_s"] = time_events(cp, lambda: moe.route_forward(L["logits"], K, True), repeats)
    row["experts_forward_s"] = time_events(cp, lambda: moe.experts_forward(L["x"], routing, *W(L)), repeats)
    row["experts_forward_lora_s"] = time_events(
        cp, lambda: moe.experts_forward(L["x"], routing, *W(L), *loras(L)), repeats
    )
    row["experts_backward_lora_s"] = time_events(
        cp, lambda: moe.experts_backward(L["dy"], cache, *W(L), need_dw=False), repeats
    )
    dweights = cp.random.standard_normal((T, K), dtype=cp.float32)
    row["route_backward_s"] = time_events(cp, lambda: moe.route_backward(dweights, rcache), repeats)
    if T <= dw_max_tokens:
        row["experts_backward_dw_s"] = time_events(
            cp, lambda: moe.experts_backward(L["dy"], cache0, *W(L), need_dw=True), max(3, repeats // 3)
        )
    # per kernel: one forward + backward with LoRA and one with dW, through the timing launcher
    timer = KernelTimer(cp)
    per_kernel: dict[str, float] = defaultdict(float)
    for _ in range(repeats):
        r2, c2 = moe.route_forward_on(timer, L["logits"], K, True)
        _, ec = moe.experts_forward_on(timer, L["x"], r2, *W(L), *loras(L))
        moe.experts_backward_on(timer, L["dy"], ec, *W(L), need_dw=False)
        for k, v in timer.collect().items():
            per_kernel[k] += v / repeats
    row["kernels_s"] = dict(per_kernel)
    flops = kernel_flops(T, lora=True, need_dw=False)
    row["kernels_tflops"] = {k: flops[k] / per_kernel[k] / 1e12 for k in flops if per_kernel.get(k)}
    # floors of the four base matmuls: max(FLOPs / bf16 rate, weight bytes / copy bandwidth)
    wb = weight_bytes()
    floors = {}
    for k, w_part in (("moe_gate_up_bf16", 2 / 3), ("moe_down_bf16", 1 / 3), ("moe_down_back_bf16", 1 / 3),
                      ("moe_dx_bf16", 2 / 3)):  # fmt: skip
        floors[k] = max(
            flops[k] / (ceil["bf16_matmul_tflops"] * 1e12), wb * w_part / (ceil["copy_gbps"] * 1e9)
        )
    row["floors_s"] = floors
    row["grouped_mm"] = grouped_mm_baseline(cp, torch, L, routing, repeats)
    return row


def format_table(rows: list[dict], ceil: dict, sync: dict) -> str:
    out = [
        f"ceilings: bf16 matmul {ceil['bf16_matmul_tflops']:.0f} TFLOP/s ({ceil['bf16_matmul_source']}), "
        f"f32 matmul {ceil['f32_matmul_tflops']:.1f} TFLOP/s, copy {ceil['copy_gbps']:.0f} GB/s",
        f"layer C={C} F={F} E={E} K={K}, bf16 stacks, LoRA r={R}; times in ms (median)",
        f"{'tokens':>6s} {'route':>6s} {'fwd':>7s} {'fwd+L':>7s} {'bwd+L':>7s} {'bwd dW':>7s} {'rbwd':>6s} "
        f"{'gate_up':>14s} {'down':>14s} {'down_back':>14s} {'dx':>14s} {'gmm gu/dn':>13s} {'err':>8s}",
    ]
    for r in rows:
        k, tf, fl = r["kernels_s"], r["kernels_tflops"], r["floors_s"]

        def cell(name, k=k, tf=tf, fl=fl):
            if name not in k:
                return f"{'-':>14s}"
            return f"{k[name] * 1e3:5.2f}/{tf.get(name, 0):4.0f}T/{fl[name] / k[name] * 100:3.0f}%"

        g = r["grouped_mm"]
        gmm = f"{g['gate_up_s'] * 1e3:5.2f}/{g['down_s'] * 1e3:5.2f}" if "gate_up_s" in g else "n/a"
        dw = f"{r['experts_backward_dw_s'] * 1e3:7.2f}" if "experts_backward_dw_s" in r else f"{'-':>7s}"
        out.append(
            f"{r['tokens']:6d} {r['route_forward_s'] * 1e3:6.3f} {r['experts_forward_s'] * 1e3:7.2f} "
            f"{r['experts_forward_lora_s'] * 1e3:7.2f} {r['experts_backward_lora_s'] * 1e3:7.2f} {dw} "
            f"{r['route_backward_s'] * 1e3:6.3f} {cell('moe_gate_up_bf16')} {cell('moe_down_bf16')} "
            f"{cell('moe_down_back_bf16')} {cell('moe_dx_bf16')} {gmm:>13s} {r['rel_err_vs_f32_loop']:8.1e}"
        )
    out.append("kernel cells: ms / achieved TFLOP/s / floor as % of the time (100% = at the floor)")
    for r in rows:
        if "error" in r["grouped_mm"]:
            out.append(f"torch._grouped_mm at {r['tokens']} tokens: {r['grouped_mm']['error']}")
            break
    out.append(
        f"host syncs over {sync['layers']} MoE layers (fwd+bwd): {sync['counted_syncs']} counted in "
        f"patched calls "
        f"({len(sync['patched'])} patched, {len(sync['unpatchable'])} not patchable); host "
        f"{'BLOCKED' if sync['host_blocked'] else 'not blocked'}: {sync['host_s'] * 1e3:.1f} ms while a "
        f"{sync['total_s'] * 1e3:.0f} ms kernel ran ahead"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--dw-max-tokens", type=int, default=2048, help="time need_dw=True up to this many tokens"
    )
    args = ap.parse_args(argv)
    import cupy as cp

    try:
        import torch
    except ImportError:
        torch = None
    log(f"device: {cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)['name'].decode()}")
    t0 = time.perf_counter()
    moe.route_forward(cp.zeros((1, E), cp.float32), K, True)  # compile and load the kernels
    log(f"kernels compiled and loaded in {time.perf_counter() - t0:.1f} s")
    ceil = ceilings(cp, torch)
    log(f"ceilings: {ceil}")
    rows = []
    for T in args.tokens:
        t = time.perf_counter()
        rows.append(bench_size(cp, torch, T, args.repeats, ceil, args.dw_max_tokens))
        cp.get_default_memory_pool().free_all_blocks()
        log(f"{T} tokens done in {time.perf_counter() - t:.1f} s")
    sync = host_sync_check(cp, make_layer(cp, 512, lora=True))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_moe.json"), "w") as f:
            json.dump({"ceilings": ceil, "rows": rows, "host_sync": sync}, f, indent=1, default=str)
    log(format_table(rows, ceil, sync))
    return 0


if __name__ == "__main__":
    sys.exit(main())
