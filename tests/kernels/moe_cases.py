"""Inputs, references and checks shared by the MoE kernel tests (CPU emulation and GPU) and the parity report.

A case is a layer shape (N tokens, C channels, F expert width, E experts, K per token), whether the
weights are renormalised, which expert weights carry LoRA, the dtype of the expert stacks (float32,
or bf16 bit patterns), and the options of the newer architectures: the gating function, a
selection bias and group limits (DeepSeek-V3), a weight scale (DeepSeek-V2/V3), expert biases and
the clamped SwiGLU (gpt-oss). Inputs are fresh random numbers, never zeros: LoRA B factors are
drawn too (training starts them at zero, which would hide a wrong dB or a dropped LoRA term), and
routing logits are spread so that near-ties never decide the top-k (exact ties are their own case).

`run_case` runs the whole MoE path (route forward, experts forward, experts backward with dW and
the LoRA factor gradients, route backward) through the `*_on` bodies of `engine.kernels.moe_cuda` on
any runtime: NumPy with the g++ emulation, or CuPy on a GPU. `check_case`
compares every output with the NumPy reference evaluated in float64 on the kernels' own routing
(bf16 stacks: on the bf16 values), and returns the relative errors it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.kernels import moe, moe_cuda
from engine.kernels.glu import OAI_LIMIT
from engine.kernels.linear import LoraTerm
from engine.kernels.runtime import Runtime

NAMES = ("gate", "up", "down")


@dataclass(frozen=True)
class MoeCase:
    name: str
    N: int  # tokens
    C: int  # channels (multiple of 8)
    F: int  # expert width (multiple of 8)
    E: int  # experts
    K: int  # experts per token
    renorm: bool = True
    lora: tuple[str, ...] = ()  # which of gate/up/down carry LoRA
    ranks: dict = field(default_factory=dict)  # rank per LoRA weight (default 4)
    dtype: str = "float32"  # expert stacks: "float32" or "bfloat16" (uint16 bits)
    skew: float = 0.0  # added to expert 0's logit (> 0: one expert takes many rows, several tiles)
    starve: int = 0  # experts E-starve..E-1 never chosen (logits far below): experts with no tokens
    ties: bool = False  # logits on a coarse grid: exact ties decide the top-k (lower id first)
    need_dw: bool = True
    gating: str = "softmax"  # "softmax", "sigmoid" (V3) or "softmax_selected" (gpt-oss)
    scale: float = 1.0  # expert_weights_scale
    sel_bias: bool = False  # V3's expert-selection bias (exp_probs_b)
    n_group: int = 0  # V3's expert groups, and groups used per token
    group_used: int = 0
    biases: tuple[str, ...] = ()  # which of gate/up/down carry a bias (gpt-oss: all three)
    act: str = "silu"  # "silu" or "swiglu_oai"

    def __str__(self) -> str:
        return self.name


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def make_inputs(case: MoeCase, rng: np.random.Generator) -> dict:
    """Host inputs of one case: float32 arrays (weights also as bf16 bits when the case says so)."""
    N, C, F, E, K = case.N, case.C, case.F, case.E, case.K
    if case.ties:
        logits = rng.integers(-2, 3, (N, E)).astype(np.float32)  # many exact ties
    else:
        # a random permutation of well-spaced levels per token, plus a little noise: no near-ties
        levels = np.tile(np.linspace(-3.0, 3.0, E, dtype=np.float32), (N, 1))
        logits = rng.permuted(levels, axis=1) + rng.uniform(-0.2, 0.2, (N, E)).astype(np.float32) * 6.0 / E
    logits[:, 0] += case.skew
    if case.starve:
        logits[:, E - case.starve :] -= 30.0
    inp = {
        "logits": logits.astype(np.float32),
        "x": rng.standard_normal((N, C)).astype(np.float32),
        "dy": rng.standard_normal((N, C)).astype(np.float32),
        "dweights": rng.standard_normal((N, K)).astype(np.float32),
    }
    if case.sel_bias:
        inp["sel_bias"] = rng.uniform(-0.5, 0.5, E).astype(np.float32)
    shapes = {"gate": (F, C), "up": (F, C), "down": (C, F)}
    for n, (n_out, n_in) in shapes.items():
        w = (rng.standard_normal((E, n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
        if case.act == "swiglu_oai" and n != "down":
            w *= 5.0  # gate and up values past the clamps at +-7
        if case.dtype == "bfloat16":
            inp[f"w_{n}_bits"] = bf16_bits(w)
            w = bf16_values(inp[f"w_{n}_bits"])
        inp[f"w_{n}"] = w
    for n in case.biases:
        inp[f"b_{n}"] = rng.standard_normal((E, shapes[n][0])).astype(np.float32)
    for n in case.lora:
        n_out, n_in = shapes[n]
        r = case.ranks.get(n, 4)
        inp[f"A_{n}"] = (rng.standard_normal((E, r, n_in)) / np.sqrt(n_in)).astype(np.float32)
        inp[f"B_{n}"] = (rng.standard_normal((E, n_out, r)) / np.sqrt(r)).astype(np.float32)
        inp[f"s_{n}"] = float(rng.uniform(0.5, 2.0))
    return inp


GUARD = 256  # poisoned elements before and after every buffer of a test run


def _poison_value(dtype) -> float:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.nan
    if dtype == np.uint16:
        return 0x7FC0  # a bf16 NaN: a weight read out of bounds turns the result into NaN
    return -7


class Poisoned:
    """An array module whose `empty` gives arrays inside a larger poisoned buffer: the array itself
    and GUARD elements on either side hold NaN (bf16 NaN for uint16, -7 for integers). Every output
    of the `*_on` bodies is born in `xp.empty`, so an element a kernel never wrote stays NaN, and
    `check_guards` finds any write past either end. `guarded(a)` places an input the same way: a read
    past its ends brings NaN into the results."""

    def __init__(self, xp):
        self._xp = xp
        self._buffers: list[tuple[object, int]] = []

    def __getattr__(self, name):
        return getattr(self._xp, name)

    def empty(self, shape, dtype=np.float32):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = int(np.prod(shape))
        flat = self._xp.empty(n + 2 * GUARD, dtype=dtype)
        flat.fill(_poison_value(dtype))
        self._buffers.append((flat, n))
        return flat[GUARD : GUARD + n].reshape(shape)

    def guarded(self, a):
        out = self.empty(a.shape, a.dtype)
        out[...] = self._xp.asarray(a)
        return out

    def check_guards(self) -> None:
        for flat, n in self._buffers:
            guards = self._xp.concatenate([flat[:GUARD], flat[GUARD + n :]])
            host = guards if self._xp is np else self._xp.asnumpy(guards)
            poison = _poison_value(host.dtype)
            ok = np.isnan(host).all() if host.dtype.kind == "f" else (host == poison).all()
            assert ok, f"a kernel wrote outside a buffer of {n} {host.dtype} elements"


class OnArrays(Runtime):
    """The launches of runtime `rt` with buffers from another array module `xp` (a `Poisoned` one)."""

    def __init__(self, rt: Runtime, xp) -> None:
        self.rt, self.xp = rt, xp

    def launch(self, *args, **kwargs) -> None:
        self.rt.launch(*args, **kwargs)

    def address(self, a) -> int:
        return self.rt.address(a)

    def gemm(self, *args, **kwargs) -> None:
        self.rt.gemm(*args, **kwargs)

    def gemm_batched(self, *args, **kwargs) -> None:
        self.rt.gemm_batched(*args, **kwargs)

    def gemm_indexed(self, *args, **kwargs) -> None:
        self.rt.gemm_indexed(*args, **kwargs)


def run_case(case: MoeCase, inp: dict, rt: Runtime, poison: bool = True) -> dict:
    """The MoE path of one case on runtime `rt`; every result as a host array.

    With `poison` (the default), inputs and outputs live in poisoned, guarded buffers (`Poisoned`),
    and writes outside any buffer fail the run.
    """
    xp = rt.xp
    to_host = (lambda a: a) if xp is np else (lambda a: None if a is None else xp.asnumpy(a))
    run_xp = Poisoned(xp) if poison else xp
    dev = run_xp.guarded if poison else ((lambda a: a) if xp is np else xp.asarray)
    w_key = "_bits" if case.dtype == "bfloat16" else ""
    W = [dev(inp[f"w_{n}{w_key}"]) for n in NAMES]
    loras = [
        LoraTerm(dev(inp[f"A_{n}"]), dev(inp[f"B_{n}"]), inp[f"s_{n}"]) if n in case.lora else None
        for n in NAMES
    ]
    run_rt = OnArrays(rt, run_xp)
    bias = dev(inp["sel_bias"]) if case.sel_bias else None
    routing, rcache = moe_cuda.route_forward_on(
        run_rt, dev(inp["logits"]), case.K, case.renorm, case.gating, case.scale, bias, case.n_group,
        case.group_used,
    )  # fmt: skip
    b = {f"b_{n}": dev(inp[f"b_{n}"]) for n in case.biases}
    y, cache = moe_cuda.experts_forward_on(run_rt, dev(inp["x"]), routing, *W, *loras, act=case.act, **b)
    dx, dweights, dW, dlora, db = moe_cuda.experts_backward_on(
        run_rt, dev(inp["dy"]), cache, *W, need_dw=case.need_dw, need_db=bool(case.biases)
    )
    dlogits = moe_cuda.route_backward_on(run_rt, dev(inp["dweights"]), rcache)
    if poison:
        run_xp.check_guards()
    out = {
        "probs": routing.probs,
        "topk": routing.topk,
        "weights": routing.weights,
        "w_sel": rcache.w_sel,
        "order": routing.order,
        "offsets": routing.offsets,
        "dlogits": dlogits,
        "y": y,
        "pair_out": cache.pair_out,
        "g": cache.per_expert.g,
        "u": cache.per_expert.u,
        "h": cache.per_expert.h,
        "dx": dx,
        "dweights_experts": dweights,
    }
    _put_weight_grads(out, dW, dlora, db)
    return {k: to_host(v) for k, v in out.items()}


def _put_weight_grads(out: dict, dW, dlora: dict, db) -> None:
    """The weight gradients under their result names: dW_<name> (when the base weights were trained),
    dA_<name> and dB_<name> of each LoRA pair, db_<name> of each bias."""
    if dW is not None:
        for n in NAMES:
            out[f"dW_{n}"] = dW[n]
    for n, (dA, dB) in dlora.items():
        out[f"dA_{n}"], out[f"dB_{n}"] = dA, dB
    for n, d in (db or {}).items():
        out[f"db_{n}"] = d


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """‖got − ref‖ / ‖ref‖ in float64 (NaN when got has a NaN: an element never written)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.isfinite(got).all():
        return float("nan")
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(got - ref) / (den if den > 0 else 1.0))


