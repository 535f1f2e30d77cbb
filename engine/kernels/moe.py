"""Mixture of experts: routing (softmax, top-k, renormalisation, a counting sort of token-slot pairs by
expert), the experts' grouped matmuls with per-expert LoRA (MUL_MAT_ID), the combine with routing
weights, and the backward passes (MUL_MAT_ID with transposed experts, OUT_PROD_ID).

`route_forward_ref`, `route_backward_ref`, `experts_forward_ref` and `experts_backward_ref` are the
NumPy reference (the specification, and the CPU engine's hot path). `route_forward`,
`route_backward`, `experts_forward` and `experts_backward` are their CUDA twins, same signatures,
on CuPy arrays: every expert at once in grouped kernels driven by expert offsets that stay on the
device, so a layer's MoE forward and backward never synchronise with the host. The twins' bodies
are the `*_on(rt, ...)` functions, written against a `Runtime` (engine.kernels.runtime) so that
tests/kernels runs the same code on the CPU with the kernels built by g++. The dtype contract, the
GPU cache layout (`PackedActs`) and the determinism rules are in the CUDA section below.

Not here: choosing or dequantizing expert weights (the weight store), the router's own linear layer,
the shared expert (engine.model.layers).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import moe_cublas, moe_gemm
from .cpu_workers import PIECE_MIN_FLOPS, run_each
from .linear import LoraTerm
from .nvrtc import KernelSource
from .runtime import Runtime, runtime_for, to_host
from .swiglu import SwigluCache, silu, swiglu_backward_ref


class Routing(NamedTuple):
    """Top-k routing of N tokens over E experts, with tokens sorted by expert once."""

    probs: np.ndarray  # (N, E) softmax of the router logits
    topk: np.ndarray  # (N, K) chosen expert ids, best first
    weights: np.ndarray  # (N, K) mixing weights (renormalised when asked)
    order: np.ndarray  # (N*K,) token-slot pairs sorted by expert: pair p = (order[p] // K, order[p] % K)
    offsets: np.ndarray  # (E+1,) pairs of expert e are order[offsets[e]:offsets[e+1]]


class RouteCache(NamedTuple):
    routing: Routing
    wsum: np.ndarray | None  # (N, 1) sum of the chosen probabilities, when renormalised
    renorm: bool


def route_forward_ref(logits: np.ndarray, K: int, renorm: bool):
    """Softmax over E, top-k by probability, optional renormalisation, counting sort by expert."""
    N, E = logits.shape
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)  # (N, E)
    # top-k, best first (stable on ties: lower expert id first, as a sort by -p)
    topk = np.argsort(-p, axis=-1, kind="stable")[:, :K]  # (N, K)
    w = np.take_along_axis(p, topk, axis=-1)  # (N, K)
    wsum = None
    if renorm:
        wsum = w.sum(axis=-1, keepdims=True)
        w = w / wsum
    flat = topk.reshape(-1)  # (N*K,)
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=E)
    offsets = np.zeros(E + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    routing = Routing(p, topk, w, order, offsets)
    return routing, RouteCache(routing, wsum, renorm)


def route_backward_ref(dweights: np.ndarray, cache: RouteCache) -> np.ndarray:
    """forward was: p = softmax(logits); w = p[topk] (/ sum p[topk] when renormalised).  Returns dlogits.

    The choice of the top k is piecewise constant, so the gradient flows through the chosen weights only.
    """
    routing, wsum, renorm = cache
    p, w = routing.probs, routing.weights
    if renorm:
        dsel = (dweights - (dweights * w).sum(axis=-1, keepdims=True)) / wsum
    else:
        dsel = dweights
    dp = np.zeros_like(p)
    np.put_along_axis(dp, routing.topk, dsel.astype(p.dtype), axis=-1)
    return p * (dp - (dp * p).sum(axis=-1, keepdims=True))


class ExpertActs(NamedTuple):
    """What one expert's forward computed on the n_e token-slot pairs routed to it."""

    e: int  # expert id
    pairs: np.ndarray  # (n_e,) token-slot pair ids (token = pair // K)
    g: np.ndarray  # (n_e, F) gate pre-activation
    u: np.ndarray  # (n_e, F) up projection
    sg: np.ndarray  # (n_e, F) silu(g)
    h: np.ndarray  # (n_e, F) silu(g) * u, the down projection's input
    xa_gate: np.ndarray | None  # (n_e, r) x A_gate^T (gate LoRA)
    xa_up: np.ndarray | None  # (n_e, r) x A_up^T (up LoRA)
    ha_down: np.ndarray | None  # (n_e, r) h A_down^T (down LoRA)


