"""MoE expert GEMMs through cuBLAS: the grouped products as pointer-array batched GEMMs over row tiles.

The route the issue asked to time beside our own kernel (engine.kernels.moe_gemm): the library's GEMMs,
with gather and scatter as kernels of their own (engine/kernels/cuda/moe_cublas.cu).

Why this form. cuBLASLt's grouped GEMM with per-group sizes in device memory
(CUBLASLT_BATCH_MODE_GROUPED, `cublasLtGroupedMatrixLayoutCreate`) first appears in cuBLAS 13.2 (CUDA
13.2), and is marked experimental there; the device machine's CUDA 13.0 ships cuBLAS 13.0/13.1, whose
cublasLt.h has no grouped mode (read from the nvidia-cublas 13.0.0.19, 13.1.1.3 and 13.1.2.11 wheels'
headers; 13.2.0.9's is the first with it). A newer cuBLAS cannot be carried there either: its wheel is
about 420 MB; and its pointer-array kernels are sm_100 builds only (libcublasLt 13.2 and 13.10's
kernel names), so on Hopper the grouped mode would likely find no algorithm.
`cublasGemmGroupedBatchedEx` (cuBLAS >= 12.5) takes m, n, k and the group sizes in *host* arrays: every
layer would read the expert counts back to the host (a synchronisation), and a captured graph would
replay the counts of the capture. What cuBLAS 13.0 can do without either is a pointer-array batched GEMM
(`cublasGemmBatchedEx`), whose pointer arrays live on the device: split every expert's rows into tiles
of MC_TILE rows (its last one padded with zero rows), gather the tiles' rows into a padded buffer, and
multiply tile t by expert e(t)'s weights, for the fixed upper bound T = ceil(P / MC_TILE) + E of tiles
(tiles past the last multiply zero rows). Shapes depend on P and E only: no host read, capturable. The
price: padding rows and dead tiles (at P = 32768, E = 128, MC_TILE 64: at most 8192 extra rows, +25%),
the gather and scatter passes, and no fusion of the gated activation, the biases or the LoRA (the
activation and the biases are the gather/scatter kernels' epilogues, the LoRA term a second batched
product accumulated into the first, beta = 1).

`experts_forward_cublas` / `experts_backward_cublas` have the signatures and results of
engine.kernels.moe_gemm's `experts_forward_tc` / `experts_backward_tc` (engine.kernels.moe_cuda picks one by
`moe_gemm.route()`); they share its LoRA intermediates (the skinny tensor-core products) and its
OUT_PROD_ID kernels (weight, LoRA factor and bias gradients), which are not grouped GEMMs over tiles
(they sum over each expert's rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import moe_gemm as mg
from .linear import to_bf16
from .nvrtc import KernelSource
from .runtime import Runtime

MC_THREADS = 256
MC_TILE = 64  # rows per tile of the batched products

KERNELS = ("mc_plan", "mc_gather", "mc_glu", "mc_glu_back", "mc_scatter")
SOURCE = KernelSource.from_file(
    "moe_cublas.cu", kernels=KERNELS, defines={"MC_THREADS": MC_THREADS, "MC_TILE": MC_TILE}
)
SOURCES = (SOURCE,)

_i32 = mg._i32
_i64 = mg._i64


class TilePlan:
    """The padded tile layout of one layer's routing: T tiles of MC_TILE rows, tile t holding expert
    e(t)'s sorted rows p0(t) .. p0(t) + rows(t) (all int32 arrays on the device)."""

    def __init__(self, rt: Runtime, order: Any, offsets: Any, K: int) -> None:
        xp = rt.xp
        self.rt, self.order, self.K = rt, order, K
        E = offsets.shape[0] - 1
        P = order.shape[0]
        self.T = mg.row_tiles(P, E, MC_TILE) if P else 0
        self.e = xp.empty((self.T,), dtype=np.int32)
        self.p0 = xp.empty((self.T,), dtype=np.int32)
        self.rows = xp.empty((self.T,), dtype=np.int32)
        if self.T:
            rt.launch(
                SOURCE, "mc_plan", (self.T,), (MC_THREADS,), (offsets, _i32(E), self.e, self.p0, self.rows)
            )

    def gather(self, src: Any, D: int, token: bool, ld: int | None = None) -> Any:
        """(T, MC_TILE, D) bf16: each tile's rows of `src` (sorted rows, or the pairs' token rows)."""
        out = self.rt.xp.empty((self.T, MC_TILE, D), dtype=np.uint16)
        args = (src, _i64(D if ld is None else ld), _i32(int(token)), _i32(int(src.dtype == np.float32)),
                self.order, _i32(self.K), self.p0, self.rows, _i32(D), out)  # fmt: skip
        self._launch("mc_gather", args)
        return out

    def scatter(self, c: Any, out: Any, bias: Any = None) -> None:
        """out[order[p]] = c's row of sorted pair p (+ bias[e] (E, D) of its expert when given)."""
        self._launch("mc_scatter", (c, self.order, self.e, self.p0, self.rows, _i32(out.shape[1]), bias, out))

    def _launch(self, kernel: str, args: tuple) -> None:
        if self.T:
            self.rt.launch(SOURCE, kernel, (self.T * MC_TILE,), (MC_THREADS,), args)