def row_err(got: np.ndarray, ref: np.ndarray) -> float:
    """The worst per-row relative error (rows of the last axis): one wrong row hides less in it than
    in the norm of the whole. A row's norm is floored at a tenth of the RMS row norm, so that a row
    that nearly cancels (a dot product near zero) is not judged by its own tiny norm. (The RMS row
    norm, not the median: the gradients of experts without tokens are rows of exact zeros.)"""
    got = np.asarray(got, dtype=np.float64).reshape(-1, ref.shape[-1])
    ref = np.asarray(ref, dtype=np.float64).reshape(-1, ref.shape[-1])
    if not np.isfinite(got).all():
        return float("nan")
    norms = np.linalg.norm(ref, axis=1)
    den = np.maximum(norms, max(0.1 * float(np.sqrt(np.mean(norms**2))), 1e-30))
    return float((np.linalg.norm(got - ref, axis=1) / den).max())


def tolerance(case: MoeCase, route: str = "v1") -> float:
    """float32 stacks: float32 arithmetic; bf16 stacks: activations rounded to bf16 on the tensor cores
    (route v1), and on the v2 routes (engine.kernels.moe_gemm) the LoRA factors, their intermediates,
    dy and [dg | du] too, every product's operands bf16: about 2.5x v1's error on these cases, whose
    LoRA terms are as large as the base products (B is drawn, not zero)."""
    if case.dtype == "float32":
        return 2e-5
    return 1e-2 if route == "v1" else 2e-2


