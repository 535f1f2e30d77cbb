// SwiGLU forward and backward, elementwise. Host side and design: engine/kernels/swiglu.py.

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