def _product(rt, plan: TilePlan, a_pad, w, n: int, trans_b: bool, beta: float = 0.0, out=None):
    """out (T, MC_TILE, n) float32 (+)= a_pad[t] @ op(w[e(t)])."""
    if out is None:
        out = rt.xp.empty((plan.T, MC_TILE, n), dtype=np.float32)
    if plan.T:
        rt.gemm_indexed(a_pad, w, plan.e, out, trans_b=trans_b, beta=beta)
    return out


def _lora_segment(rt, plan, ext, RX, wx, n, trans_b, c) -> None:
    """c += the LoRA segment's product: ext's rows (sorted, bf16, RX wide) gathered into tiles, times wx."""
    if ext is not None:
        _product(rt, plan, plan.gather(ext, RX, False), wx, n, trans_b, beta=1.0, out=c)


def experts_forward_cublas(rt: Runtime, x, order, offsets, K: int, wg, wu, wd, lg, lu, ld,
                           epi: mg.Epilogue = mg.NO_EPILOGUE):  # fmt: skip
    """`moe_gemm.experts_forward_tc` with the grouped products on cuBLAS (see the module docstring)."""
    xp = rt.xp
    N, C = x.shape
    E, F = wg.shape[0], wg.shape[1]
    P = order.shape[0]
    plan = TilePlan(rt, order, offsets, K)
    xb = to_bf16(rt, x)
    x_pad = plan.gather(xb, C, True)
    rows = (order, offsets, K, E, P)
    lora = {}
    for name, lo in (("g", lg), ("u", lu)):
        if lo is None:
            continue
        RX = mg._pad_bk(lo.r)
        ext = xp.zeros((P, RX), dtype=np.uint16)
        xa = xp.empty((P, lo.r), dtype=np.float32)
        mg._skinny(rt, xb, C, True, C, to_bf16(rt, lo.A), lo.r, *rows, xa, ext, RX, lo.s)
        lora[name] = (xa, ext, RX, mg._bf16_copy(rt, lo.B, (E, F, RX)))
    cg = _product(rt, plan, x_pad, wg, F, True)
    cu = _product(rt, plan, x_pad, wu, F, True)
    for name, c in (("g", cg), ("u", cu)):
        if name in lora:
            _, ext, RX, wx = lora[name]
            _lora_segment(rt, plan, ext, RX, wx, F, True, c)
    g, u, h = (xp.empty((P, F), dtype=np.float32) for _ in range(3))
    hb_pad = xp.empty((plan.T, MC_TILE, F), dtype=np.uint16)
    glu = (cg, cu, plan.e, plan.p0, plan.rows, _i32(F), epi.b_gate, epi.b_up, _i32(epi.act), g, u, h, hb_pad)
    plan._launch("mc_glu", glu)
    del cg, cu
    cd = _product(rt, plan, hb_pad, wd, C, True)
    ha_d = None
    if ld:
        RX = mg._pad_bk(ld.r)
        ext = xp.zeros((P, RX), dtype=np.uint16)
        ha_d = xp.empty((P, ld.r), dtype=np.float32)
        hb = to_bf16(rt, h)
        mg._skinny(rt, hb, F, False, F, to_bf16(rt, ld.A), ld.r, *rows, ha_d, ext, RX, ld.s)
        _lora_segment(rt, plan, ext, RX, mg._bf16_copy(rt, ld.B, (E, C, RX)), C, True, cd)
    pair_out = xp.empty((P, C), dtype=np.float32)
    plan.scatter(cd.reshape(-1, C), pair_out, epi.b_down)
    xa_g = lora["g"][0] if "g" in lora else None
    xa_u = lora["u"][0] if "u" in lora else None
    return g, u, h, xa_g, xa_u, ha_d, pair_out