def _device_clamp_sides(cache: moe.ExpertsCache, routing: moe.Routing, got: dict) -> moe.ExpertsCache:
    """gpt-oss's clamps make the activation's derivative jump at g = 7 and |u| = 7. Where the kernels'
    g or u (bf16 products: about 3e-3 relative) fall on the other side of a limit than the float64
    reference's, the reference differentiates at the kernels' value, so both take the same side of
    the jump (one such element otherwise moves a whole row's gradients by its full size)."""
    L = OAI_LIMIT
    acts = []
    for a in cache.per_expert:
        lo = int(routing.offsets[a.e])
        gd = got["g"][lo : lo + len(a.pairs)].astype(np.float64)
        ud = got["u"][lo : lo + len(a.pairs)].astype(np.float64)
        g = np.where((a.g < L) != (gd < L), gd, a.g)
        u = np.where((np.abs(a.u) < L) != (np.abs(ud) < L), ud, a.u)
        acts.append(a._replace(g=g, u=u))
    return cache._replace(per_expert=acts)


# what the v2 routes (engine.kernels.moe_gemm) give the tensor cores as bf16, beside the weights
V2_BF16_OPERANDS = ("x", "dy", "A_", "B_")


def operands(case: MoeCase, inp: dict, route: str = "v1") -> dict:
    """The inputs as the kernels of `route` take them, in float64: on the v2 routes of a bf16 case,
    x, dy and the LoRA factors rounded to bf16 as the kernels round them. Measured against the
    unrounded inputs instead, the one-token case's errors were 2-3x larger (each of its elements one
    dot product whose cancellation scales the operands' rounding up): 3 of 600 draws missed the
    tolerance, with the kernels right to their rounding."""
    bf16 = case.dtype == "bfloat16" and route != "v1"
    out = {}
    for k, v in inp.items():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            if bf16 and v.dtype == np.float32 and k.startswith(V2_BF16_OPERANDS) and not k.endswith("_bits"):
                v = bf16_values(bf16_bits(v))
            v = v.astype(np.float64)
        out[k] = v
    return out