class ExpertsCache(NamedTuple):
    x: np.ndarray  # (N, C) input tokens
    routing: Routing
    pair_out: np.ndarray  # (N*K, C) each pair's expert output, before the routing weight
    per_expert: list[ExpertActs]  # experts that received tokens, in id order
    loras: tuple[LoraTerm | None, LoraTerm | None, LoraTerm | None]  # gate, up, down


def routed_experts(routing: Routing) -> list[int]:
    """The experts that received at least one token-slot pair, in id order."""
    return np.flatnonzero(np.diff(routing.offsets) > 0).tolist()


def experts_in_line(routing: Routing, C: int, F: int) -> bool:
    """Whether the experts' pieces are too small for CPU workers: the three products' FLOPs of an
    average routed expert under `PIECE_MIN_FLOPS` (engine.kernels.cpu_workers)."""
    routed = max(1, int(np.count_nonzero(np.diff(routing.offsets))))
    return 6.0 * len(routing.order) * C * F / routed < PIECE_MIN_FLOPS


def expert_linear(xe: np.ndarray, w, lora: LoraTerm | None, e: int):
    """Expert e's projection of its rows: (xe W_e^T (+ s (xe A_e^T) B_e^T), xa = xe A_e^T or None).
    The base product is taken as (W_e xe^T)^T: with the few rows an expert gets (~32), OpenBLAS runs
    the (n_out, n_in) x (n_in, n_e) form 35-45% faster than (n_e, n_in) x (n_in, n_out)
    (bench/CPU_NOTES.md); y is then a column-major view, which every later use takes as it is. The
    LoRA term is formed in the same transposed layout, so adding it is a contiguous pass; xa is
    a column-major view too."""
    yT = w[e] @ xe.T  # (n_out, n_e)
    if lora is None:
        return yT.T, None
    xaT = lora.A[e] @ xe.T  # (r, n_e)
    yT += lora.B[e] @ (lora.s * xaT)  # in yT's own layout: a contiguous add, the scale on the small factor
    return yT.T, xaT.T


def expert_linear_backward(dy: np.ndarray, xe: np.ndarray, xa, w, lora: LoraTerm | None, e: int, dlora):
    """Backward of `expert_linear`: returns dxe; writes expert e's (dA, dB) into `dlora` (a pair of
    (E, ...) arrays, or None without LoRA) as the outer products of its rows (OUT_PROD_ID)."""
    dx = dy @ w[e]
    if lora is not None:
        dyB = lora.s * (dy @ lora.B[e])  # (n_e, r), scaled: the products below need no scaling pass
        dx += dyB @ lora.A[e]
        np.matmul(dyB.T, xe, out=dlora[0][e])
        np.matmul(dy.T, lora.s * xa, out=dlora[1][e])
    return dx


