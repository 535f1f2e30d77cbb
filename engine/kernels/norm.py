"""RMSNorm over the last axis: y = x / sqrt(mean(x^2) + eps) * w.

`rmsnorm_forward_ref` / `rmsnorm_backward_ref` are the NumPy reference (the specification; the CPU
engine's hot path). `rmsnorm_forward` / `rmsnorm_backward` are their CUDA twins (fused kernels, one
block per row, fp32 math), with the same signatures and cache; `*_on(rt, ...)` is a twin's host
code on a given `engine.kernels.runtime.Runtime`. Not here: q/k norms' wiring (engine.model.layers).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .nvrtc import DEVICE_HELPERS, KernelSource
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


_CUDA_SOURCE = (
    r"""
#include <cuda_bf16.h>
#define MAXU @MAXU@
"""
    + DEVICE_HELPERS
    + r"""
template <int V> struct Row;  // V consecutive floats
template <> struct Row<4> {
    static __device__ __forceinline__ void load(const float* p, float (&r)[4]) {
        const float4 t = *(const float4*)p;
        r[0] = t.x; r[1] = t.y; r[2] = t.z; r[3] = t.w;
    }
    static __device__ __forceinline__ void store(float* p, const float (&r)[4]) {
        *(float4*)p = make_float4(r[0], r[1], r[2], r[3]);
    }
};
template <> struct Row<1> {
    static __device__ __forceinline__ void load(const float* p, float (&r)[1]) { r[0] = p[0]; }
    static __device__ __forceinline__ void store(float* p, const float (&r)[1]) { p[0] = r[0]; }
};

template <int V>
__device__ __forceinline__ void rmsnorm_fwd(const float* __restrict__ x, const float* __restrict__ w,
                                            float* __restrict__ y, float* __restrict__ xn,
                                            float* __restrict__ rstd, int C, float eps, int has_w) {
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const int units = C / V;
    const float* xr = x + row * C;
    float r[MAXU][V];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < MAXU; ++k) {
        const int u = threadIdx.x + k * blockDim.x;
        if (u < units) {
            Row<V>::load(xr + u * V, r[k]);
#pragma unroll
            for (int i = 0; i < V; ++i) ss += r[k][i] * r[k][i];
        }
    }
    ss = block_sum(ss, scratch);
    const float rs = 1.0f / sqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[row] = rs;
#pragma unroll
    for (int k = 0; k < MAXU; ++k) {
        const int u = threadIdx.x + k * blockDim.x;
        if (u < units) {
            float a[V], b[V], ww[V];
            if (has_w) Row<V>::load(w + u * V, ww);
#pragma unroll
            for (int i = 0; i < V; ++i) {
                a[i] = r[k][i] * rs;
                b[i] = has_w ? a[i] * ww[i] : a[i];
            }
            Row<V>::store(xn + row * C + u * V, a);
            Row<V>::store(y + row * C + u * V, b);
        }
    }
}

template <int V>
__device__ __forceinline__ void rmsnorm_bwd(const float* __restrict__ dy, const float* __restrict__ xn,
                                            const float* __restrict__ rstd, const float* __restrict__ w,
                                            float* __restrict__ dx, float* __restrict__ dw_part,
                                            int n_rows, int C, int rows_per_block, int has_w) {
    // only the dw partials live in registers; dy, xn and w are read again after the reduction
    // (from L1: a row of dy and xn is 2 C * 4 bytes), which keeps the kernel free of spills
    __shared__ float scratch[32];
    const int units = C / V;
    float acc[MAXU][V];
#pragma unroll
    for (int k = 0; k < MAXU; ++k) {
#pragma unroll
        for (int i = 0; i < V; ++i) acc[k][i] = 0.0f;
    }
    const long long r0 = (long long)blockIdx.x * rows_per_block;
    const long long r1 = min(r0 + rows_per_block, (long long)n_rows);
    for (long long row = r0; row < r1; ++row) {
        const float* g_row = dy + row * C;
        const float* a_row = xn + row * C;
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < MAXU; ++k) {
            const int u = threadIdx.x + k * blockDim.x;
            if (u < units) {
                float g[V], a[V], ww[V];
                Row<V>::load(g_row + u * V, g);
                Row<V>::load(a_row + u * V, a);
                if (has_w) Row<V>::load(w + u * V, ww);
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    dot += (has_w ? g[i] * ww[i] : g[i]) * a[i];
                    acc[k][i] += g[i] * a[i];
                }
            }
        }
        const float mean = block_sum(dot, scratch) / (float)C;
        const float rs = rstd[row];
#pragma unroll
        for (int k = 0; k < MAXU; ++k) {
            const int u = threadIdx.x + k * blockDim.x;
            if (u < units) {
                float g[V], a[V], ww[V], o[V];
                Row<V>::load(g_row + u * V, g);
                Row<V>::load(a_row + u * V, a);
                if (has_w) Row<V>::load(w + u * V, ww);
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = rs * ((has_w ? g[i] * ww[i] : g[i]) - a[i] * mean);
                Row<V>::store(dx + row * C + u * V, o);
            }
        }
    }
    if (has_w) {
#pragma unroll
        for (int k = 0; k < MAXU; ++k) {
            const int u = threadIdx.x + k * blockDim.x;
            if (u < units) Row<V>::store(dw_part + (long long)blockIdx.x * C + u * V, acc[k]);
        }
    }
}

#define NORM_KERNELS(V)                                                                                  \
    extern "C" __global__ void __launch_bounds__(1024) rmsnorm_fwd_v##V(                                \
        const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,                \
        float* __restrict__ xn, float* __restrict__ rstd, int C, float eps, int has_w) {                \
        rmsnorm_fwd<V>(x, w, y, xn, rstd, C, eps, has_w);                                               \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(1024) rmsnorm_bwd_v##V(                                \
        const float* __restrict__ dy, const float* __restrict__ xn, const float* __restrict__ rstd,     \
        const float* __restrict__ w, float* __restrict__ dx, float* __restrict__ dw_part, int n_rows,   \
        int C, int rows_per_block, int has_w) {                                                          \
        rmsnorm_bwd<V>(dy, xn, rstd, w, dx, dw_part, n_rows, C, rows_per_block, has_w);                 \
    }

NORM_KERNELS(4)
NORM_KERNELS(1)

extern "C" __global__ void __launch_bounds__(256)
rmsnorm_colsum(const float* __restrict__ part, float* __restrict__ out, int n_parts, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int p = 0; p < n_parts; ++p) s += part[(long long)p * C + c];
    out[c] = s;
}
"""
).replace("@MAXU@", str(MAXU))

SOURCE = KernelSource(
    name="norm",
    code=_CUDA_SOURCE,
    kernels=("rmsnorm_fwd_v4", "rmsnorm_fwd_v1", "rmsnorm_bwd_v4", "rmsnorm_bwd_v1", "rmsnorm_colsum"),
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