def reference(case: MoeCase, inp: dict, got: dict, route: str = "v1") -> dict:
    """The NumPy reference in float64 on the kernels' own routing (top-k ids, order, offsets), from
    the operands as `route`'s kernels take them (`operands`)."""
    f64 = operands(case, inp, route)
    routing_ref, rcache_ref = moe.route_forward_ref(
        f64["logits"], case.K, case.renorm, case.gating, case.scale, f64.get("sel_bias"), case.n_group,
        case.group_used,
    )  # fmt: skip
    # the experts run on the routing the kernels chose (identical when the top-k agrees, checked apart)
    routing = moe.Routing(
        got["probs"].astype(np.float64),
        got["topk"].astype(np.int64),
        got["weights"].astype(np.float64),
        got["order"].astype(np.int64),
        got["offsets"].astype(np.int64),
    )
    W = [f64[f"w_{n}"] for n in NAMES]
    loras = [LoraTerm(f64[f"A_{n}"], f64[f"B_{n}"], inp[f"s_{n}"]) if n in case.lora else None for n in NAMES]
    b = {f"b_{n}": f64[f"b_{n}"] for n in case.biases}
    y, cache = moe.experts_forward_ref(f64["x"], routing, *W, *loras, act=case.act, **b)
    if case.act == "swiglu_oai":
        cache = _device_clamp_sides(cache, routing, got)
    dx, dweights, dW, dlora, db = moe.experts_backward_ref(
        f64["dy"], cache, *W, need_dw=case.need_dw, need_db=bool(case.biases)
    )
    dlogits = moe.route_backward_ref(f64["dweights"], rcache_ref)
    ref = {
        "probs": routing_ref.probs,
        "topk": routing_ref.topk,
        "weights": routing_ref.weights,
        "w_sel": rcache_ref.w_sel,
        "order": routing_ref.order,
        "offsets": routing_ref.offsets,
        "dlogits": dlogits,
        "y": y,
        "pair_out": cache.pair_out,
        "dx": dx,
        "dweights_experts": dweights,
    }
    for name in ("g", "u", "h"):  # per-expert lists to sorted rows
        rows = np.zeros((case.N * case.K, case.F))
        for acts in cache.per_expert:
            lo = int(routing.offsets[acts.e])
            rows[lo : lo + len(acts.pairs)] = getattr(acts, name)
        ref[name] = rows
    _put_weight_grads(ref, dW, dlora, db)
    return ref


EXACT = ("topk", "order", "offsets")


def check_case(case: MoeCase, inp: dict, got: dict, route: str = "v1") -> dict[str, float]:
    """Compare every output with the reference; AssertionError naming the first bad one and its errors.

    Returns {output: relative error} (0.0 for the exact integer outputs).
    """
    ref = reference(case, inp, got, route)
    assert set(got) == set(ref), f"{case}: outputs {sorted(got)} but reference {sorted(ref)}"
    errors: dict[str, float] = {}
    bad: list[str] = []
    tol = tolerance(case, route)
    # a row's error against its own norm: 10x the tolerance on v1. A row is one dot product per element
    # (rows of a gradient: d_f times a vector), and one that nearly cancels carries more of bf16's
    # error: on the v2 routes, whose LoRA and gradient operands are bf16 too, a tiny case's worst row
    # reaches 0.4 (a wrong row is > 1), so 25x; gpt-oss's bf16 rows 25x on every route, whose biases
    # put the pre-activations at 5-15 (bf16 rounds them by 0.02-0.06) where the clamped SwiGLU's slope
    # is steepest relative to the row (measured up to 10.3x on v1, on rows at the floor of 0.1 x the
    # rms norm)
    oss_bf16 = case.act == "swiglu_oai" and case.dtype == "bfloat16"
    row_factor = 25 if route != "v1" or oss_bf16 else 10
    for k in ref:
        if k in EXACT:
            same = got[k].shape == ref[k].shape and np.array_equal(got[k], ref[k])
            errors[k] = 0.0 if same else float("inf")
            if not same:
                diff = np.flatnonzero(got[k].reshape(-1) != ref[k].reshape(-1))
                bad.append(f"{k}: differs at {diff[:8].tolist()} ({diff.size} of {ref[k].size})")
            continue
        if got[k].shape != ref[k].shape:
            bad.append(f"{k}: shape {got[k].shape}, reference {ref[k].shape}")
            continue
        # routing outputs are float32 arithmetic on every path; the rest follow the stacks' dtype
        t = 2e-5 if k in ("probs", "weights", "w_sel", "dlogits") else tol
        e, re_ = rel_err(got[k], ref[k]), row_err(got[k], ref[k])
        errors[k] = e
        if not (e <= t and re_ <= row_factor * t):
            bad.append(f"{k}: rel err {e:.3g}, worst row {re_:.3g} (tolerance {t:g})")
    assert not bad, f"{case} ({case.dtype}): " + "; ".join(bad)
    return errors


