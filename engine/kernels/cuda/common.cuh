// Device helpers the kernel sources share: warp and block reductions (float and double, fixed order),
// bf16 bits. A source takes them with #include "common.cuh"; KernelSource.from_file inlines the file
// there, so NVRTC and the tests' g++ emulators get one translation unit.

#include <cuda_bf16.h>
#ifndef INFINITY
#define INFINITY __uint_as_float(0x7f800000u)
#endif
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// WARP (a warp reduction that gives every lane the result) over the block, given to every thread;
// blockDim.x a multiple of 32; scratch: 32 values of shared memory; identity: what an absent warp
// adds; deterministic (fixed order for a given block size)
template <typename T, T (*WARP)(T)>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T identity) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = WARP(v);
    __syncthreads();  // the scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return WARP(lane < nw ? scratch[lane] : identity);
}
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    return block_reduce<float, warp_sum>(v, scratch, 0.0f);
}
__device__ __forceinline__ double block_sum_d(double v, double* scratch) {
    return block_reduce<double, warp_sum_d>(v, scratch, 0.0);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
    return block_reduce<float, warp_max>(v, scratch, -INFINITY);
}
__device__ __forceinline__ float bf16_bits_to_f32(unsigned short b) {
    return __uint_as_float((unsigned)b << 16);
}
__device__ __forceinline__ unsigned short f32_to_bf16_bits(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
