// GGUF blocks to float32 or bf16, one kernel per type and output dtype. Host side, launch plan and exactness
// rules: engine/kernels/dequant.py.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

// THREADS and VALUES_PER_THREAD (set by dequant.py, -D): threads per block, values per thread
#define TILE_VALUES (THREADS * VALUES_PER_THREAD)

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;

// ---- helpers ------------------------------------------------------------------------------------

__device__ __forceinline__ float f16_at(const u8* p) {  // little-endian IEEE half at any byte address
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}
__device__ __forceinline__ u32 u32_at(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
// NumPy rounds a product and a following sum separately: never let them become one FMA
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float mul_add(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }
__device__ __forceinline__ float mul_sub(float a, float b, float c) { return __fsub_rn(__fmul_rn(a, b), c); }

// signed byte idx (0..15) of a 16-entry table packed little-endian into 4 words, without memory
__device__ __forceinline__ int table16(uint4 t, int idx) {
    const u32 lo = __byte_perm(t.x, t.y, idx & 7);
    const u32 hi = __byte_perm(t.z, t.w, idx & 7);
    return (int)(signed char)(((idx & 8) ? hi : lo) & 0xffu);
}
// KV_IQ4NL and KV_MXFP4 (set by dequant.py, -D): the 16 values of each 4-bit codebook as such a table,
// make_uint4(w0, w1, w2, w3)

// ---- one struct per type: QK values in TS bytes; decode8 gives values j..j+7 of the block at p ----
// (j is a multiple of 8; for the 1-value types p points at value j and j is 0)

struct TF32 {
    static constexpr int QK = 1, TS = 4;
    static __device__ __forceinline__ void decode8(const u8* p, int, float (&v)[8]) {
        if (((size_t)p & 15) == 0) {
            const uint4 a = ((const uint4*)p)[0], b = ((const uint4*)p)[1];
            v[0] = __uint_as_float(a.x); v[1] = __uint_as_float(a.y);
            v[2] = __uint_as_float(a.z); v[3] = __uint_as_float(a.w);
            v[4] = __uint_as_float(b.x); v[5] = __uint_as_float(b.y);
            v[6] = __uint_as_float(b.z); v[7] = __uint_as_float(b.w);
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(u32_at(p + 4 * i));
        }
    }
};

__device__ __forceinline__ void words8(const u8* p, u32 (&w)[4]) {  // 16 bytes at p, any alignment
    if (((size_t)p & 15) == 0) {
        const uint4 a = *(const uint4*)p;
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = u32_at(p + 4 * k);
    }
}

__device__ __forceinline__ float f16_bits(u32 h) { return __half2float(__ushort_as_half((unsigned short)h)); }
// bf16 reference: (int16 -> int32) << 16, viewed as float32
__device__ __forceinline__ float bf16_bits(u32 h) { return __uint_as_float(h << 16); }

template <float (*WIDEN)(u32)>  // one 16-bit value (the low half of its argument) to float32
struct T16 {
    static constexpr int QK = 1, TS = 2;
    static __device__ __forceinline__ void decode8(const u8* p, int, float (&v)[8]) {
        u32 w[4];
        words8(p, w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[2 * k] = WIDEN(w[k] & 0xffffu);
            v[2 * k + 1] = WIDEN(w[k] >> 16);
        }
    }
};
typedef T16<f16_bits> TF16;
typedef T16<bf16_bits> TBF16;

struct TQ8_0 {  // d: f16, qs: 32 x int8; x * d
    static constexpr int QK = 32, TS = 34;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const float d = f16_at(p);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = mul((float)(signed char)p[2 + j + i], d);
    }
};

// 32 4-bit values in 16 bytes: value o < 16 is the low nibble of byte o, value o >= 16 the high
// nibble of byte o - 16; a group of 8 lies in one half
#define NIBBLES32(qs, j) const u8* q = (qs) + ((j) & 15); const int sh = ((j) & 16) ? 4 : 0;

struct TQ4_0 {  // d: f16, qs[16]; d * (q - 8)
    static constexpr int QK = 32, TS = 18;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const float d = f16_at(p);
        NIBBLES32(p + 2, j)
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = mul(d, (float)(((q[i] >> sh) & 15) - 8));
    }
};