def experts_forward_ref(
    x: np.ndarray,
    routing: Routing,
    w_gate,
    w_up,
    w_down,
    lora_gate: LoraTerm | None = None,
    lora_up: LoraTerm | None = None,
    lora_down: LoraTerm | None = None,
):
    """y_n = sum_k w_nk * down_e(silu(gate_e(x_n)) * up_e(x_n)), e = topk[n, k].

    x (N, C); w_gate/w_up (E, F, C); w_down (E, C, F), each an array or a lazy stack that gives
    one expert's matrix for `w[e]` (only the experts that receive tokens are read); expert LoRA
    A (E, r, n_in), B (E, n_out, r). Each expert runs once on the rows routed to it (the MUL_MAT_ID
    pattern), in the order of `routing.order`, which the backward pass reuses. Experts are
    independent pieces: with more than one CPU worker they run side by side
    (engine.kernels.cpu_workers), each writing only its own rows, with the same results.
    """
    N, C = x.shape
    K = routing.topk.shape[1]
    pair_out = np.zeros((N * K, C), dtype=x.dtype)  # expert output per (token, slot) pair, unweighted

    def expert(e: int) -> ExpertActs:
        pairs = routing.order[routing.offsets[e] : routing.offsets[e + 1]]
        xe = x[pairs // K]  # (n_e, C)
        g, xa_g = expert_linear(xe, w_gate, lora_gate, e)  # (n_e, F)
        u, xa_u = expert_linear(xe, w_up, lora_up, e)
        sg = silu(g)
        h = sg * u
        ye, ha_d = expert_linear(h, w_down, lora_down, e)  # (n_e, C)
        pair_out[pairs] = ye
        return ExpertActs(e, pairs, g, u, sg, h, xa_g, xa_u, ha_d)

    in_line = experts_in_line(routing, C, w_gate.shape[1])  # too small for CPU workers
    per_expert = run_each(expert, routed_experts(routing), in_line=in_line)
    y = np.einsum("nkc,nk->nc", pair_out.reshape(N, K, C), routing.weights.astype(x.dtype))
    return y, ExpertsCache(x, routing, pair_out, per_expert, (lora_gate, lora_up, lora_down))


def experts_backward_ref(dy: np.ndarray, cache: ExpertsCache, w_gate, w_up, w_down, need_dw: bool = False):
    """forward was: y_n = sum_k w_nk * down_e(silu(gate_e(x_n)) * up_e(x_n)).

    The expert weights are given again (arrays or lazy stacks, as in the forward).
    Returns (dx, dweights (N, K), dW or None, dlora): dW maps "gate"/"up"/"down" to (E, ...) arrays and
    dlora maps them to (dA, dB).
    Activations go back through each expert's transposed weights (MUL_MAT_ID backward); weight and LoRA
    factor gradients are per-expert sums of outer products over the tokens routed to it (OUT_PROD_ID).
    """
    x, routing, pair_out, per_expert, loras = cache
    lora_gate, lora_up, lora_down = loras
    N, C = x.shape
    K = routing.topk.shape[1]
    dweights = np.einsum("nkc,nc->nk", pair_out.reshape(N, K, C), dy)
    do = (dy[:, None, :] * routing.weights[:, :, None].astype(dy.dtype)).reshape(N * K, C)
    dx_pairs = np.zeros((N * K, C), dtype=dy.dtype)
    dW = (
        {k: np.zeros(w.shape, dy.dtype) for k, w in (("gate", w_gate), ("up", w_up), ("down", w_down))}
        if need_dw
        else None
    )
    dlora = {}
    for name, lora in (("gate", lora_gate), ("up", lora_up), ("down", lora_down)):
        if lora is not None:
            dlora[name] = (np.zeros_like(lora.A), np.zeros_like(lora.B))

    def expert(acts: ExpertActs) -> None:  # writes expert e's rows of dx_pairs, its slices of dW, dlora
        e, pairs, g, u, sg, h, xa_g, xa_u, ha_d = acts
        xe = x[pairs // K]  # (n_e, C)
        do_e = do[pairs]  # (n_e, C)
        dh = expert_linear_backward(do_e, h, ha_d, w_down, lora_down, e, dlora.get("down"))  # (n_e, F)
        dg, du = swiglu_backward_ref(dh, SwigluCache(g, u, sg))
        dxe = expert_linear_backward(dg, xe, xa_g, w_gate, lora_gate, e, dlora.get("gate"))
        dxe += expert_linear_backward(du, xe, xa_u, w_up, lora_up, e, dlora.get("up"))
        if need_dw:
            dW["down"][e] = do_e.T @ h
            dW["gate"][e] = dg.T @ xe
            dW["up"][e] = du.T @ xe
        dx_pairs[pairs] = dxe

    run_each(expert, per_expert, in_line=experts_in_line(routing, C, w_gate.shape[1]))
    dx = dx_pairs.reshape(N, K, C).sum(axis=1)
    return dx, dweights, dW, dlora


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Dtype contract of the CuPy twins (everything C-contiguous, on one device):
# - route_forward: logits (N, E) float32, 1 <= K <= E <= MAX_E. The Routing it returns holds probs
#   (N, E) float32, topk (N, K) int32, weights (N, K) float32, order (N*K,) int32 and offsets (E+1,)
#   int32 (the reference gives int64 ids; the values are the same). RouteCache.wsum is (N, 1)
#   float32 when renormalised, else None.
# - experts_forward: x (N, C) float32; the three expert stacks are CuPy arrays w_gate/w_up
#   (E, F, C) and w_down (E, C, F), all float32 or all bf16 given as uint16 bit patterns (CuPy has
#   no bfloat16 dtype; the weight store dequantizes a GGUF stack into such a buffer with
#   `dequant(..., dtype="bfloat16")`); C and F multiples of 8 (16-byte rows). A lazy stack on the
#   GPU must expose `__cuda_array_interface__` (it is taken as a CuPy view, no copy); anything else
#   is a TypeError, never a silent host-to-device copy per layer. LoRA factors A (E, r, n_in) and
#   B (E, n_out, r) float32, any rank per weight. Outputs are float32.
# - Routes: bf16 stacks take the v2 expert kernels of engine.kernels.moe_gemm (`moe_gemm.route()`:
#   "tc", its tensor-core grouped GEMMs with the LoRA folded into K and OUT_PROD_ID on the tensor
#   cores, or "cublas", engine.kernels.moe_cublas) unless $TUNE_MOE_GEMM=v1 picks the kernels below;
#   the v2 routes round every product's operands to bf16 (LoRA factors and intermediates too), with
#   fp32 sums. The routing, cache layout, combine and token reductions are the same on every route.
# - Numerics (v1): bf16 stacks run the base matmuls on the tensor cores (mma.sync m16n8k16 bf16, fp32
#   accumulation) with the activation operand (x, h, dy*w, dg|du) rounded to bf16 as it is loaded;
#   float32 stacks run them in float32 FMA (no tf32). LoRA products, the SwiGLU, the routing and
#   every weight or factor gradient (OUT_PROD_ID) run in float32 from float32 activations.
#
# The GPU cache: ExpertsCache(x, routing, pair_out, per_expert, loras) as on the CPU, where
# per_expert is one PackedActs record instead of a list: the (N*K, F) arrays g, u, h and the
# (N*K, r) LoRA intermediates of every routed pair, rows in sorted order (row p belongs to pair
# routing.order[p], and the rows of expert e are offsets[e]:offsets[e+1]); pair_out is (N*K, C)
# by pair id, as in the reference. silu(g) is not kept: the backward recomputes it.
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


def row_tiles(P: int, E: int, bm: int) -> int:
    """Row tiles a grouped launch covers: at least sum_e ceil(n_e / bm) for any split of P pairs over E
    experts (each expert adds at most one partial tile), known without reading the offsets."""
    return -(-P // bm) + min(E, P)


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
    grid = (-(-J // ROWS_BN), row_tiles(P, E, ROWS_BM))
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


def route_forward_on(rt: Runtime, logits: Any, K: int, renorm: bool):
    """`route_forward` on a runtime: the GPU's, or in tests NumPy with the kernels built by g++."""
    xp = rt.xp
    if logits.ndim != 2:
        raise ValueError(f"logits must be (N, E), got shape {tuple(logits.shape)}")
    N, E = logits.shape
    if not 1 <= K <= E or E > MAX_E:
        raise ValueError(f"need 1 <= K <= E <= {MAX_E}; got K={K}, E={E}")
    logits = _contiguous(logits, "logits", np.float32, xp)
    probs = xp.empty((N, E), dtype=np.float32)
    topk = xp.empty((N, K), dtype=np.int32)
    weights = xp.empty((N, K), dtype=np.float32)
    wsum = xp.empty((N, 1), dtype=np.float32)
    order = xp.empty((N * K,), dtype=np.int32)
    offsets = xp.empty((E + 1,), dtype=np.int32)
    _launch(
        rt,
        "moe_route_topk",
        (N, 1),
        (logits, _i32(E), _i32(K), _i32(bool(renorm)), probs, topk, weights, wsum),
    )
    _launch(rt, "moe_route_sort", (E, 1), (topk, _i32(N * K), _i32(E), order, offsets))
    routing = Routing(probs, topk, weights, order, offsets)
    return routing, RouteCache(routing, wsum if renorm else None, bool(renorm))


def route_backward_on(rt: Runtime, dweights: Any, cache: RouteCache) -> Any:
    """`route_backward` on a runtime."""
    xp = rt.xp
    routing, wsum, renorm = cache
    N, E = routing.probs.shape
    K = routing.topk.shape[1]
    if tuple(dweights.shape) != (N, K):
        raise ValueError(f"dweights must be (N, K) = {(N, K)}, got {tuple(dweights.shape)}")
    dweights = _contiguous(dweights, "dweights", np.float32, xp)
    dlogits = xp.empty((N, E), dtype=np.float32)
    args = (dweights, routing.probs, routing.topk, routing.weights, wsum if renorm else None)
    _launch(rt, "moe_route_backward", (N, 1), (*args, _i32(E), _i32(K), _i32(bool(renorm)), dlogits))
    return dlogits


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
):
    """`experts_forward` on a runtime."""
    xp = rt.xp
    if x.ndim != 2:
        raise ValueError(f"x must be (N, C), got shape {tuple(x.shape)}")
    N, C = x.shape
    K = routing.topk.shape[1]
    E = routing.offsets.shape[0] - 1
    P = N * K
    x = _contiguous(x, "x", np.float32, xp)
    order, offsets, weights = _routing_arrays(routing, xp)
    wg, wu, wd, F, bf = _stacks(w_gate, w_up, w_down, E, C, xp)
    lg, lu, ld = (
        _lora(lora_gate, "gate", E, F, C, xp),
        _lora(lora_up, "up", E, F, C, xp),
        _lora(lora_down, "down", E, C, F, xp),
    )
    t = "bf16" if bf else "f32"
    route = moe_gemm.route() if bf else "v1"
    if route != "v1":  # v2: grouped GEMMs on the tensor cores (our kernels, or cuBLAS over row tiles)
        forward = moe_gemm.experts_forward_tc if route == "tc" else moe_cublas.experts_forward_cublas
        *packed, pair_out = forward(rt, x, order, offsets, K, wg, wu, wd, lg, lu, ld)
        y = xp.empty((N, C), dtype=np.float32)
        _launch(rt, "moe_combine", (N, 1), (pair_out, weights, _i32(K), _i32(C), y))
        return y, ExpertsCache(x, routing, pair_out, PackedActs(*packed), (lora_gate, lora_up, lora_down))
    tiles = row_tiles(P, E, GEMM_BM)
    xa_g = _rows(rt, x, _TOKEN, C, None, order, offsets, K, E, C, lg.A, 1, lg.r, P) if lg else None
    xa_u = _rows(rt, x, _TOKEN, C, None, order, offsets, K, E, C, lu.A, 1, lu.r, P) if lu else None
    g, u, h = (xp.empty((P, F), dtype=np.float32) for _ in range(3))
    lora_g = (xa_g, lg.B, lg.s, _i32(lg.r)) if lg else (None, None, _f32(0), _i32(0))
    lora_u = (xa_u, lu.B, lu.s, _i32(lu.r)) if lu else (None, None, _f32(0), _i32(0))
    _launch(
        rt,
        f"moe_gate_up_{t}",
        (-(-F // GU_COLS), tiles),
        (x, order, offsets, _i32(K), _i32(E), _i32(C), _i32(F), wg, wu, *lora_g, *lora_u, g, u, h),
    )
    ha_d = _rows(rt, h, _SORTED, F, None, order, offsets, K, E, F, ld.A, 1, ld.r, P) if ld else None
    pair_out = xp.empty((P, C), dtype=np.float32)
    lora_d = (ha_d, ld.B, ld.s, _i32(ld.r)) if ld else (None, None, _f32(0), _i32(0))
    _launch(
        rt,
        f"moe_down_{t}",
        (-(-C // GEMM_BN), tiles),
        (h, order, offsets, _i32(E), _i32(C), _i32(F), wd, *lora_d, pair_out),
    )
    y = xp.empty((N, C), dtype=np.float32)
    _launch(rt, "moe_combine", (N, 1), (pair_out, weights, _i32(K), _i32(C), y))
    acts = PackedActs(g, u, h, xa_g, xa_u, ha_d)
    return y, ExpertsCache(x, routing, pair_out, acts, (lora_gate, lora_up, lora_down))


def experts_backward_on(
    rt: Runtime, dy: Any, cache: ExpertsCache, w_gate: Any, w_up: Any, w_down: Any, need_dw: bool = False
):
    """`experts_backward` on a runtime."""
    xp = rt.xp
    x, routing, pair_out, acts, loras = cache
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
        dx_pairs, dW, dlora = backward(
            rt, x, dy, weights, order, offsets, K, wg, wu, wd, lg, lu, ld, tuple(acts), need_dw
        )
        dx = xp.empty((N, C), dtype=np.float32)
        dweights = xp.empty((N, K), dtype=np.float32)
        _launch(rt, "moe_token_backward", (N, 1), (dx_pairs, pair_out, dy, _i32(K), _i32(C), dx, dweights))
        return dx, dweights, dW, dlora
    tiles = row_tiles(P, E, GEMM_BM)
    rows = (order, offsets, K, E)
    # forward was: y_n = sum_k w_nk * down_e(h), h = silu(g) * u; do = dy w (never stored: the kernels
    # read dy[token] * w as they load it)
    do_b = _rows(rt, dy, _TOKEN_WEIGHTED, C, weights, *rows, C, ld.B, 0, ld.r, P) if ld else None
    dg, du = xp.empty((P, F), dtype=np.float32), xp.empty((P, F), dtype=np.float32)
    lora_d = (do_b, ld.A, ld.s, _i32(ld.r)) if ld else (None, None, _f32(0), _i32(0))
    _launch(
        rt,
        f"moe_down_back_{t}",
        (-(-F // GEMM_BN), tiles),
        (
            dy,
            weights,
            order,
            offsets,
            _i32(K),
            _i32(E),
            _i32(C),
            _i32(F),
            wd,
            *lora_d,
            acts.g,
            acts.u,
            dg,
            du,
        ),
    )
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
    return dx, dweights, dW, dlora


# ----------------------------------------------------------------------------------------------
# the CuPy twins


def route_forward(logits: Any, K: int, renorm: bool):
    """CUDA twin of `route_forward_ref`: (Routing, RouteCache) of CuPy arrays (dtypes above); no host sync."""
    rt = runtime_for(logits, "route_forward")
    with logits.device:
        return route_forward_on(rt, logits, K, renorm)


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
):
    """CUDA twin of `experts_forward_ref`: (y (N, C) float32, ExpertsCache with PackedActs).

    Expert stacks are device arrays, float32 or bf16 bits (uint16); see the dtype contract above.
    """
    rt = runtime_for(x, "experts_forward")
    with x.device:
        return experts_forward_on(rt, x, routing, w_gate, w_up, w_down, lora_gate, lora_up, lora_down)


def experts_backward(
    dy: Any, cache: ExpertsCache, w_gate: Any, w_up: Any, w_down: Any, need_dw: bool = False
):
    """CUDA twin of `experts_backward_ref`: (dx, dweights, dW or None, dlora), float32 CuPy arrays."""
    rt = runtime_for(dy, "experts_backward")
    with dy.device:
        return experts_backward_on(rt, dy, cache, w_gate, w_up, w_down, need_dw)
