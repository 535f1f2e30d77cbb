// SwiGLU forward and backward, elementwise. Host side and design: engine/kernels/swiglu.py.
#include <cuda_bf16.h>

__device__ __forceinline__ float sigmoid_f(float g) { return 1.0f / (1.0f + expf(-g)); }
__device__ __forceinline__ float silu_f(float g) { return g / (1.0f + expf(-g)); }

__device__ __forceinline__ float fwd1(float g, float u) { return silu_f(g) * u; }
__device__ __forceinline__ float2 bwd1(float dh, float g, float u) {  // (dg, du), by value: no stack
    const float sig = sigmoid_f(g);
    return make_float2(dh * u * (sig * (1.0f + g * (1.0f - sig))), dh * silu_f(g));
}

extern "C" __global__ void __launch_bounds__(256)
swiglu_fwd(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ h, long long n,
           int vec) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n4 = vec ? n / 4 : 0;
    for (long long i = first; i < n4; i += stride) {
        const float4 a = ((const float4*)g)[i], b = ((const float4*)u)[i];
        ((float4*)h)[i] = make_float4(fwd1(a.x, b.x), fwd1(a.y, b.y), fwd1(a.z, b.z), fwd1(a.w, b.w));
    }
    for (long long i = 4 * n4 + first; i < n; i += stride) h[i] = fwd1(g[i], u[i]);
}

extern "C" __global__ void __launch_bounds__(256)
swiglu_bwd(const float* __restrict__ dh, const float* __restrict__ g, const float* __restrict__ u,
           float* __restrict__ dg, float* __restrict__ du, long long n, int vec) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n4 = vec ? n / 4 : 0;
    for (long long i = first; i < n4; i += stride) {
        const float4 d = ((const float4*)dh)[i], a = ((const float4*)g)[i], b = ((const float4*)u)[i];
        const float2 x = bwd1(d.x, a.x, b.x), y = bwd1(d.y, a.y, b.y);
        const float2 z = bwd1(d.z, a.z, b.z), w = bwd1(d.w, a.w, b.w);
        ((float4*)dg)[i] = make_float4(x.x, y.x, z.x, w.x);
        ((float4*)du)[i] = make_float4(x.y, y.y, z.y, w.y);
    }
    for (long long i = 4 * n4 + first; i < n; i += stride) {
        const float2 r = bwd1(dh[i], g[i], u[i]);
        dg[i] = r.x;
        du[i] = r.y;
    }
}

// ---- the fused step's SwiGLU: g, u as bf16 bits in the columns of the gate/up projection's output
// (row stride ld_in), h = silu(g) u as bf16 bits (N, F); the backward reads dh float32 (N, F) and
// writes dg, du as bf16 bits into columns [0, F) and [F, 2F) of a buffer of row stride ld_out
__device__ __forceinline__ float bf(unsigned short b) { return __uint_as_float((unsigned)b << 16); }
__device__ __forceinline__ unsigned short tobf(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

extern "C" __global__ void __launch_bounds__(256)
swiglu_fwd_bf16(const unsigned short* __restrict__ gu, long long ld_in, unsigned short* __restrict__ h,
                long long N, int F) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < N * F; i += stride) {
        const long long n = i / F, f = i % F;
        h[i] = tobf(fwd1(bf(gu[n * ld_in + f]), bf(gu[n * ld_in + F + f])));
    }
}

extern "C" __global__ void __launch_bounds__(256)
swiglu_bwd_bf16(const float* __restrict__ dh, const unsigned short* __restrict__ gu, long long ld_in,
                unsigned short* __restrict__ dgu, long long ld_out, long long N, int F) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < N * F; i += stride) {
        const long long n = i / F, f = i % F;
        const float2 r = bwd1(dh[i], bf(gu[n * ld_in + f]), bf(gu[n * ld_in + F + f]));
        dgu[n * ld_out + f] = tobf(r.x);
        dgu[n * ld_out + F + f] = tobf(r.y);
    }
}