struct TQ4_1 {  // d, m: f16, qs[16]; (d * q) + m
    static constexpr int QK = 32, TS = 20;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const float d = f16_at(p), m = f16_at(p + 2);
        NIBBLES32(p + 4, j)
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = mul_add(d, (float)((q[i] >> sh) & 15), m);
    }
};

struct TQ5_0 {  // d: f16, qh: u32 (bit o = 5th bit of value o), qs[16]; d * (q - 16)
    static constexpr int QK = 32, TS = 22;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const float d = f16_at(p);
        const u32 qh = u32_at(p + 2) >> j;
        NIBBLES32(p + 6, j)
#pragma unroll
        for (int i = 0; i < 8; ++i)
            v[i] = mul(d, (float)((int)(((q[i] >> sh) & 15) | (((qh >> i) & 1) << 4)) - 16));
    }
};

struct TQ5_1 {  // d, m: f16, qh: u32, qs[16]; (d * q) + m
    static constexpr int QK = 32, TS = 24;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const float d = f16_at(p), m = f16_at(p + 2);
        const u32 qh = u32_at(p + 4) >> j;
        NIBBLES32(p + 8, j)
#pragma unroll
        for (int i = 0; i < 8; ++i)
            v[i] = mul_add(d, (float)(((q[i] >> sh) & 15) | (((qh >> i) & 1) << 4)), m);
    }
};

struct TIQ4_NL {  // d: f16, qs[16]; d * kvalues[q]
    static constexpr int QK = 32, TS = 18;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const float d = f16_at(p);
        const uint4 t = KV_IQ4NL;
        NIBBLES32(p + 2, j)
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = mul(d, (float)table16(t, (q[i] >> sh) & 15));
    }
};

struct TMXFP4 {  // e: e8m0 (as ggml_e8m0_to_fp32_half), qs[16]; d * kvalues[q]
    static constexpr int QK = 32, TS = 17;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const u32 e = p[0];
        const float d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
        const uint4 t = KV_MXFP4;
        NIBBLES32(p + 1, j)
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = mul(d, (float)table16(t, (q[i] >> sh) & 15));
    }
};

// K-quants: 256 values in sub-blocks of 16 (Q2_K, Q3_K, Q6_K) or 32 (Q4_K, Q5_K, IQ4_XS)

struct TQ2_K {  // scales[16], qs[64], d, dmin; dl * q - ml
    static constexpr int QK = 256, TS = 84;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const float d = f16_at(p + 80), dmin = f16_at(p + 82);
        const int sc = p[j >> 4];
        const float dl = mul(d, (float)(sc & 15)), ml = mul(dmin, (float)(sc >> 4));
        const u8* q = p + 16 + (j >> 7) * 32 + (j & 31);
        const int sh = ((j >> 5) & 3) * 2;
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = mul_sub(dl, (float)((q[i] >> sh) & 3), ml);
    }
};

struct TQ3_K {  // hmask[32], qs[64], scales[12] (6-bit, packed), d; (d * scale) * q
    static constexpr int QK = 256, TS = 110;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const u8* s = p + 96;
        const float d = f16_at(p + 108);
        const int g = j >> 4;
        const int lo = g < 8 ? (s[g] & 15) : (s[g - 8] >> 4);
        const int hi = (s[8 + (g & 3)] >> (2 * (g >> 2))) & 3;
        const float dl = mul(d, (float)((lo | (hi << 4)) - 32));
        const int l = j & 31, k = j >> 5;
        const u8* q = p + 32 + (j >> 7) * 32 + l;
        const u8* hm = p + l;
        const int sh = (k & 3) * 2;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            v[i] = mul(dl, (float)(((q[i] >> sh) & 3) - ((((hm[i] >> k) & 1) ^ 1) << 2)));
    }
};

// Q4_K/Q5_K: 8 6-bit scales and mins packed in 12 bytes (gguf-py Q4_K.get_scale_min)
__device__ __forceinline__ void scale_min_k4(const u8* s, int sub, int& sc, int& m) {
    if (sub < 4) {
        sc = s[sub] & 63;
        m = s[sub + 4] & 63;
    } else {
        sc = (s[sub + 4] & 15) | ((s[sub - 4] >> 2) & 0x30);
        m = (s[sub + 4] >> 4) | ((s[sub] >> 2) & 0x30);
    }
}

