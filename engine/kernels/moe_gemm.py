"""MoE expert matmuls v2: grouped GEMMs and OUT_PROD_ID on the tensor cores, the expert LoRA folded in.

Two ops, each a NumPy reference (the specification) and its CUDA twin on a `Runtime`:

- `grouped_mm_ref(a, order, offsets, w, ...)`: for the sorted token-slot pairs of every expert at once
  (pairs of expert e are rows offsets[e]:offsets[e+1], pair order[p]), out[p] = A(p) W_e (+ AX[p]
  WX_e): A(p) row p of `a`, or the row of pair order[p]'s token (`gather`); W_e = w[e]^T (`w_nt`) or
  w[e]. The second K segment (AX, WX) is how the expert LoRA joins the base product: AX = s x A^T (the
  rank-r intermediates) beside the activations, WX = B beside the weights, one pass of the tensor
  cores over K + r. `grouped_mm_on` is its twin (engine/kernels/cuda/moe_gemm.cu `mg_rows_*`).
- `grouped_outer_ref(l, r, order, offsets, ...)`: OUT_PROD_ID, out[e] = scale * sum over expert e's
  rows of L(p)^T R(p), rows gathered and weighted as the MoE backward needs them; `grouped_outer_on`
  its twin (`mg_outer*`): bf16 operands, fp32 sums, each output element one thread's sum over the
  expert's rows in sorted order (same bits every run).

`experts_forward_tc` and `experts_backward_tc` run a whole MoE layer's expert part with these kernels
(bf16 expert stacks): the fused variants of the grouped GEMM (the gate and up biases and the gated
activation in the gate/up epilogue, the scatter to pair order with the down bias in down and dx, the
activation's backward in the down backward; the activations of engine/kernels/cuda/glu.cuh: SwiGLU and
gpt-oss's clamped SwiGLU), the LoRA folded into K everywhere, and the bias gradients as OUT_PROD_ID
against a column of ones. engine.kernels.moe_cuda calls them for bf16 stacks (`route`), and keeps the layer's
routing, cache, combine and token reductions; their results are checked by the same parity cases as
the v1 kernels (tests/kernels/moe_cases.py).

The kernel (engine/kernels/cuda/moe_gemm.cu): bf16 operands in global memory, a MG_STAGES-deep cp.async
pipeline into padded shared memory (no bank conflicts for ldmatrix), ldmatrix fragments, mma.sync
m16n8k16 with fp32 accumulation, 128 x 128 tiles over 8 warps (64 x 32 each), row tiles found on the
device from the expert offsets (no host synchronisation, launch shapes from array shapes only: the
whole layer can be captured in a CUDA graph with buffers sized by N*K). The activations that feed a
product are bf16 in memory (x and dy cast once per layer, h and [dg | du] written bf16 by the
epilogue that makes them), so cp.async copies them as they are.

Numerics (against the float64 reference on the kernels' own routing): products of bf16-rounded
operands summed in fp32, like the v1 bf16 path; the LoRA intermediates s x A^T etc. are rounded to
bf16 where they enter a product, and OUT_PROD_ID rounds its operands (times the routing weight where
one applies) to bf16.

Not here: routing, the combine and the per-token reductions (engine.kernels.moe_cuda).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

from .linear import to_bf16
from .nvrtc import KernelSource
from .runtime import Runtime

MG_THREADS = 256  # 8 warps per block
MG_BM = 128  # sorted pair rows per tile
MG_BN = 128  # output columns per tile (gate/up: 64 of each)
MG_SBN = 32  # skinny tiles: the rank-r LoRA intermediates
MG_BK = 32  # k per pipeline stage
MG_STAGES = 4  # cp.async stages in flight
MG_OBK = 32  # OUT_PROD_ID: rows per step
MG_LDA = MG_BK + 8

GEMM_KERNELS = ("mg_rows_nt", "mg_rows_nn", "mg_skinny_nt", "mg_gate_up", "mg_scatter_nt", "mg_scatter_nn",
                "mg_down_back")  # fmt: skip
KERNELS = (*GEMM_KERNELS, "mg_outer", "mg_outer_skinny", "mg_pack")

SOURCE = KernelSource.from_file(
    "moe_gemm.cu",
    kernels=KERNELS,
    defines={
        "MG_THREADS": MG_THREADS,
        "MG_BM": MG_BM,
        "MG_BN": MG_BN,
        "MG_SBN": MG_SBN,
        "MG_BK": MG_BK,
        "MG_STAGES": MG_STAGES,
        "MG_OBK": MG_OBK,
    },
)
SOURCES = (SOURCE,)

# Which implementation the bf16 MoE experts use (engine.kernels.moe_cuda): "tc" these kernels, "cublas" the
# cuBLAS route (engine.kernels.moe_cublas), "v1" the first kernels (moe.cu). The environment variable
# TUNE_MOE_GEMM picks one for benchmarks; DEFAULT_ROUTE otherwise.
ROUTES = ("tc", "cublas", "v1")
DEFAULT_ROUTE = "tc"


def route() -> str:
    """The MoE expert route for bf16 stacks: $TUNE_MOE_GEMM when set (ValueError for a name not in
    ROUTES), else DEFAULT_ROUTE."""
    name = os.environ.get("TUNE_MOE_GEMM", "") or DEFAULT_ROUTE
    if name not in ROUTES:
        raise ValueError(f"TUNE_MOE_GEMM={name!r}: use one of {', '.join(ROUTES)}")
    return name


def smem_bytes(bn: int, nt: bool) -> int:
    """Dynamic shared memory of a grouped GEMM launch: the pipeline's stages, or the fp32 tile after it."""
    b_stage = bn * MG_LDA if nt else MG_BK * (bn + 8)
    return max(MG_STAGES * (MG_BM * MG_LDA + b_stage) * 2, MG_BM * (bn + 4) * 4)