V3 = dict(gating="sigmoid", sel_bias=True, scale=2.5)  # DeepSeek-V3's router (groups: per case)
OSS = dict(
    renorm=False, gating="softmax_selected", biases=("gate", "up", "down"), act="swiglu_oai"
)  # gpt-oss


def cases(gpu: bool = False) -> list[MoeCase]:
    """The parity cases: emulation-sized, or GPU-sized (`gpu`: more tokens, real widths, E = 128)."""
    all_lora = ("gate", "up", "down")
    if not gpu:
        return [
            MoeCase("k2-lora-skew", N=90, C=72, F=40, E=4, K=2, lora=all_lora, ranks={"up": 3}, skew=4.0),
            MoeCase("k1-norenorm", N=24, C=48, F=24, E=6, K=1, renorm=False, lora=("down",), starve=2),
            MoeCase(
                "k8-e128-starved", N=12, C=32, F=16, E=128, K=8, lora=("gate",), starve=64, need_dw=False
            ),
            MoeCase("ties", N=16, C=16, F=8, E=8, K=3, ties=True),
            MoeCase("bf16-k2-lora", N=90, C=72, F=40, E=4, K=2, lora=all_lora, skew=4.0, dtype="bfloat16"),
            MoeCase(
                "bf16-k8-starved", N=12, C=136, F=16, E=16, K=8, starve=4, dtype="bfloat16", need_dw=False
            ),
            # DeepSeek-V3: sigmoid gating, selection bias, 2 of 4 groups, renormalised, scaled
            MoeCase(
                "v3-groups", N=40, C=32, F=24, E=16, K=4, n_group=4, group_used=2, lora=("gate", "down"), **V3
            ),
            # DeepSeek-V2: softmax without renormalisation, scaled
            MoeCase("v2-scale", N=24, C=32, F=16, E=6, K=2, renorm=False, scale=2.0, lora=("up",)),
            # gpt-oss: softmax over the chosen logits, biases everywhere, clamped SwiGLU
            MoeCase("oss", N=30, C=48, F=32, E=8, K=2, lora=all_lora, **OSS),
            MoeCase("bf16-oss", N=30, C=48, F=32, E=8, K=2, lora=("up",), dtype="bfloat16", **OSS),
        ]
    out = []
    for dtype in ("float32", "bfloat16"):
        out += [
            MoeCase(
                "k8-e128-lora", N=256, C=512, F=192, E=128, K=8, lora=all_lora, ranks={"up": 8}, dtype=dtype
            ),
            MoeCase("k1-norenorm", N=300, C=264, F=136, E=16, K=1, renorm=False, lora=("down",), dtype=dtype),
            MoeCase("k8-starved", N=200, C=256, F=128, E=64, K=8, starve=24, dtype=dtype),
            MoeCase("skewed", N=512, C=256, F=256, E=8, K=2, lora=("gate", "up"), skew=5.0, dtype=dtype),
            MoeCase("ties", N=64, C=64, F=64, E=32, K=4, ties=True, dtype=dtype, need_dw=False),
            MoeCase(
                "v3-groups",
                N=256,
                C=256,
                F=128,
                E=64,
                K=8,
                n_group=8,
                group_used=4,
                lora=all_lora,
                dtype=dtype,
                **V3,
            ),  # fmt: skip
            MoeCase("oss", N=256, C=256, F=128, E=32, K=4, lora=all_lora, dtype=dtype, **OSS),
        ]
    return out
