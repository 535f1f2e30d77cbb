"""RMSNorm over the last axis: y = x / sqrt(mean(x^2) + eps) * w.

`rmsnorm_forward_ref` / `rmsnorm_backward_ref` are the NumPy reference (the specification; the CPU
engine's hot path). `rmsnorm_forward` / `rmsnorm_backward` are their CUDA twins (fused kernels, one
block per row, fp32 math), with the same signatures and cache; `*_on(rt, ...)` is a twin's host
code on a given `engine.kernels.runtime.Runtime`. Not here: q/k norms' wiring (engine.model.layers).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .nvrtc import KernelSource
from .runtime import Runtime, aligned16, f32_input, runtime_for


class NormCache(NamedTuple):
    xn: np.ndarray  # (..., C) normalised input
    rstd: np.ndarray  # (..., 1) 1 / rms


def rmsnorm_forward_ref(x: np.ndarray, w: np.ndarray | None, eps: float):
    """y = x / sqrt(mean(x^2) + eps) * w, over the last axis."""
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xn = x * rstd
    y = xn * w if w is not None else xn
    return y, NormCache(xn, rstd)


def rmsnorm_backward_ref(dy: np.ndarray, cache: NormCache, w: np.ndarray | None):
    """forward was: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).  Returns (dx, dw or None)."""
    xn, rstd = cache
    dxn = dy * w if w is not None else dy
    dw = (dy * xn).reshape(-1, w.shape[-1]).sum(axis=0) if w is not None else None
    dx = rstd * (dxn - xn * np.mean(dxn * xn, axis=-1, keepdims=True))
    return dx, dw


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract: x float32 (..., C) on the device, w float32 (C,) or None; fp32 math throughout. The
# cache is the reference's: NormCache(xn (..., C), rstd (..., 1)), CuPy arrays.
#
# rmsnorm_fwd_v{4,1}: one block per row (grid n_rows), threads = a multiple of 32 such that each
#   thread holds at most MAXU = 8 units of V floats (V = 4: float4, 16-byte loads and stores; V = 1 when
#   C % 4 or an address is not 16-byte aligned). The row stays in registers between the sum of
#   squares and the scaling: x is read once. Floor: 12 bytes per element (read x, write y and xn):
#   a 16384 x 4096 activation moves 805 MB, ~0.27 ms at 3 TB/s; FLOPs are negligible (4 per element).
#   rstd = 1 / sqrtf(sum / C + eps) with IEEE sqrt and division, as NumPy's float32 mean and sqrt.
# rmsnorm_bwd_v{4,1}: a grid of at most 512 blocks, each a run of consecutive rows (one row at a
#   time, the block as in the forward): dx = rstd * (dy*w - xn * mean(dy*w*xn)); each thread keeps
#   its columns' partial dw = sum dy*xn in registers over the block's rows and writes one row of
#   partials (n_blocks, C) (dy, xn and w are read twice per row, the second time from L1, so that
#   only the partials occupy registers: no spills at 1024 threads); rmsnorm_colsum adds those up
#   column by column in a fixed order. No
#   atomics: the result is the same on every run. Floor: 12 bytes per element (read dy, xn, write dx)
#   plus 4 * n_blocks * C for the partials.
# rmsnorm_colsum: one thread per column, grid ceil(C / 256); coalesced over the columns.

MAXU = 8  # units of V floats a thread holds in registers


def norm_threads(units: int) -> int:
    """Threads per row: a multiple of 32, at least ceil(units / MAXU), at most 1024."""
    per_thread = -(-units // MAXU)
    return min(1024, max(32, -(-per_thread // 32) * 32))


SOURCE = KernelSource.from_file(
    "norm.cu",
    kernels=(
        "rmsnorm_fwd_v4",
        "rmsnorm_fwd_v1",
        "rmsnorm_bwd_v4",
        "rmsnorm_bwd_v1",
        "rmsnorm_colsum",
        "rmsnorm_fwd_out",
        "rmsnorm_bwd_acc",
    ),  # fmt: skip
    defines={"MAXU": MAXU},
)
SOURCES = (SOURCE,)

BWD_MAX_BLOCKS = 512  # blocks of the backward (rows split among them); also the rows of dw partials


def _width(rt: Runtime, C: int, *arrays: Any) -> int:
    """4 when rows are whole float4s and every array is 16-byte aligned, else 1 (ValueError when even
    that cannot hold a row in registers)."""
    V = 4 if C % 4 == 0 and aligned16(rt, *arrays) else 1
    if C // V > 1024 * MAXU:
        raise ValueError(
            f"rows of {C} values are too long for the RMSNorm kernels "
            f"(at most {1024 * MAXU * 4} when C % 4 == 0, {1024 * MAXU} otherwise)"
        )
    return V


def rmsnorm_forward_on(rt: Runtime, x: Any, w: Any | None, eps: float) -> tuple[Any, NormCache]:
    """`rmsnorm_forward` on a runtime (see `engine.kernels.runtime.Runtime`)."""
    xp = rt.xp
    x = f32_input(rt, x, "rmsnorm input x")
    C = x.shape[-1]
    w = None if w is None else f32_input(rt, w, "rmsnorm weight w")
    if w is not None and tuple(w.shape) != (C,):
        raise ValueError(f"rmsnorm weight has shape {tuple(w.shape)}, rows have {C} values")
    y = xp.empty(x.shape, dtype=xp.float32)
    xn = xp.empty(x.shape, dtype=xp.float32)
    rstd = xp.empty((*x.shape[:-1], 1), dtype=xp.float32)
    n = x.size // max(C, 1)
    if n and C:
        V = _width(rt, C, x, w, y, xn)
        args = (x, x if w is None else w, y, xn, rstd, np.int32(C), np.float32(eps), np.int32(w is not None))
        rt.launch(SOURCE, f"rmsnorm_fwd_v{V}", (n,), (norm_threads(C // V),), args)
    return y, NormCache(xn, rstd)


def rmsnorm_backward_on(rt: Runtime, dy: Any, cache: NormCache, w: Any | None) -> tuple[Any, Any | None]:
    """`rmsnorm_backward` on a runtime."""
    xp = rt.xp
    xn, rstd = cache
    dy = f32_input(rt, dy, "rmsnorm gradient dy")
    C = dy.shape[-1]
    w = None if w is None else f32_input(rt, w, "rmsnorm weight w")
    dx = xp.empty(dy.shape, dtype=xp.float32)
    n = dy.size // max(C, 1)
    dw = None if w is None else xp.empty((C,), dtype=xp.float32)
    if n == 0 or C == 0:
        if dw is not None:
            dw.fill(0)
        return dx, dw
    V = _width(rt, C, dy, xn, w, dx)
    rows_per_block = -(-n // BWD_MAX_BLOCKS)
    n_blocks = -(-n // rows_per_block)
    part = xp.empty((n_blocks, C), dtype=xp.float32) if w is not None else dx
    args = (dy, xn, rstd, dy if w is None else w, dx, part, np.int32(n), np.int32(C))
    args += (np.int32(rows_per_block), np.int32(w is not None))
    rt.launch(SOURCE, f"rmsnorm_bwd_v{V}", (n_blocks,), (norm_threads(C // V),), args)
    if dw is not None:
        rt.launch(
            SOURCE, "rmsnorm_colsum", (-(-C // 256),), (256,), (part, dw, np.int32(n_blocks), np.int32(C))
        )
    return dx, dw


def rmsnorm_forward(x: Any, w: Any | None, eps: float) -> tuple[Any, NormCache]:
    """CUDA twin of `rmsnorm_forward_ref`: y = x / sqrt(mean(x^2) + eps) * w over the last axis.

    x float32 (..., C) and w float32 (C,) or None, CuPy arrays; returns (y, NormCache(xn, rstd)) on
    the device, as the reference.
    """
    return rmsnorm_forward_on(runtime_for(x, "rmsnorm_forward"), x, w, eps)


def rmsnorm_backward(dy: Any, cache: NormCache, w: Any | None) -> tuple[Any, Any | None]:
    """CUDA twin of `rmsnorm_backward_ref`: (dx, dw or None) from dy and the forward's cache."""
    return rmsnorm_backward_on(runtime_for(dy, "rmsnorm_backward"), dy, cache, w)


