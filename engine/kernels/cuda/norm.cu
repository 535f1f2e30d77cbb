// RMSNorm forward and backward (rows in registers) and the column sums of the weight gradient.
// Host side and design: engine/kernels/norm.py.

#include <cuda_bf16.h>
// MAXU (set by norm.py, -D): units of V floats a thread holds in registers
#include "common.cuh"

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

// ---- the fused step's norms (engine/kernels/norm.py, "fused" section) -------------------------------
// rmsnorm_fwd_out: one block per row (threads over the row, scalar loads); y = x rstd w written as bf16
// bits (out16, row stride ld_out) or float32 (out32), rstd[row]; copy (when not null) gets x: the
// residual stream's next buffer, which the GEMM after adds into (beta = 1).
extern "C" __global__ void __launch_bounds__(1024)
rmsnorm_fwd_out(const float* __restrict__ x, const float* __restrict__ w, unsigned short* __restrict__ out16,
                float* __restrict__ out32, long long ld_out, float* __restrict__ rstd, float* __restrict__ copy,
                int C, float eps) {
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const float* xr = x + row * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, scratch);
    const float rs = 1.0f / sqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[row] = rs;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float v = xr[c];
        const float y = (v * rs) * w[c];
        if (out16) out16[row * ld_out + c] = f32_to_bf16_bits(y);
        else out32[row * ld_out + c] = y;
        if (copy) copy[row * C + c] = v;
    }
}

// rmsnorm_bwd_acc: forward was y = x rstd w (xn = x rstd recomputed from x and the saved rstd);
// dres (+)= rstd (dy w - xn mean(dy w xn)) in place (accumulate 0: =), and its bf16 bits into out16
// (row stride ld16) for the next GEMM. No weight gradient (frozen norms). One block per row.
extern "C" __global__ void __launch_bounds__(1024)
rmsnorm_bwd_acc(const float* __restrict__ dy, const float* __restrict__ x, const float* __restrict__ rstd,
                const float* __restrict__ w, float* __restrict__ dres, unsigned short* __restrict__ out16,
                long long ld16, int C, int accumulate) {
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const float* g = dy + row * C;
    const float* xr = x + row * C;
    const float rs = rstd[row];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += (g[c] * w[c]) * (xr[c] * rs);
    const float mean = block_sum(dot, scratch) / (float)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float d = rs * (g[c] * w[c] - (xr[c] * rs) * mean);
        const float v = accumulate ? dres[row * C + c] + d : d;
        dres[row * C + c] = v;
        if (out16) out16[row * ld16 + c] = f32_to_bf16_bits(v);
    }
}