def row_tiles(P: int, E: int, bm: int = MG_BM) -> int:
    """Row tiles a grouped launch covers: at least sum_e ceil(n_e / bm) for any split of P pairs over E
    experts (each expert adds at most one partial tile), known without reading the offsets. The v1
    kernels (engine.kernels.moe_cuda) use it too, with their own tile height."""
    return -(-P // bm) + min(E, P)


# ----------------------------------------------------------------------------------------------
# NumPy references


def _values(a: np.ndarray) -> np.ndarray:
    """float64 values of an array: bf16 bits (uint16) widened, floats as they are."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def _rows_of(order: np.ndarray, offsets: np.ndarray, e: int, K: int, gather: bool) -> np.ndarray:
    lo, hi = int(offsets[e]), int(offsets[e + 1])
    return np.asarray(order[lo:hi]) // K if gather else np.arange(lo, hi)


def grouped_mm_ref(
    a: np.ndarray,
    order: np.ndarray,
    offsets: np.ndarray,
    w: np.ndarray,
    *,
    K: int = 1,
    gather: bool = False,
    w_nt: bool = True,
    a_ext: np.ndarray | None = None,
    w_ext: np.ndarray | None = None,
) -> np.ndarray:
    """out[p] = A(p) op(w[e]) + a_ext[p] op(w_ext[e]) for the rows p of each expert e (float32, (P, N)).

    a (rows, K0): A(p) = a[p], or a[order[p] // K] with `gather`; w (E, N, K0) with `w_nt` (op = .T),
    else (E, K0, N); a_ext (P, KX) and w_ext (E, N, KX) / (E, KX, N), both or neither. Arrays may be
    floats or bf16 bits (uint16); the sums run in float64.
    """
    P = len(order)
    N = w.shape[1] if w_nt else w.shape[2]
    out = np.zeros((P, N))
    A, W = _values(a), _values(w)
    AX = _values(a_ext) if a_ext is not None else None
    WX = _values(w_ext) if w_ext is not None else None
    for e in range(len(offsets) - 1):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if lo == hi:
            continue
        we = W[e].T if w_nt else W[e]
        out[lo:hi] = A[_rows_of(order, offsets, e, K, gather)] @ we
        if AX is not None:
            out[lo:hi] += AX[lo:hi] @ (WX[e].T if w_nt else WX[e])
    return out.astype(np.float32)


class OuterOperand(NamedTuple):
    """An OUT_PROD_ID operand: row p of the expert sum is `a[p]` (sorted rows) or `a[order[p] // K]`
    (`token`), times the routing weight rw[order[p]] when `weighted`."""

    a: Any  # (rows, I) float32 or bf16 bits (uint16), unit inner stride
    token: bool = False
    weighted: bool = False


def _outer_rows(op: OuterOperand, order, lo: int, hi: int, K: int, rw) -> np.ndarray:
    v = _values(op.a)
    idx = np.asarray(order[lo:hi]) // K if op.token else np.arange(lo, hi)
    rows = v[idx]
    if op.weighted:
        rows = rows * _values(rw)[np.asarray(order[lo:hi])][:, None]
    return rows


def grouped_outer_ref(
    left: OuterOperand,
    right: OuterOperand,
    order: np.ndarray,
    offsets: np.ndarray,
    *,
    K: int = 1,
    rw: np.ndarray | None = None,
    scale: float = 1.0,
    transpose: bool = False,
) -> np.ndarray:
    """OUT_PROD_ID: out[e] = scale * sum over expert e's rows p of L(p)^T R(p), (E, I, J) float32, or
    (E, J, I) with `transpose`. Experts without rows get zeros."""
    E = len(offsets) - 1
    I, J = left.a.shape[1], right.a.shape[1]
    out = np.zeros((E, I, J))
    for e in range(E):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if lo < hi:
            out[e] = _outer_rows(left, order, lo, hi, K, rw).T @ _outer_rows(right, order, lo, hi, K, rw)
    out *= scale
    return (out.transpose(0, 2, 1) if transpose else out).astype(np.float32).copy()


# ----------------------------------------------------------------------------------------------
# CUDA


def _i32(v: int) -> np.int32:
    return np.int32(v)


def _i64(v: int) -> np.int64:
    return np.int64(v)


def _flat_at(a: Any, offset: int) -> Any:
    """A 1-D contiguous view of `a`'s buffer starting `offset` elements in (a column block's pointer)."""
    return a.reshape(-1)[offset:]


def _check_bf16(what: str, a: Any) -> None:
    if a.dtype != np.uint16:
        raise TypeError(f"{what} must be bf16 bits (uint16), got {a.dtype}")


class Gemm(NamedTuple):
    """One grouped GEMM launch's operands (moe_gemm.cu `GemmArgs`): the base K segment and the optional
    LoRA segment; see the kernel's comment for the layouts."""

    a0: Any  # bf16 rows (flat view where a column block starts inside a wider buffer)
    lda0: int
    gather: bool
    K0: int
    w0a: Any  # (E, ...) bf16 stack
    w0_rows: int  # rows of one expert's matrix in w0a (its stride is w0_rows * ldw0)
    ldw0: int
    N: int  # output columns (gate/up: F)
    w0b: Any = None  # second stack: up (NT split) or the rows k >= split (NN)
    split: int = 0  # NT: 1 = gate|up tile; NN: first k of w0b (K0 when there is no w0b)
    ax: Any = None  # (P, KX) bf16: the LoRA segment's activations (s x A^T ...)
    KX: int = 0
    wx: Any = None  # (E, ...) bf16: the LoRA segment's factor (zero-padded to KX)
    wx_rows: int = 0
    ldwx: int = 0


def _gemm_args(g: Gemm, order: Any, offsets: Any, K: int, E: int) -> tuple:
    return (
        g.a0, _i64(g.lda0), _i32(int(g.gather)), order, offsets, _i32(K), _i32(E), _i32(g.K0),
        g.w0a, g.w0b, _i64(g.ldw0), _i64(g.w0_rows * g.ldw0), _i32(g.split),
        g.ax, _i64(g.KX), _i32(g.KX), g.wx, _i64(g.ldwx), _i64(g.wx_rows * g.ldwx), _i32(g.N),
    )  # fmt: skip


def _launch_gemm(rt: Runtime, kernel: str, g: Gemm, order, offsets, K: int, E: int, P: int, extra: tuple):
    bn = MG_SBN if kernel == "mg_skinny_nt" else MG_BN
    nt = kernel in ("mg_rows_nt", "mg_skinny_nt", "mg_gate_up", "mg_scatter_nt")
    cols = -(-g.N // (bn // 2)) if kernel == "mg_gate_up" else -(-g.N // bn)
    grid = (cols, row_tiles(P, E))
    if not (grid[0] and grid[1]):
        return
    if grid[1] > 65535:
        raise ValueError(
            f"{kernel}: {P} pairs make {grid[1]} row tiles, over one launch's 65535; split the batch"
        )
    args = _gemm_args(g, order, offsets, K, E) + extra
    rt.launch(SOURCE, kernel, grid, (MG_THREADS,), args, shared_mem=smem_bytes(bn, nt))


def grouped_mm_on(
    rt: Runtime,
    a: Any,
    order: Any,
    offsets: Any,
    w: Any,
    *,
    K: int = 1,
    gather: bool = False,
    w_nt: bool = True,
    a_ext: Any = None,
    w_ext: Any = None,
) -> Any:
    """`grouped_mm_ref` on a runtime: bf16 operands (uint16), order and offsets int32 on the device;
    float32 (P, N) out. C-contiguous arrays with rows of a multiple of 8 elements."""
    xp = rt.xp
    for what, arr in (("a", a), ("w", w), ("a_ext", a_ext), ("w_ext", w_ext)):
        if arr is not None:
            _check_bf16(what, arr)
    if (a_ext is None) != (w_ext is None):
        raise ValueError("a_ext and w_ext come together (the second K segment)")
    E = offsets.shape[0] - 1
    P = order.shape[0]
    K0 = a.shape[1]
    N = w.shape[1] if w_nt else w.shape[2]
    KX = 0 if a_ext is None else a_ext.shape[1]
    for what, n in (("K0", K0), ("N", N), ("KX", KX)):
        if n % 8:
            raise ValueError(f"grouped_mm_on needs {what} a multiple of 8 (16-byte rows); got {n}")
    if tuple(w.shape) != ((E, N, K0) if w_nt else (E, K0, N)):
        raise ValueError(f"w must be {(E, N, K0) if w_nt else (E, K0, N)}, got {tuple(w.shape)}")
    out = xp.empty((P, N), dtype=np.float32)
    g = Gemm(a, K0, gather, K0, w, w.shape[1], w.shape[2], N, split=0 if w_nt else K0,
             ax=a_ext, KX=KX, wx=w_ext, wx_rows=0 if w_ext is None else w_ext.shape[1],
             ldwx=0 if w_ext is None else w_ext.shape[2])  # fmt: skip
    kernel = "mg_rows_nt" if w_nt else "mg_rows_nn"
    _launch_gemm(rt, kernel, g, order, offsets, K, E, P, (out, _i64(N), None, _i64(0), np.float32(1.0)))
    return out


def grouped_outer_on(
    rt: Runtime,
    left: OuterOperand,
    right: OuterOperand,
    order: Any,
    offsets: Any,
    *,
    K: int = 1,
    rw: Any = None,
    scale: float = 1.0,
    transpose: bool = False,
) -> Any:
    """`grouped_outer_ref` on a runtime: C-contiguous operands, float32 or bf16 bits, I and J multiples
    of 8; (E, I, J) float32 out, (E, J, I) with `transpose`. (`outer_into` takes a column block of a
    wider buffer: a flat view where the block starts, and the row stride.)"""
    E = offsets.shape[0] - 1
    I, J = left.a.shape[1], right.a.shape[1]
    out = rt.xp.empty((E, J, I) if transpose else (E, I, J), dtype=np.float32)
    outer_into(rt, out, left.a, I, left.a.shape[1], left, right.a, J, right.a.shape[1], right, order, offsets,
               K, rw, scale, transpose)  # fmt: skip
    return out


def outer_into(rt, out, l_buf, I, ldl, lop: OuterOperand, r_buf, J, ldr, rop: OuterOperand, order, offsets,
               K, rw, scale, transpose) -> None:  # fmt: skip
    """mg_outer / mg_outer_skinny into `out`: l_buf and r_buf are the operands' buffers (flat views where a
    column block starts inside a row), I and J the columns used, ldl and ldr the row strides."""
    E = offsets.shape[0] - 1
    if I % 8 or J % 8 or ldl % 8 or ldr % 8:
        raise ValueError(f"OUT_PROD_ID operands need 8-element rows; got I={I} J={J} ld {ldl}, {ldr}")
    skinny = I <= 32
    bi = 32 if skinny else 128
    grid = (-(-I // bi) * -(-J // 128), E)
    args = (
        l_buf, _i64(ldl), _i32(int(lop.token)), _i32(int(l_buf.dtype == np.float32)), _i32(int(lop.weighted)),
        r_buf, _i64(ldr), _i32(int(rop.token)), _i32(int(r_buf.dtype == np.float32)), _i32(int(rop.weighted)),
        rw, order, offsets, _i32(K), _i32(I), _i32(J), np.float32(scale), _i32(int(transpose)), out,
    )  # fmt: skip
    rt.launch(SOURCE, "mg_outer_skinny" if skinny else "mg_outer", grid, (MG_THREADS,), args)


# ----------------------------------------------------------------------------------------------
# the MoE layer's expert part on these kernels


class LoraF(NamedTuple):
    """An expert LoRA as the kernels take it (engine.kernels.moe_cuda validates it): float32 factors."""

    A: Any  # (E, r, n_in)
    B: Any  # (E, n_out, r)
    s: float
    r: int


def _pad8(n: int) -> int:
    return -(-n // 8) * 8


def _pad_bk(n: int) -> int:
    return -(-n // MG_BK) * MG_BK


def _pack(rt: Runtime, src: Any, dst: Any, row_off: int, col_off: int, transpose: bool = False) -> None:
    """bf16(src[e]) (or its transpose) into dst[e] at (row_off, col_off)."""
    E = src.shape[0]
    rows, cols = (src.shape[2], src.shape[1]) if transpose else (src.shape[1], src.shape[2])
    grid = (-(-rows * cols // MG_THREADS), E)
    args = (src, _i32(rows), _i32(cols), _i32(int(transpose)), dst, _i32(dst.shape[1]), _i32(dst.shape[2]),
            _i32(row_off), _i32(col_off))  # fmt: skip
    rt.launch(SOURCE, "mg_pack", grid, (MG_THREADS,), args)


def _bf16_copy(rt: Runtime, src: Any, shape: tuple[int, ...], transpose: bool = False) -> Any:
    """A zero-padded bf16 copy of a LoRA factor stack (E, rows, cols), transposed first on request."""
    dst = rt.xp.zeros(shape, dtype=np.uint16)
    _pack(rt, src, dst, 0, 0, transpose)
    return dst


def _skinny(rt, a0, lda0, gather, K0, w, r, order, offsets, K, E, P, out_f, out_b, ld_b, scale) -> None:
    """The rank-r product of sorted (or gathered) rows with an expert's (r, K0) matrix: out_f = acc (P, r)
    float32 when given (the unscaled intermediate the cache keeps), out_b = bf16(scale * acc) into a
    column block of a (P, ld_b) bf16 buffer (the LoRA segment of the next product)."""
    g = Gemm(a0, lda0, gather, K0, w, w.shape[1], w.shape[2], r)
    extra = (out_f, _i64(r), out_b, _i64(ld_b), np.float32(scale))
    _launch_gemm(rt, "mg_skinny_nt", g, order, offsets, K, E, P, extra)


class Epilogue(NamedTuple):
    """What the expert epilogues add (engine.kernels.moe_cuda validates it): the biases b_gate, b_up (E, F)
    and b_down (E, C) float32 or None, and the gated activation as a cuda/glu.cuh ACT_* code."""

    b_gate: Any = None
    b_up: Any = None
    b_down: Any = None
    act: int = 0  # ACT_SILU


NO_EPILOGUE = Epilogue()  # SwiGLU, no biases


def experts_forward_tc(rt: Runtime, x, order, offsets, K: int, wg, wu, wd, lg: LoraF | None,
                       lu: LoraF | None, ld: LoraF | None, epi: Epilogue = NO_EPILOGUE):  # fmt: skip
    """The expert part of a MoE layer's forward on the tensor cores (bf16 stacks as uint16 bits):
    (g, u, h, xa_g, xa_u, ha_d, pair_out), the arrays of engine.kernels.moe_cuda's PackedActs (rows sorted;
    g and u with their biases) and the (P, C) expert outputs in pair order (down bias included). No
    host synchronisation."""
    xp = rt.xp
    N, C = x.shape
    E, F = wg.shape[0], wg.shape[1]
    P = order.shape[0]
    xb = to_bf16(rt, x)  # (N, C): the gathered rows come from here, token by token
    rows = (order, offsets, K, E, P)
    xa_g = xa_u = ha_d = None
    ext = wx = None
    RX = 0
    if lg or lu:
        rg, ru = (lg.r if lg else 0), (lu.r if lu else 0)
        RX = _pad_bk(rg + ru)
        ext = xp.zeros((P, RX), dtype=np.uint16)  # [s_g x A_g^T | s_u x A_u^T | 0]
        wx = xp.zeros((E, 2 * F, RX), dtype=np.uint16)  # rows f: [B_g[f] | 0], rows F + f: [0 | B_u[f]]
        for lo, col, row, name in ((lg, 0, 0, "g"), (lu, rg, F, "u")):
            if lo is None:
                continue
            a_b = to_bf16(rt, lo.A)
            xa = xp.empty((P, lo.r), dtype=np.float32)
            _skinny(rt, xb, C, True, C, a_b, lo.r, *rows, xa, _flat_at(ext, col), RX, lo.s)
            _pack(rt, lo.B, wx, row, col)
            if name == "g":
                xa_g = xa
            else:
                xa_u = xa
    g, u, h = (xp.empty((P, F), dtype=np.float32) for _ in range(3))
    hb = xp.empty((P, F), dtype=np.uint16)
    gemm = Gemm(xb, C, True, C, wg, F, C, F, w0b=wu, split=1, ax=ext, KX=RX, wx=wx, wx_rows=2 * F, ldwx=RX)
    _launch_gemm(rt, "mg_gate_up", gemm, *rows, (epi.b_gate, epi.b_up, _i32(epi.act), g, u, h, hb))
    ext = wx = None
    RX = 0
    if ld:
        RX = _pad_bk(ld.r)
        ext = xp.zeros((P, RX), dtype=np.uint16)  # [s_d h A_d^T | 0]
        wx = xp.zeros((E, C, RX), dtype=np.uint16)  # rows c: [B_d[c] | 0]
        a_b = to_bf16(rt, ld.A)
        ha_d = xp.empty((P, ld.r), dtype=np.float32)
        _skinny(rt, hb, F, False, F, a_b, ld.r, *rows, ha_d, ext, RX, ld.s)
        _pack(rt, ld.B, wx, 0, 0)
    pair_out = xp.empty((P, C), dtype=np.float32)
    gemm = Gemm(hb, F, False, F, wd, C, F, C, ax=ext, KX=RX, wx=wx, wx_rows=C, ldwx=RX)
    _launch_gemm(rt, "mg_scatter_nt", gemm, *rows, (epi.b_down, pair_out))
    return g, u, h, xa_g, xa_u, ha_d, pair_out


def experts_backward_tc(rt: Runtime, x, dy, rw, order, offsets, K: int, wg, wu, wd, lg: LoraF | None,
                        lu: LoraF | None, ld: LoraF | None, acts, need_dw: bool, act: int = 0,
                        db_keys: tuple[str, ...] = ()):  # fmt: skip
    """The expert part of a MoE layer's backward on the tensor cores: (dx_pairs (P, C) in pair order,
    dW {"gate", "up", "down"} or None, dlora {name: (dA, dB)}, db {name: (E, n_out)} of the names in
    `db_keys`). `acts` is the forward's (g, u, h, xa_g, xa_u, ha_d); rw the routing
    weights (N, K); act the forward's activation (a glu.cuh ACT_* code)."""
    xp = rt.xp
    N, C = x.shape
    E, F = wg.shape[0], wg.shape[1]
    P = order.shape[0]
    g, u, h, xa_g, xa_u, ha_d = acts
    rows = (order, offsets, K, E, P)
    dyb = to_bf16(rt, dy)  # (N, C)
    # forward was: pair_out[p] = h_p W_d^T + s_d (h_p A_d^T) B_d^T; y_n = sum_k w_nk pair_out[n, k]
    ext_do = wx = None
    RXd = 0
    if ld:
        RXd = _pad_bk(ld.r)
        ext_do = xp.zeros((P, RXd), dtype=np.uint16)  # [s_d dy B_d | 0] (unweighted: rw in the epilogue)
        bdt = _bf16_copy(rt, ld.B, (E, ld.r, C), transpose=True)
        _skinny(rt, dyb, C, True, C, bdt, ld.r, *rows, None, ext_do, RXd, ld.s)
        wx = xp.zeros((E, RXd, F), dtype=np.uint16)  # rows k < r: A_d[e]
        _pack(rt, ld.A, wx, 0, 0)
    dgu = xp.empty((P, 2 * F), dtype=np.uint16)  # [dg | du] bf16
    gemm = Gemm(dyb, C, True, C, wd, C, F, F, split=C, ax=ext_do, KX=RXd, wx=wx, wx_rows=RXd, ldwx=F)
    _launch_gemm(rt, "mg_down_back", gemm, *rows, (rw, g, u, _i32(act), dgu))
    # forward was: g = x W_g^T + s_g (x A_g^T) B_g^T, u likewise; dx = dg W_g + du W_u + LoRA terms
    ext_dx = wx = None
    RX = 0
    rg, ru = (lg.r if lg else 0), (lu.r if lu else 0)
    if lg or lu:
        RX = _pad_bk(rg + ru)
        ext_dx = xp.zeros((P, RX), dtype=np.uint16)  # [s_g dg B_g | s_u du B_u | 0]
        wx = xp.zeros((E, RX, C), dtype=np.uint16)  # rows [A_g[e]; A_u[e]; 0]
        for lo, col, off in ((lg, 0, 0), (lu, rg, F)):
            if lo is None:
                continue
            bt = _bf16_copy(rt, lo.B, (E, lo.r, F), transpose=True)
            _skinny(rt, _flat_at(dgu, off), 2 * F, False, F, bt, lo.r, *rows, None, _flat_at(ext_dx, col), RX,
                    lo.s)  # fmt: skip
            _pack(rt, lo.A, wx, col, 0)
    dx_pairs = xp.empty((P, C), dtype=np.float32)
    gemm = Gemm(dgu, 2 * F, False, 2 * F, wg, F, C, C, w0b=wu, split=F, ax=ext_dx, KX=RX, wx=wx, wx_rows=RX,
                ldwx=C)  # fmt: skip
    _launch_gemm(rt, "mg_scatter_nn", gemm, *rows, (dx_pairs,))
    dyb_blocks = {"down": (ext_do, 0), "gate": (ext_dx, 0), "up": (ext_dx, rg)}
    dW, dlora = out_prods(rt, x, dy, rw, order, offsets, K, lg, lu, ld, h, ha_d, xa_g, xa_u, dgu, dyb_blocks,
                          need_dw)  # fmt: skip
    return dx_pairs, dW, dlora, bias_grads(rt, dy, rw, order, offsets, K, dgu, db_keys)


def bias_grads(rt: Runtime, dy, rw, order, offsets, K: int, dgu, keys: tuple[str, ...]) -> dict:
    """The expert bias gradients of the names in `keys` ("gate", "up", "down"), each (E, n_out) float32:
    per-expert column sums of dg, du (the bf16 [dg | du] rows) and w dy (rounded to bf16 as staged), as
    OUT_PROD_ID against a column of ones (mg_outer_skinny, 8 ones wide for 16-byte rows; row 0 kept).
    forward was: g = ... + b_g[e], u = ... + b_u[e], pair_out = ... + b_d[e]."""
    if not keys:
        return {}
    xp = rt.xp
    E, F, C = offsets.shape[0] - 1, dgu.shape[1] // 2, dy.shape[1]
    P = order.shape[0]
    ones = xp.full((P, 8), 0x3F80, dtype=np.uint16)  # bf16 1.0
    srt = OuterOperand(None)
    sources = {"gate": (dgu, F, 2 * F, srt), "up": (_flat_at(dgu, F), F, 2 * F, srt),
               "down": (dy, C, C, OuterOperand(None, token=True, weighted=True))}  # fmt: skip
    db = {}
    for key in ("gate", "up", "down"):
        if key in keys:
            buf, n, ld, op = sources[key]
            out = xp.empty((E, 8, n), dtype=np.float32)
            outer_into(rt, out, ones, 8, 8, srt, buf, n, ld, op, order, offsets, K, rw, 1.0, False)
            db[key] = xp.ascontiguousarray(out[:, 0, :])
    return db


def out_prods(
    rt: Runtime,
    x,
    dy,
    rw,
    order,
    offsets,
    K: int,
    lg,
    lu,
    ld,
    h,
    ha_d,
    xa_g,
    xa_u,
    dgu,
    dyb_blocks,
    need_dw: bool,
):
    """OUT_PROD_ID of a MoE layer on the tensor cores: (dW or None, dlora). dgu is [dg | du] (P, 2F) bf16;
    dyb_blocks maps "gate", "up", "down" to (buffer, column) of the bf16 s (d B) rows of that weight's
    LoRA (s_d dy B_d unweighted for down, s_g dg B_g, s_u du B_u), as the dx and down-backward products
    used them."""
    xp = rt.xp
    C = x.shape[1]
    E, F = offsets.shape[0] - 1, h.shape[1]
    P = order.shape[0]
    tok, srt = OuterOperand(None, token=True), OuterOperand(None)
    tok_w, srt_w = OuterOperand(None, token=True, weighted=True), OuterOperand(None, weighted=True)

    def outer(shape, lb, I, ldl, lop, rb, J, ldr, rop, transpose=False):
        out = xp.empty(shape, dtype=np.float32)
        outer_into(rt, out, lb, I, ldl, lop, rb, J, ldr, rop, order, offsets, K, rw, 1.0, transpose)
        return out

    def block(name, r):  # that weight's s (d B) rows, 8 wide (zeros past r): 16-byte aligned rows
        buf, col = dyb_blocks[name]
        out = xp.zeros((P, _pad8(r)), dtype=np.uint16)
        out[:, :r] = buf[:, col : col + r]
        return out

    def scaled(a, s, r):  # s * a (P, r) float32, 8 wide
        out = xp.zeros((P, _pad8(r)), dtype=np.float32)
        out[:, :r] = a * np.float32(s)
        return out

    dW = None
    if need_dw:  # forward was: g = x W_g^T, u = x W_u^T, pair_out = h W_d^T (+ LoRA); dy weighted by w
        dW = {
            "gate": outer((E, F, C), dgu, F, 2 * F, srt, x, C, C, tok),
            "up": outer((E, F, C), _flat_at(dgu, F), F, 2 * F, srt, x, C, C, tok),
            "down": outer((E, C, F), dy, C, C, tok_w, h, F, F, srt),
        }
    dlora = {}
    if ld:  # dA_d = s (w dy B_d)^T h, dB_d = s (w dy)^T (h A_d^T)
        r8 = _pad8(ld.r)
        dA = outer((E, r8, F), block("down", ld.r), r8, r8, srt_w, h, F, F, srt)[:, : ld.r]
        dB = outer((E, C, r8), scaled(ha_d, ld.s, ld.r), r8, r8, srt_w, dy, C, C, tok, transpose=True)
        dlora["down"] = (xp.ascontiguousarray(dA), xp.ascontiguousarray(dB[:, :, : ld.r]))
    for name, lo, off, xa in (("gate", lg, 0, xa_g), ("up", lu, F, xa_u)):
        if lo is None:  # dA = s (d B)^T x, dB = s d^T (x A^T), d = dg or du
            continue
        r8 = _pad8(lo.r)
        dA = outer((E, r8, C), block(name, lo.r), r8, r8, srt, x, C, C, tok)[:, : lo.r]
        dB = outer((E, F, r8), scaled(xa, lo.s, lo.r), r8, r8, srt, _flat_at(dgu, off), F, 2 * F, srt,
                   transpose=True)  # fmt: skip
        dlora[name] = (xp.ascontiguousarray(dA), xp.ascontiguousarray(dB[:, :, : lo.r]))
    return dW, {k: dlora[k] for k in ("gate", "up", "down") if k in dlora}