# ----------------------------------------------------------------------------------------------
# The fused training step's norms (engine.train.dense_step): the forward writes its output where
# the next GEMM reads it (bf16 bits, or float32 for the output head) and copies the residual stream
# into the buffer the GEMM after it adds into; the backward recomputes xn from x and rstd, adds dx
# into the residual gradient in place and writes its bf16 bits for the next GEMM. Frozen weights:
# no dw. One block per row (norm_threads(C) threads, scalar loads). Floors: forward 10 bytes per
# value (read x, write y bf16 and the copy), backward 14 (read dy, x, dres; write dres, bf16).


def rmsnorm_fwd_out_ref(x: np.ndarray, w: np.ndarray, eps: float):
    """(y, rstd): y = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps) per row (N,); x (N, C)."""
    y, cache = rmsnorm_forward_ref(x, w, eps)
    return y, cache.rstd[..., 0]


def rmsnorm_bwd_acc_ref(dy: np.ndarray, x: np.ndarray, rstd: np.ndarray, w: np.ndarray, dres: np.ndarray):
    """forward was: y = x rstd w.  Returns dres + dx (the residual stream's gradient with this
    norm's input gradient added)."""
    xn = x * rstd[:, None]
    dx, _ = rmsnorm_backward_ref(dy, NormCache(xn, rstd[:, None]), w)
    return dres + dx


def rmsnorm_fwd_out_on(
    rt: Runtime, x: Any, w: Any, eps: float, out: Any, rstd: Any, copy: Any = None
) -> None:
    """`rmsnorm_fwd_out_ref` into `out` (N, C) bf16 bits (uint16, rows may be strided) or float32,
    `rstd` (N,) float32; with `copy` (N, C) float32, x is copied there too."""
    N, C = x.shape
    bf16 = out.dtype.name == "uint16"
    ld = np.int64(out.strides[0] // out.itemsize)
    args = (x, w, out if bf16 else None, None if bf16 else out, ld, rstd, copy, np.int32(C), np.float32(eps))
    rt.launch(SOURCE, "rmsnorm_fwd_out", (N,), (norm_threads(C),), args)


def rmsnorm_bwd_acc_on(
    rt: Runtime, dy: Any, x: Any, rstd: Any, w: Any, dres: Any, out16: Any = None, accumulate: bool = True
) -> None:
    """`rmsnorm_bwd_acc_ref` in place of `dres` (N, C) float32 (accumulate False: dres = dx), and
    its bf16 bits into `out16` (N, >= C, rows may be strided) when given."""
    N, C = dy.shape
    ld = np.int64(out16.strides[0] // 2 if out16 is not None else 0)
    args = (dy, x, rstd, w, dres, out16, ld, np.int32(C), np.int32(accumulate))
    rt.launch(SOURCE, "rmsnorm_bwd_acc", (N,), (norm_threads(C),), args)
