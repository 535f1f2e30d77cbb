// The gated activation h = act(g, u) forward and backward, elementwise (SwiGLU, GEGLU, clamped SwiGLU).
// Host side and design: engine/kernels/glu.py.

#include "common.cuh"
#include "glu.cuh"

extern "C" __global__ void __launch_bounds__(256)
glu_fwd(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ h, long long n,
        int vec, int act, const float* __restrict__ table) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n4 = vec ? n / 4 : 0;
    for (long long i = first; i < n4; i += stride) {
        const float4 a = ((const float4*)g)[i], b = ((const float4*)u)[i];
        ((float4*)h)[i] = make_float4(glu_f(act, a.x, b.x, table), glu_f(act, a.y, b.y, table),
                                      glu_f(act, a.z, b.z, table), glu_f(act, a.w, b.w, table));
    }
    for (long long i = 4 * n4 + first; i < n; i += stride) h[i] = glu_f(act, g[i], u[i], table);
}

extern "C" __global__ void __launch_bounds__(256)
glu_bwd(const float* __restrict__ dh, const float* __restrict__ g, const float* __restrict__ u,
        float* __restrict__ dg, float* __restrict__ du, long long n, int vec, int act,
        const float* __restrict__ table) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n4 = vec ? n / 4 : 0;
    for (long long i = first; i < n4; i += stride) {
        const float4 d = ((const float4*)dh)[i], a = ((const float4*)g)[i], b = ((const float4*)u)[i];
        const float2 x = glu_back_f(act, d.x, a.x, b.x, table), y = glu_back_f(act, d.y, a.y, b.y, table);
        const float2 z = glu_back_f(act, d.z, a.z, b.z, table), w = glu_back_f(act, d.w, a.w, b.w, table);
        ((float4*)dg)[i] = make_float4(x.x, y.x, z.x, w.x);
        ((float4*)du)[i] = make_float4(x.y, y.y, z.y, w.y);
    }
    for (long long i = 4 * n4 + first; i < n; i += stride) {
        const float2 r = glu_back_f(act, dh[i], g[i], u[i], table);
        dg[i] = r.x;
        du[i] = r.y;
    }
}

// ---- the fused dense step's activation on bf16 bits: g, u are columns [0, F) and [F, 2F) of the
// gate/up projection's output gu (row stride ld_in); h = act(g, u) leaves as bf16 bits (N, F). The
// backward reads dh float32 (N, F) and writes dg, du as bf16 bits into columns [0, F) and [F, 2F) of
// a buffer of row stride ld_out. fp32 math in between.
extern "C" __global__ void __launch_bounds__(256)
glu_fwd_bf16(const unsigned short* __restrict__ gu, long long ld_in, unsigned short* __restrict__ h,
             long long N, int F, int act, const float* __restrict__ table) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < N * F; i += stride) {
        const long long n = i / F, f = i % F;
        const float g = bf16_bits_to_f32(gu[n * ld_in + f]), u = bf16_bits_to_f32(gu[n * ld_in + F + f]);
        h[i] = f32_to_bf16_bits(glu_f(act, g, u, table));
    }
}

extern "C" __global__ void __launch_bounds__(256)
glu_bwd_bf16(const float* __restrict__ dh, const unsigned short* __restrict__ gu, long long ld_in,
             unsigned short* __restrict__ dgu, long long ld_out, long long N, int F, int act,
             const float* __restrict__ table) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < N * F; i += stride) {
        const long long n = i / F, f = i % F;
        const float g = bf16_bits_to_f32(gu[n * ld_in + f]), u = bf16_bits_to_f32(gu[n * ld_in + F + f]);
        const float2 r = glu_back_f(act, dh[i], g, u, table);
        dgu[n * ld_out + f] = f32_to_bf16_bits(r.x);
        dgu[n * ld_out + F + f] = f32_to_bf16_bits(r.y);
    }
}