// Q4_K, and Q5_K (QH: 32 bytes of fifth bits before the nibbles): d, dmin, scales[12], [qh[32]], qs[128];
// (d * sc) * q - (dmin * m)
template <bool QH>
__device__ __forceinline__ void decode8_k45(const u8* p, int j, float (&v)[8]) {
    const float d = f16_at(p), dmin = f16_at(p + 2);
    const int sub = j >> 5;
    int sc, m;
    scale_min_k4(p + 4, sub, sc, m);
    const float ds = mul(d, (float)sc), dm = mul(dmin, (float)m);
    const u8* q = p + (QH ? 48 : 16) + (sub >> 1) * 32 + (j & 31);
    const u8* qh = p + 16 + (j & 31);
    const int sh = (sub & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int x = (q[i] >> sh) & 15;
        if (QH) x |= ((qh[i] >> sub) & 1) << 4;
        v[i] = mul_sub(ds, (float)x, dm);
    }
}

struct TQ4_K {
    static constexpr int QK = 256, TS = 144;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        decode8_k45<false>(p, j, v);
    }
};

struct TQ5_K {
    static constexpr int QK = 256, TS = 176;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        decode8_k45<true>(p, j, v);
    }
};

struct TQ6_K {  // ql[128], qh[64], scales[16] (int8), d; (d * scale) * (q - 32)
    static constexpr int QK = 256, TS = 210;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const float d = f16_at(p + 208);
        const float ds = mul(d, (float)(signed char)p[192 + (j >> 4)]);
        const int h = j >> 7, r = j & 127;
        const u8* lo = p + h * 64 + (r & 63);
        const u8* hi = p + 128 + h * 32 + (r & 31);
        const int lsh = (r >> 6) * 4, hsh = (r >> 5) * 2;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            v[i] = mul(ds, (float)((int)(((lo[i] >> lsh) & 15) | (((hi[i] >> hsh) & 3) << 4)) - 32));
    }
};

