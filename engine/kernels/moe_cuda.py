"""The GPU twins of the mixture-of-experts op (`engine.kernels.moe`, whose NumPy reference they follow):
`route_forward`, `route_backward`, `experts_forward` and `experts_backward` on CuPy arrays, every
expert at once in grouped kernels driven by expert offsets that stay on the device, so a layer's MoE
forward and backward never synchronise with the host.

Their bodies are the `*_on(rt, ...)` functions, written against a `Runtime` (engine.kernels.runtime)
so that tests/kernels runs the same code on the CPU with the kernels built by g++. The CUDA C++ is
engine/kernels/cuda/moe.cu; bf16 stacks may take the v2 expert kernels of engine.kernels.moe_gemm or
engine.kernels.moe_cublas instead (`moe_gemm.route()`). The four ops share the dtype contract, the
cache layout (`PackedActs`) and the determinism rules written below, which is why they are one module.

Not here: the specification (engine.kernels.moe), the CPU twin (engine.kernels.moe_cpu).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import moe_cublas, moe_gemm
from .glu import silu
from .linear import LoraTerm
from .moe import (
    ExpertActs,
    ExpertsCache,
    RouteCache,
    Routing,
    check_expert_act,
    check_routing_options,
)
from .nvrtc import KernelSource
from .runtime import Runtime, runtime_for, to_host

# Dtype contract of the CuPy twins (everything C-contiguous, on one device):
# - route_forward: logits (N, E) float32, 1 <= K <= E <= MAX_E, bias (E,) float32 or None, n_group
#   <= ROUTE_THREADS. The Routing it returns holds probs (N, E) float32, topk (N, K) int32, weights
#   (N, K) float32, order (N*K,) int32 and offsets (E+1,) int32 (the reference gives int64 ids; the
#   values are the same). RouteCache.w_sel is (N, K) float32, wsum (N, 1) float32 when renormalised,
#   else None; clamped is None (the backward recomputes it from w_sel, the same float sum).
# - experts_forward: x (N, C) float32; the three expert stacks are CuPy arrays w_gate/w_up
#   (E, F, C) and w_down (E, C, F), all float32 or all bf16 given as uint16 bit patterns (CuPy has
#   no bfloat16 dtype; the weight store dequantizes a GGUF stack into such a buffer with
#   `dequant(..., dtype="bfloat16")`); C and F multiples of 8 (16-byte rows). A lazy stack on the
#   GPU must expose `__cuda_array_interface__` (it is taken as a CuPy view, no copy); anything else
#   is a TypeError, never a silent host-to-device copy per layer. LoRA factors A (E, r, n_in) and
#   B (E, n_out, r) float32, any rank per weight; biases b_gate, b_up (E, F) and b_down (E, C) float32
#   or None; act "silu" or "swiglu_oai" (cuda/glu.cuh, fused into the gate/up epilogue and the down
#   backward on every route). Outputs are float32; the bias gradients (need_db) are per-expert column
#   sums, through an OUT_PROD_ID kernel against a column of ones.
# - Routes: bf16 stacks take the v2 expert kernels of engine.kernels.moe_gemm (`moe_gemm.route()`:
#   "tc", its tensor-core grouped GEMMs with the LoRA folded into K and OUT_PROD_ID on the tensor
#   cores, or "cublas", engine.kernels.moe_cublas) unless $TUNE_MOE_GEMM=v1 picks the kernels below;
#   float32 stacks always take v1. Biases and both activations are in every route's epilogues. The
#   v2 routes round every product's operands to bf16 (LoRA factors and intermediates, dy and
#   [dg | du] too; the bias gradients sum bf16 dg, du and w dy), with fp32 sums. The routing, cache
#   layout, combine and token reductions are the same on every route.
# - Numerics (v1): bf16 stacks run the base matmuls on the tensor cores (mma.sync m16n8k16 bf16, fp32
#   accumulation) with the activation operand (x, h, dy*w, dg|du) rounded to bf16 as it is loaded;
#   float32 stacks run them in float32 FMA (no tf32). LoRA products, biases, the activation, the routing and
#   every weight or factor gradient (OUT_PROD_ID) run in float32 from float32 activations.
#
# The GPU cache: ExpertsCache(x, routing, pair_out, per_expert, loras, biases, act) as on the CPU, where
# per_expert is one PackedActs record instead of a list: the (N*K, F) arrays g, u (biases included), h and the
# (N*K, r) LoRA intermediates of every routed pair, rows in sorted order (row p belongs to pair
# routing.order[p], and the rows of expert e are offsets[e]:offsets[e+1]); pair_out is (N*K, C)
# by pair id, as in the reference. The activation of g is not kept: the backward recomputes it.
#
# No host synchronisation anywhere on this path: shapes come from array metadata, and every
# kernel that works per expert reads the expert offsets on the device. The grouped kernels are
# launched over an upper bound of row tiles, ceil(N*K / BM) + min(E, N*K) (each expert has at most
# one partial tile); a block first finds its (expert, row range) by a prefix over the offsets
# (`find_tile`, a block-wide scan of ceil(n_e / BM) over E), and blocks past the last tile exit.
#
# Determinism: no floating-point atomics anywhere. Every output element is written by exactly one
# thread, whose sum runs in a fixed order: the counting sort is stable by construction (one block
# per expert compacts that expert's pairs in pair order), the OUT_PROD_ID sums run over an
# expert's rows in sorted order inside one block, and dx is a segmented reduction: the experts'
# per-pair rows are scattered to pair order (dx_pairs, pair_out), then each token adds its K
# slots in slot order. Two runs give the same bits.

MAX_E = 1024  # experts the routing kernels hold in shared memory (one float each)
ROUTE_THREADS = 128  # routing: one block per token
SORT_THREADS = 256  # counting sort: one block per expert
TOKEN_THREADS = 128  # combine / dx reduction: one block per token
GEMM_THREADS = 128  # grouped base matmuls: 4 warps, each a 32 x 64 piece of the 64 x 128 tile
GEMM_BM = 64  # sorted pair rows per tile
GEMM_BN = 128  # output columns per tile (gate/up: 64 columns of each)
GU_COLS = GEMM_BN // 2
ROWS_THREADS = 256  # skinny grouped matmuls (LoRA intermediates): 64 rows x 32 columns per tile
ROWS_BM = 64
ROWS_BN = 32
OUTER_THREADS = 256  # OUT_PROD_ID: a 64 x 64 tile of one expert's gradient per block
OUTER_TILE = 64


GEMM_KERNELS = tuple(
    f"moe_{op}_{t}" for t in ("bf16", "f32") for op in ("gate_up", "down", "down_back", "dx")
)
KERNEL_THREADS = {  # threads per block of every kernel in SOURCE
    "moe_route_topk": ROUTE_THREADS,
    "moe_route_sort": SORT_THREADS,
    "moe_route_backward": ROUTE_THREADS,
    "moe_combine": TOKEN_THREADS,
    "moe_token_backward": TOKEN_THREADS,
    "moe_rows_f32": ROWS_THREADS,
    "moe_outer_f32": OUTER_THREADS,
    **dict.fromkeys(GEMM_KERNELS, GEMM_THREADS),
}
KERNELS = tuple(KERNEL_THREADS)


SOURCE = KernelSource.from_file(
    "moe.cu",
    kernels=KERNELS,
    defines={
        "MAX_E": MAX_E,
        "ROUTE_THREADS": ROUTE_THREADS,
        "SORT_THREADS": SORT_THREADS,
        "TOKEN_THREADS": TOKEN_THREADS,
        "GT": GEMM_THREADS,
        "BM": GEMM_BM,
        "BN": GEMM_BN,
        "RT": ROWS_THREADS,
        "RBM": ROWS_BM,
        "RBN": ROWS_BN,
        "OT": OUTER_THREADS,
        "OTILE": OUTER_TILE,
    },
)
SOURCES = (SOURCE,)


class PackedActs(NamedTuple):
    """`ExpertsCache.per_expert` on the GPU: every routed pair's activations in one record.

    Rows are in sorted order: row p belongs to pair routing.order[p] (token order[p] // K), and the
    rows of expert e are offsets[e]:offsets[e+1]. silu(g) is not stored; the backward recomputes it.
    """

    g: Any  # (N*K, F) gate pre-activation
    u: Any  # (N*K, F) up projection
    h: Any  # (N*K, F) silu(g) * u, the down projection's input
    xa_gate: Any | None  # (N*K, r) x A_gate^T (gate LoRA)
    xa_up: Any | None  # (N*K, r) x A_up^T (up LoRA)
    ha_down: Any | None  # (N*K, r) h A_down^T (down LoRA)


def unpack_acts(acts: PackedActs, routing: Routing) -> list[ExpertActs]:
    """The reference's per-expert list (host arrays) from a packed record: for tests and inspection."""
    order, offsets = to_host(routing.order), to_host(routing.offsets)
    host = [None if a is None else to_host(a) for a in acts]
    g, u, h, xa_g, xa_u, ha_d = host
    out = []
    for e in range(len(offsets) - 1):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if lo == hi:
            continue
        part = [None if a is None else a[lo:hi] for a in (xa_g, xa_u, ha_d)]
        out.append(
            ExpertActs(e, order[lo:hi].astype(np.int64), g[lo:hi], u[lo:hi], silu(g[lo:hi]), h[lo:hi], *part)
        )
    return out


def _i32(v: int) -> np.int32:
    return np.int32(v)


def _f32(v: float) -> np.float32:
    return np.float32(v)


def _check_grid(name: str, grid: tuple[int, int]) -> None:
    if grid[0] > 2**31 - 1 or grid[1] > 65535:
        raise ValueError(f"{name}: grid {grid} is too large for one launch; split the batch")


def _launch(rt: Runtime, name: str, grid: tuple[int, int], args: tuple) -> None:
    """Kernel `name` of SOURCE on `rt`, KERNEL_THREADS[name] threads per block; args are arrays
    (pointers), None (a null pointer), np.int32 and np.float32 scalars. An empty grid launches nothing."""
    if grid[0] and grid[1]:
        _check_grid(name, grid)
        rt.launch(SOURCE, name, grid, (KERNEL_THREADS[name],), args)


def _contiguous(a: Any, what: str, dtype: Any, xp: Any) -> Any:
    if a.dtype != dtype:
        raise TypeError(f"{what} must be {np.dtype(dtype).name}, got {a.dtype}")
    return _aligned(xp.ascontiguousarray(a), xp)


def _aligned(a: Any, xp: Any) -> Any:
    """`a`, or a fresh copy when it does not start on a 16-byte boundary (the kernels' float4/uint4
    loads need it; a C-contiguous view into a larger buffer may start anywhere)."""
    address = a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data
    return a if address % 16 == 0 else xp.array(a, copy=True)


def _expert_stack(w: Any, what: str, xp: Any) -> Any:
    """An expert stack as an array of xp: an array as it is, or a device view of a lazy stack."""
    if isinstance(w, xp.ndarray):
        return w
    if xp is not np and hasattr(w, "__cuda_array_interface__"):
        return xp.asarray(w)
    raise TypeError(
        f"{what} must be a {xp.__name__} array (E, n_out, n_in) of float32 or bf16 bits (uint16) on the "
        f"device, or expose __cuda_array_interface__; got {type(w).__name__}. The GPU path never copies "
        "a stack from the host per layer: dequantize it into a device buffer first (kernels.dequant)"
    )


def _stacks(w_gate: Any, w_up: Any, w_down: Any, E: int, C: int, xp: Any) -> tuple[Any, Any, Any, int, bool]:
    wg, wu, wd = (
        _expert_stack(w, n, xp) for w, n in ((w_gate, "w_gate"), (w_up, "w_up"), (w_down, "w_down"))
    )
    if wg.ndim != 3 or wg.shape[0] != E or wg.shape[2] != C:
        raise ValueError(f"w_gate must be (E={E}, F, C={C}), got {tuple(wg.shape)}")
    F = wg.shape[1]
    if tuple(wu.shape) != (E, F, C) or tuple(wd.shape) != (E, C, F):
        raise ValueError(
            f"w_up must be (E, F, C) = {(E, F, C)} and w_down (E, C, F) = {(E, C, F)}; "
            f"got {tuple(wu.shape)} and {tuple(wd.shape)}"
        )
    dt = wg.dtype
    if dt not in (np.float32, np.uint16) or wu.dtype != dt or wd.dtype != dt:
        raise TypeError(
            "expert stacks must all be float32 or all bf16 bit patterns (uint16); "
            f"got {wg.dtype}, {wu.dtype}, {wd.dtype}"
        )
    if C % 8 or F % 8:
        raise ValueError(f"the GPU experts need C and F multiples of 8 (16-byte rows); got C={C}, F={F}")
    return (*(_aligned(xp.ascontiguousarray(w), xp) for w in (wg, wu, wd)), F, dt == np.uint16)


class _Lora(NamedTuple):
    A: Any  # (E, r, n_in) float32
    B: Any  # (E, n_out, r) float32
    s: np.float32
    r: int


def _lora(lora: LoraTerm | None, what: str, E: int, n_out: int, n_in: int, xp: Any) -> _Lora | None:
    if lora is None:
        return None
    A = _contiguous(lora.A, f"{what} LoRA A", np.float32, xp)
    B = _contiguous(lora.B, f"{what} LoRA B", np.float32, xp)
    r = A.shape[1] if A.ndim == 3 else -1
    if A.shape != (E, r, n_in) or B.shape != (E, n_out, r):
        raise ValueError(
            f"{what} LoRA factors must be A (E, r, {n_in}) and B (E, {n_out}, r) with E={E}; "
            f"got {tuple(A.shape)} and {tuple(B.shape)}"
        )
    return _Lora(A, B, _f32(lora.s), r)


def _routing_arrays(routing: Routing, xp: Any) -> tuple[Any, Any, Any]:
    order = _contiguous(routing.order, "routing.order", np.int32, xp)
    offsets = _contiguous(routing.offsets, "routing.offsets", np.int32, xp)
    weights = _contiguous(routing.weights, "routing.weights", np.float32, xp)
    return order, offsets, weights


def _rows(rt, a, a_mode, lda, rw, order, offsets, K, E, Kdim, w, w_nt, J, P):
    """moe_rows_f32: (P, J) = grouped A W_e (or A W_e^T when w_nt)."""
    out = rt.xp.empty((P, J), dtype=np.float32)
    grid = (-(-J // ROWS_BN), moe_gemm.row_tiles(P, E, ROWS_BM))
    args = (
        a,
        _i32(a_mode),
        _i32(lda),
        rw,
        order,
        offsets,
        _i32(K),
        _i32(E),
        _i32(Kdim),
        w,
        _i32(w_nt),
        _i32(J),
        out,
    )
    _launch(rt, "moe_rows_f32", grid, args)
    return out


def _outer(rt, l, l_mode, ldl, r, r_mode, ldr, rw, order, offsets, K, E, I, J, scale):
    """moe_outer_f32: (E, I, J) = scale * per-expert sums of L[p] (x) R[p]."""
    out = rt.xp.empty((E, I, J), dtype=np.float32)
    grid = (-(-I // OUTER_TILE) * -(-J // OUTER_TILE), E)
    args = (
        l,
        _i32(l_mode),
        _i32(ldl),
        r,
        _i32(r_mode),
        _i32(ldr),
        rw,
        order,
        offsets,
        _i32(K),
        _i32(I),
        _i32(J),
    )
    _launch(rt, "moe_outer_f32", grid, (*args, _f32(scale), out))
    return out


# row sources of moe_rows_f32 / moe_outer_f32 operands
_SORTED, _TOKEN, _TOKEN_WEIGHTED = 0, 1, 2


GATING_CODES = {"softmax": 0, "sigmoid": 1, "softmax_selected": 2}  # moe_route_topk's `gating`
ACT_CODES = {"silu": 0, "swiglu_oai": 2}  # the experts' `act` (cuda/glu.cuh ACT_SILU, ACT_OAI)


def route_forward_on(
    rt: Runtime,
    logits: Any,
    K: int,
    renorm: bool,
    gating: str = "softmax",
    scale: float = 1.0,
    bias: Any = None,
    n_group: int = 0,
    group_used: int = 0,
):
    """`route_forward` on a runtime: the GPU's, or in tests NumPy with the kernels built by g++."""
    xp = rt.xp
    if logits.ndim != 2:
        raise ValueError(f"logits must be (N, E), got shape {tuple(logits.shape)}")
    N, E = logits.shape
    check_routing_options(E, K, gating, n_group, group_used)
    if E > MAX_E or n_group > ROUTE_THREADS:
        raise ValueError(
            f"the GPU router takes E <= {MAX_E} and n_group <= {ROUTE_THREADS}; got {E}, {n_group}"
        )
    logits = _contiguous(logits, "logits", np.float32, xp)
    if bias is not None:
        bias = _contiguous(xp.asarray(bias), "routing bias", np.float32, xp)
        if tuple(bias.shape) != (E,):
            raise ValueError(f"the routing bias must be (E,) = ({E},), got {tuple(bias.shape)}")
    probs = xp.empty((N, E), dtype=np.float32)
    topk = xp.empty((N, K), dtype=np.int32)
    weights = xp.empty((N, K), dtype=np.float32)
    w_sel = xp.empty((N, K), dtype=np.float32)
    wsum = xp.empty((N, 1), dtype=np.float32)
    order = xp.empty((N * K,), dtype=np.int32)
    offsets = xp.empty((E + 1,), dtype=np.int32)
    options = (
        _i32(GATING_CODES[gating]),
        bias,
        _i32(n_group if n_group > 1 else 0),
        _i32(group_used),
        _f32(scale),
    )
    outs = (probs, topk, weights, w_sel, wsum)
    _launch(rt, "moe_route_topk", (N, 1), (logits, _i32(E), _i32(K), _i32(bool(renorm)), *options, *outs))
    _launch(rt, "moe_route_sort", (E, 1), (topk, _i32(N * K), _i32(E), order, offsets))
    routing = Routing(probs, topk, weights, order, offsets)
    return routing, RouteCache(routing, gating, w_sel, wsum if renorm else None, None, float(scale))


def route_backward_on(rt: Runtime, dweights: Any, cache: RouteCache) -> Any:
    """`route_backward` on a runtime."""
    xp = rt.xp
    routing, gating, w_sel, wsum, _, scale = cache
    N, E = routing.probs.shape
    K = routing.topk.shape[1]
    if tuple(dweights.shape) != (N, K):
        raise ValueError(f"dweights must be (N, K) = {(N, K)}, got {tuple(dweights.shape)}")
    dweights = _contiguous(dweights, "dweights", np.float32, xp)
    dlogits = xp.empty((N, E), dtype=np.float32)
    renorm = wsum is not None
    args = (dweights, routing.probs, routing.topk, w_sel, wsum, _i32(E), _i32(K), _i32(renorm))
    _launch(rt, "moe_route_backward", (N, 1), (*args, _i32(GATING_CODES[gating]), _f32(scale), dlogits))
    return dlogits


def _bias(b: Any, what: str, E: int, n: int, xp: Any) -> Any:
    if b is None:
        return None
    b = _contiguous(xp.asarray(b), what, np.float32, xp)
    if tuple(b.shape) != (E, n):
        raise ValueError(f"{what} must be (E, {n}) with E={E}, got {tuple(b.shape)}")
    return b


def experts_forward_on(
    rt: Runtime,
    x: Any,
    routing: Routing,
    w_gate: Any,
    w_up: Any,
    w_down: Any,
    lora_gate: LoraTerm | None = None,
    lora_up: LoraTerm | None = None,
    lora_down: LoraTerm | None = None,
    *,
    b_gate: Any = None,
    b_up: Any = None,
    b_down: Any = None,
    act: str = "silu",
):
    """`experts_forward` on a runtime."""
    xp = rt.xp
    check_expert_act(act)
    if x.ndim != 2:
        raise ValueError(f"x must be (N, C), got shape {tuple(x.shape)}")
    N, C = x.shape
    K = routing.topk.shape[1]
    E = routing.offsets.shape[0] - 1
    x = _contiguous(x, "x", np.float32, xp)
    order, offsets, weights = _routing_arrays(routing, xp)
    wg, wu, wd, F, bf = _stacks(w_gate, w_up, w_down, E, C, xp)
    lg, lu, ld = (
        _lora(lora_gate, "gate", E, F, C, xp),
        _lora(lora_up, "up", E, F, C, xp),
        _lora(lora_down, "down", E, C, F, xp),
    )
    bg, bu, bd = (
        _bias(b_gate, "b_gate", E, F, xp),
        _bias(b_up, "b_up", E, F, xp),
        _bias(b_down, "b_down", E, C, xp),
    )
    route = moe_gemm.route() if bf else "v1"
    if route != "v1":  # v2: grouped GEMMs on the tensor cores (our kernels, or cuBLAS over row tiles)
        forward = moe_gemm.experts_forward_tc if route == "tc" else moe_cublas.experts_forward_cublas
        epi = moe_gemm.Epilogue(bg, bu, bd, ACT_CODES[act])
        *packed, pair_out = forward(rt, x, order, offsets, K, wg, wu, wd, lg, lu, ld, epi)
        acts = PackedActs(*packed)
    else:
        biased = (bg, bu, bd, act)
        acts, pair_out = _experts_forward_v1(rt, x, order, offsets, K, wg, wu, wd, bf, lg, lu, ld, *biased)
    y = xp.empty((N, C), dtype=np.float32)
    _launch(rt, "moe_combine", (N, 1), (pair_out, weights, _i32(K), _i32(C), y))
    biases = (bg is not None, bu is not None, bd is not None)
    return y, ExpertsCache(x, routing, pair_out, acts, (lora_gate, lora_up, lora_down), biases, act)


def _experts_forward_v1(rt, x, order, offsets, K, wg, wu, wd, bf, lg, lu, ld, bg, bu, bd, act):
    """The v1 kernels of the experts' forward (moe.cu): (PackedActs, pair_out)."""
    xp = rt.xp
    C, F, E, P = x.shape[1], wg.shape[1], offsets.shape[0] - 1, order.shape[0]
    t = "bf16" if bf else "f32"
    tiles = moe_gemm.row_tiles(P, E, GEMM_BM)
    xa_g = _rows(rt, x, _TOKEN, C, None, order, offsets, K, E, C, lg.A, 1, lg.r, P) if lg else None
    xa_u = _rows(rt, x, _TOKEN, C, None, order, offsets, K, E, C, lu.A, 1, lu.r, P) if lu else None
    g, u, h = (xp.empty((P, F), dtype=np.float32) for _ in range(3))
    lora_g = (xa_g, lg.B, lg.s, _i32(lg.r)) if lg else (None, None, _f32(0), _i32(0))
    lora_u = (xa_u, lu.B, lu.s, _i32(lu.r)) if lu else (None, None, _f32(0), _i32(0))
    dims = (_i32(K), _i32(E), _i32(C), _i32(F))
    args = (x, order, offsets, *dims, wg, wu, *lora_g, *lora_u, bg, bu, _i32(ACT_CODES[act]), g, u, h)
    _launch(rt, f"moe_gate_up_{t}", (-(-F // GU_COLS), tiles), args)
    ha_d = _rows(rt, h, _SORTED, F, None, order, offsets, K, E, F, ld.A, 1, ld.r, P) if ld else None
    pair_out = xp.empty((P, C), dtype=np.float32)
    lora_d = (ha_d, ld.B, ld.s, _i32(ld.r)) if ld else (None, None, _f32(0), _i32(0))
    _launch(
        rt,
        f"moe_down_{t}",
        (-(-C // GEMM_BN), tiles),
        (h, order, offsets, _i32(E), _i32(C), _i32(F), wd, *lora_d, bd, pair_out),
    )
    return PackedActs(g, u, h, xa_g, xa_u, ha_d), pair_out


def experts_backward_on(
    rt: Runtime,
    dy: Any,
    cache: ExpertsCache,
    w_gate: Any,
    w_up: Any,
    w_down: Any,
    need_dw: bool = False,
    need_db: bool = False,
):
    """`experts_backward` on a runtime."""
    xp = rt.xp
    x, routing, pair_out, acts, loras, biases, act = cache
    if not isinstance(acts, PackedActs):
        raise TypeError("experts_backward on the GPU needs the cache of the GPU experts_forward (PackedActs)")
    N, C = x.shape
    K = routing.topk.shape[1]
    E = routing.offsets.shape[0] - 1
    P = N * K
    if tuple(dy.shape) != (N, C):
        raise ValueError(f"dy must be (N, C) = {(N, C)}, got {tuple(dy.shape)}")
    dy = _contiguous(dy, "dy", np.float32, xp)
    order, offsets, weights = _routing_arrays(routing, xp)
    wg, wu, wd, F, bf = _stacks(w_gate, w_up, w_down, E, C, xp)
    lg, lu, ld = (
        _lora(loras[0], "gate", E, F, C, xp),
        _lora(loras[1], "up", E, F, C, xp),
        _lora(loras[2], "down", E, C, F, xp),
    )
    t = "bf16" if bf else "f32"
    route = moe_gemm.route() if bf else "v1"
    if route != "v1":
        backward = moe_gemm.experts_backward_tc if route == "tc" else moe_cublas.experts_backward_cublas
        db_keys = tuple(k for k, has in zip(("gate", "up", "down"), biases, strict=True) if has and need_db)
        dx_pairs, dW, dlora, db = backward(
            rt, x, dy, weights, order, offsets, K, wg, wu, wd, lg, lu, ld, tuple(acts), need_dw,
            ACT_CODES[act], db_keys,
        )  # fmt: skip
        dx = xp.empty((N, C), dtype=np.float32)
        dweights = xp.empty((N, K), dtype=np.float32)
        _launch(rt, "moe_token_backward", (N, 1), (dx_pairs, pair_out, dy, _i32(K), _i32(C), dx, dweights))
        return dx, dweights, dW, dlora, db if need_db else None
    tiles = moe_gemm.row_tiles(P, E, GEMM_BM)
    rows = (order, offsets, K, E)
    # forward was: y_n = sum_k w_nk * down_e(h), h = silu(g) * u; do = dy w (never stored: the kernels
    # read dy[token] * w as they load it)
    do_b = _rows(rt, dy, _TOKEN_WEIGHTED, C, weights, *rows, C, ld.B, 0, ld.r, P) if ld else None
    dg, du = xp.empty((P, F), dtype=np.float32), xp.empty((P, F), dtype=np.float32)
    lora_d = (do_b, ld.A, ld.s, _i32(ld.r)) if ld else (None, None, _f32(0), _i32(0))
    dims = (_i32(K), _i32(E), _i32(C), _i32(F))
    args = (dy, weights, order, offsets, *dims, wd, *lora_d, acts.g, acts.u, _i32(ACT_CODES[act]), dg, du)
    _launch(rt, f"moe_down_back_{t}", (-(-F // GEMM_BN), tiles), args)
    dg_b = _rows(rt, dg, _SORTED, F, None, *rows, F, lg.B, 0, lg.r, P) if lg else None
    du_b = _rows(rt, du, _SORTED, F, None, *rows, F, lu.B, 0, lu.r, P) if lu else None
    dx_pairs = xp.empty((P, C), dtype=np.float32)
    lora_g = (dg_b, lg.A, lg.s, _i32(lg.r)) if lg else (None, None, _f32(0), _i32(0))
    lora_u = (du_b, lu.A, lu.s, _i32(lu.r)) if lu else (None, None, _f32(0), _i32(0))
    _launch(
        rt,
        f"moe_dx_{t}",
        (-(-C // GEMM_BN), tiles),
        (dg, du, order, offsets, _i32(E), _i32(C), _i32(F), wg, wu, *lora_g, *lora_u, dx_pairs),
    )
    dx = xp.empty((N, C), dtype=np.float32)
    dweights = xp.empty((N, K), dtype=np.float32)
    _launch(rt, "moe_token_backward", (N, 1), (dx_pairs, pair_out, dy, _i32(K), _i32(C), dx, dweights))
    # OUT_PROD_ID: per-expert sums of outer products over the expert's rows
    dW = None
    if need_dw:
        dW = {
            "gate": _outer(rt, dg, _SORTED, F, x, _TOKEN, C, None, *rows, F, C, 1.0),
            "up": _outer(rt, du, _SORTED, F, x, _TOKEN, C, None, *rows, F, C, 1.0),
            "down": _outer(rt, dy, _TOKEN_WEIGHTED, C, acts.h, _SORTED, F, weights, *rows, C, F, 1.0),
        }
    dlora = {}
    if ld:
        dA = _outer(rt, do_b, _SORTED, ld.r, acts.h, _SORTED, F, None, *rows, ld.r, F, ld.s)
        dB = _outer(rt, dy, _TOKEN_WEIGHTED, C, acts.ha_down, _SORTED, ld.r, weights, *rows, C, ld.r, ld.s)
        dlora["down"] = (dA, dB)
    for name, lo, d, d_b, xa in (("gate", lg, dg, dg_b, acts.xa_gate), ("up", lu, du, du_b, acts.xa_up)):
        if lo:
            dA = _outer(rt, d_b, _SORTED, lo.r, x, _TOKEN, C, None, *rows, lo.r, C, lo.s)
            dB = _outer(rt, d, _SORTED, F, xa, _SORTED, lo.r, None, *rows, F, lo.r, lo.s)
            dlora[name] = (dA, dB)
    dlora = {k: dlora[k] for k in ("gate", "up", "down") if k in dlora}
    db = None
    if need_db:  # per-expert column sums: OUT_PROD_ID against a column of ones
        ones = xp.ones((P, 1), dtype=np.float32)
        sources = {"gate": (dg, _SORTED, F, None, F), "up": (du, _SORTED, F, None, F),
                   "down": (dy, _TOKEN_WEIGHTED, C, weights, C)}  # fmt: skip
        db = {}
        for key, has in zip(("gate", "up", "down"), biases, strict=True):
            if has:
                src, mode, ld, rw, n = sources[key]
                db[key] = _outer(rt, src, mode, ld, ones, _SORTED, 1, rw, *rows, n, 1, 1.0).reshape(E, n)
    return dx, dweights, dW, dlora, db


# ----------------------------------------------------------------------------------------------
# the CuPy twins


def route_forward(logits: Any, K: int, renorm: bool, gating: str = "softmax", scale: float = 1.0,
                  bias: Any = None, n_group: int = 0, group_used: int = 0):  # fmt: skip
    """CUDA twin of `route_forward_ref`: (Routing, RouteCache) of CuPy arrays (dtypes above); no host sync."""
    rt = runtime_for(logits, "route_forward")
    with logits.device:
        return route_forward_on(rt, logits, K, renorm, gating, scale, bias, n_group, group_used)


def route_backward(dweights: Any, cache: RouteCache) -> Any:
    """CUDA twin of `route_backward_ref`: dlogits (N, E) float32."""
    rt = runtime_for(dweights, "route_backward")
    with dweights.device:
        return route_backward_on(rt, dweights, cache)


def experts_forward(
    x: Any,
    routing: Routing,
    w_gate: Any,
    w_up: Any,
    w_down: Any,
    lora_gate: LoraTerm | None = None,
    lora_up: LoraTerm | None = None,
    lora_down: LoraTerm | None = None,
    **options: Any,
):
    """CUDA twin of `experts_forward_ref` (options: b_gate, b_up, b_down, act): (y (N, C) float32,
    ExpertsCache with PackedActs). Expert stacks are device arrays, float32 or bf16 bits (uint16);
    see the dtype contract above."""
    rt = runtime_for(x, "experts_forward")
    with x.device:
        return experts_forward_on(
            rt, x, routing, w_gate, w_up, w_down, lora_gate, lora_up, lora_down, **options
        )


def experts_backward(dy: Any, cache: ExpertsCache, w_gate: Any, w_up: Any, w_down: Any, need_dw: bool = False,
                     need_db: bool = False):  # fmt: skip
    """CUDA twin of `experts_backward_ref`: (dx, dweights, dW or None, dlora, db or None), float32 CuPy
    arrays."""
    rt = runtime_for(dy, "experts_backward")
    with dy.device:
        return experts_backward_on(rt, dy, cache, w_gate, w_up, w_down, need_dw, need_db)
