// Embedding rows (get_rows, float32 or bf16 storage) and their sorted scatter-add backward.
// Host side and design: engine/kernels/embedding.py.

#include <cuda_bf16.h>

template <int V> struct RowF32;  // V floats from float32 storage
template <> struct RowF32<4> {
    static __device__ __forceinline__ void load(const float* p, float (&r)[4]) {
        const float4 t = *(const float4*)p;
        r[0] = t.x; r[1] = t.y; r[2] = t.z; r[3] = t.w;
    }
};
template <> struct RowF32<1> {
    static __device__ __forceinline__ void load(const float* p, float (&r)[1]) { r[0] = p[0]; }
};
template <int V> struct RowBF16;  // V floats from bf16 storage
template <> struct RowBF16<8> {
    static __device__ __forceinline__ void load(const unsigned short* p, float (&r)[8]) {
        const uint4 t = *(const uint4*)p;
        const unsigned w[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            r[2 * k] = __uint_as_float(w[k] << 16);
            r[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
};
template <> struct RowBF16<1> {
    static __device__ __forceinline__ void load(const unsigned short* p, float (&r)[1]) {
        r[0] = __uint_as_float((unsigned)p[0] << 16);
    }
};

template <int V>
__device__ __forceinline__ void store_row(float* p, const float (&r)[V]) {
    if (V % 4 == 0) {
#pragma unroll
        for (int k = 0; k < V / 4; ++k)
            *(float4*)(p + 4 * k) = make_float4(r[4 * k], r[4 * k + 1], r[4 * k + 2], r[4 * k + 3]);
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k) p[k] = r[k];
    }
}

template <class Load, class T, int V>
__device__ __forceinline__ void get_rows(const T* __restrict__ w, const int* __restrict__ ids,
                                         float* __restrict__ out, int n_vocab, int C) {
    const long long row = blockIdx.x;
    const int id = ids[row];
    float* o = out + row * C;
    if (id < 0 || id >= n_vocab) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = __uint_as_float(0x7fc00000u);
        return;
    }
    const T* src = w + (long long)id * C;
    for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
        float r[V];
        Load::load(src + c, r);
        store_row<V>(o + c, r);
    }
}

#define GET_ROWS(NAME, LOAD, T, V)                                                                   \
    extern "C" __global__ void __launch_bounds__(128) NAME(const T* __restrict__ w,                 \
        const int* __restrict__ ids, float* __restrict__ out, int n_vocab, int C) {                  \
        get_rows<LOAD, T, V>(w, ids, out, n_vocab, C);                                               \
    }
GET_ROWS(get_rows_f32_v4, RowF32<4>, float, 4)
GET_ROWS(get_rows_f32_v1, RowF32<1>, float, 1)
GET_ROWS(get_rows_bf16_v8, RowBF16<8>, unsigned short, 8)
GET_ROWS(get_rows_bf16_v1, RowBF16<1>, unsigned short, 1)

template <int V>
__device__ __forceinline__ void scatter_add_sorted(float* __restrict__ dst, const int* __restrict__ tok,
                                                   const int* __restrict__ order,
                                                   const float* __restrict__ rows, int n, int D,
                                                   float scale) {
    const int i = blockIdx.x;
    const int t = tok[i];
    if (i > 0 && tok[i - 1] == t) return;  // not the first of its token: the owner adds this row
    for (int c = threadIdx.x * V; c < D; c += blockDim.x * V) {
        float acc[V];
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = 0.0f;
        for (int j = i; j < n && tok[j] == t; ++j) {
            float r[V];
            RowF32<V>::load(rows + (long long)order[j] * D + c, r);
#pragma unroll
            for (int k = 0; k < V; ++k) acc[k] += r[k];
        }
        float* d = dst + (long long)t * D + c;
        float cur[V];
        RowF32<V>::load(d, cur);
#pragma unroll
        for (int k = 0; k < V; ++k) cur[k] += scale * acc[k];
        store_row<V>(d, cur);
    }
}

extern "C" __global__ void __launch_bounds__(128)
scatter_add_sorted_v4(float* __restrict__ dst, const int* __restrict__ tok, const int* __restrict__ order,
                      const float* __restrict__ rows, int n, int D, float scale) {
    scatter_add_sorted<4>(dst, tok, order, rows, n, D, scale);
}
extern "C" __global__ void __launch_bounds__(128)
scatter_add_sorted_v1(float* __restrict__ dst, const int* __restrict__ tok, const int* __restrict__ order,
                      const float* __restrict__ rows, int n, int D, float scale) {
    scatter_add_sorted<1>(dst, tok, order, rows, n, D, scale);
}