struct TIQ4_XS {  // d, scales_h: u16, scales_l[4], qs[128]; (d * (scale - 32)) * kvalues[q]
    static constexpr int QK = 256, TS = 136;
    static __device__ __forceinline__ void decode8(const u8* p, int j, float (&v)[8]) {
        const float d = f16_at(p);
        const u32 scales_h = (u32)p[2] | ((u32)p[3] << 8);
        const int ib = j >> 5;
        const int lo = (p[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15;
        const int hi = (scales_h >> (2 * ib)) & 3;
        const float dl = mul(d, (float)((lo | (hi << 4)) - 32));
        const uint4 t = KV_IQ4NL;
        const int r = j & 31;
        const u8* q = p + 8 + ib * 16 + (r & 15);
        const int sh = (r >> 4) * 4;
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = mul(dl, (float)table16(t, (q[i] >> sh) & 15));
    }
};

// ---- stores -------------------------------------------------------------------------------------

__device__ __forceinline__ void store8(float* out, const float (&v)[8], int n) {
    // __stwb: a plain (write-back) 16-byte store the compiler cannot split into scalar stores
    if (n >= 8 && ((size_t)out & 15) == 0) {
        __stwb((float4*)out, make_float4(v[0], v[1], v[2], v[3]));
        __stwb((float4*)out + 1, make_float4(v[4], v[5], v[6], v[7]));
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (i < n) out[i] = v[i];
    }
}

__device__ __forceinline__ u32 bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

__device__ __forceinline__ void store8(unsigned short* out, const float (&v)[8], int n) {  // bf16 bits
    if (n >= 8 && ((size_t)out & 15) == 0) {
        uint4 w;
        w.x = bf16_bits(v[0]) | (bf16_bits(v[1]) << 16);
        w.y = bf16_bits(v[2]) | (bf16_bits(v[3]) << 16);
        w.z = bf16_bits(v[4]) | (bf16_bits(v[5]) << 16);
        w.w = bf16_bits(v[6]) | (bf16_bits(v[7]) << 16);
        __stwb((uint4*)out, w);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (i < n) out[i] = (unsigned short)bf16_bits(v[i]);
    }
}

__device__ __forceinline__ void poison(float* out, int i) { out[i] = __uint_as_float(0x7fc00000u); }
__device__ __forceinline__ void poison(unsigned short* out, int i) { out[i] = 0x7fc0; }

// ---- the kernel body ----------------------------------------------------------------------------
// src: n_src_slices slices of src_slice_bytes raw bytes; dst: n_slices slices of slice_values
// values; slice s of dst is slice ids[s] of src (or slice s when ids is null)

template <class Q, class OutT>
__device__ __forceinline__ void dequant_tile(const u8* __restrict__ src, i64 src_slice_bytes,
                                             const int* __restrict__ ids, int n_src_slices,
                                             i64 slice_values, int tiles_per_slice, OutT* __restrict__ dst) {
    constexpr int TILE_BYTES = TILE_VALUES / Q::QK * Q::TS;
    static_assert(TILE_VALUES % Q::QK == 0, "a tile holds whole blocks");
    __shared__ uint4 stage[TILE_BYTES / 16 + 2];  // +2: the misaligned head and the rounded-up tail

    const int slice = blockIdx.x / tiles_per_slice;
    const int tile = blockIdx.x - slice * tiles_per_slice;
    const i64 v0 = (i64)tile * TILE_VALUES;
    const int nv = (int)min((i64)TILE_VALUES, slice_values - v0);  // values in this tile (mult. of QK)
    OutT* out = dst + (i64)slice * slice_values + v0;
    const int from = ids ? ids[slice] : slice;
    if (from < 0 || from >= n_src_slices) {  // a bad expert id: say so in the output, read nothing
        for (int i = threadIdx.x; i < nv; i += THREADS) poison(out, i);
        return;
    }

    // stage the tile's bytes with 16-byte loads from the 16-byte boundary at or below its start
    const u8* bytes = src + (i64)from * src_slice_bytes + v0 / Q::QK * Q::TS;
    const int nbytes = nv / Q::QK * Q::TS;
    const int shift = (int)((size_t)bytes & 15);
    const uint4* words = (const uint4*)(bytes - shift);
    const int n_words = (shift + nbytes + 15) >> 4;
    for (int i = threadIdx.x; i < n_words; i += THREADS) stage[i] = __ldg(words + i);
    __syncthreads();

    const int j0 = threadIdx.x * VALUES_PER_THREAD;
    if (j0 >= nv) return;
    const u8* tile_bytes = (const u8*)stage + shift;
    float v[8];
    Q::decode8(tile_bytes + (j0 / Q::QK) * Q::TS, j0 % Q::QK, v);
    store8(out + j0, v, nv - j0);
}

#define DEQUANT_KERNELS(NAME, Q)                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS) dequant_##NAME##_f32(                       \
        const u8* __restrict__ src, i64 src_slice_bytes, const int* __restrict__ ids, int n_src_slices, \
        i64 slice_values, int tiles_per_slice, float* __restrict__ dst) {                             \
        dequant_tile<Q>(src, src_slice_bytes, ids, n_src_slices, slice_values, tiles_per_slice, dst); \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS) dequant_##NAME##_bf16(                      \
        const u8* __restrict__ src, i64 src_slice_bytes, const int* __restrict__ ids, int n_src_slices, \
        i64 slice_values, int tiles_per_slice, unsigned short* __restrict__ dst) {                    \
        dequant_tile<Q>(src, src_slice_bytes, ids, n_src_slices, slice_values, tiles_per_slice, dst); \
    }

DEQUANT_KERNELS(f32, TF32)
DEQUANT_KERNELS(f16, TF16)
DEQUANT_KERNELS(bf16, TBF16)
DEQUANT_KERNELS(q8_0, TQ8_0)
DEQUANT_KERNELS(q4_0, TQ4_0)
DEQUANT_KERNELS(q4_1, TQ4_1)
DEQUANT_KERNELS(q5_0, TQ5_0)
DEQUANT_KERNELS(q5_1, TQ5_1)
DEQUANT_KERNELS(q2_k, TQ2_K)
DEQUANT_KERNELS(q3_k, TQ3_K)
DEQUANT_KERNELS(q4_k, TQ4_K)
DEQUANT_KERNELS(q5_k, TQ5_K)
DEQUANT_KERNELS(q6_k, TQ6_K)
DEQUANT_KERNELS(iq4_nl, TIQ4_NL)
DEQUANT_KERNELS(iq4_xs, TIQ4_XS)
DEQUANT_KERNELS(mxfp4, TMXFP4)
