// float32 to bf16 bits, for the bf16 tensor-core GEMMs of the linear layers (cuBLAS runs the products).
// Host side and dtype contract: engine/kernels/linear.py.

#include <cuda_bf16.h>

__device__ __forceinline__ unsigned bf16_pair(float a, float b) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
}

extern "C" __global__ void __launch_bounds__(256)
f32_to_bf16(const float* __restrict__ x, unsigned short* __restrict__ y, long long n, int vec) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n8 = vec ? n / 8 : 0;
    for (long long i = first; i < n8; i += stride) {
        const float4 a = ((const float4*)x)[2 * i], b = ((const float4*)x)[2 * i + 1];
        uint4 o;
        o.x = bf16_pair(a.x, a.y);
        o.y = bf16_pair(a.z, a.w);
        o.z = bf16_pair(b.x, b.y);
        o.w = bf16_pair(b.z, b.w);
        ((uint4*)y)[i] = o;
    }
    for (long long i = 8 * n8 + first; i < n; i += stride)
        y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}