def experts_backward_cublas(rt: Runtime, x, dy, rw, order, offsets, K: int, wg, wu, wd, lg, lu, ld, acts,
                            need_dw: bool, act: int = 0, db_keys: tuple[str, ...] = ()):  # fmt: skip
    """`moe_gemm.experts_backward_tc` with the grouped products on cuBLAS; OUT_PROD_ID (weight, LoRA
    factor and bias gradients) on the shared tensor-core kernels."""
    xp = rt.xp
    N, C = x.shape
    E, F = wg.shape[0], wg.shape[1]
    P = order.shape[0]
    g, u, h, xa_g, xa_u, ha_d = acts
    plan = TilePlan(rt, order, offsets, K)
    rows = (order, offsets, K, E, P)
    dyb = to_bf16(rt, dy)
    dy_pad = plan.gather(dyb, C, True)
    # forward was: pair_out = h W_d^T + s_d (h A_d^T) B_d^T; dh = w (dy W_d + s_d (dy B_d) A_d)
    cdh = _product(rt, plan, dy_pad, wd, F, False)
    blocks = {}
    if ld:
        RX = mg._pad_bk(ld.r)
        ext = xp.zeros((P, RX), dtype=np.uint16)
        bdt = mg._bf16_copy(rt, ld.B, (E, ld.r, C), transpose=True)
        mg._skinny(rt, dyb, C, True, C, bdt, ld.r, *rows, None, ext, RX, ld.s)
        blocks["down"] = (ext, 0)
        _lora_segment(rt, plan, ext, RX, mg._bf16_copy(rt, ld.A, (E, RX, F)), F, False, cdh)
    dgu = xp.empty((P, 2 * F), dtype=np.uint16)
    dgu_pad = xp.empty((plan.T, MC_TILE, 2 * F), dtype=np.uint16)
    plan._launch("mc_glu_back", (cdh, rw, order, plan.p0, plan.rows, _i32(F), g, u, _i32(act), dgu, dgu_pad))
    del cdh
    # dx = dg W_g + du W_u + s_g (dg B_g) A_g + s_u (du B_u) A_u
    cdx = _product(rt, plan, dgu_pad[:, :, :F], wg, C, False)
    _product(rt, plan, dgu_pad[:, :, F:], wu, C, False, beta=1.0, out=cdx)
    for name, lo, off in (("gate", lg, 0), ("up", lu, F)):
        if lo is None:
            continue
        RX = mg._pad_bk(lo.r)
        ext = xp.zeros((P, RX), dtype=np.uint16)
        bt = mg._bf16_copy(rt, lo.B, (E, lo.r, F), transpose=True)
        mg._skinny(rt, mg._flat_at(dgu, off), 2 * F, False, F, bt, lo.r, *rows, None, ext, RX, lo.s)
        blocks[name] = (ext, 0)
        _lora_segment(rt, plan, ext, RX, mg._bf16_copy(rt, lo.A, (E, RX, C)), C, False, cdx)
    dx_pairs = xp.empty((P, C), dtype=np.float32)
    plan.scatter(cdx.reshape(-1, C), dx_pairs)
    dW, dlora = mg.out_prods(rt, x, dy, rw, order, offsets, K, lg, lu, ld, h, ha_d, xa_g, xa_u, dgu, blocks,
                             need_dw)  # fmt: skip
    return dx_pairs, dW, dlora, mg.bias_grads(rt, dy, rw, order, offsets, K, dgu, db_keys)
