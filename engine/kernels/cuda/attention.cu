// Causal grouped-query attention, flash style in fp32: a mask-tile classifier, the forward, the dq and
// dk/dv backward kernels for head sizes 64, 128, 256, with attention sinks and a value head size of its
// own. Host side and design: engine/kernels/attention.py.

#define TILE 32
#define LANES 8
#define FULL 0xffffffffu
typedef long long i64;
#define NEG_INF __uint_as_float(0xff800000u)

template <int D> struct Cfg {
    static constexpr int NC = D / 32;                   // float4 chunks per lane
    static constexpr int D4 = D / 4;                    // float4 per row in shared memory
    static constexpr int SUB = D <= 128 ? 32 : 4096 / D;  // rows per shared-memory load
};

template <int NC>
__device__ __forceinline__ void load_row(const float* __restrict__ src, int HS, int lane, bool valid,
                                         float4 (&r)[NC]) {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
        const int d = 4 * (lane + LANES * i);
        r[i] = (valid && d < HS) ? *(const float4*)(src + d) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

template <int NC>
__device__ __forceinline__ float dot8(const float4 (&a)[NC], const float4* __restrict__ srow, int lane) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NC; ++i) {
        const float4 b = srow[lane + LANES * i];
        s += a[i].x * b.x + a[i].y * b.y + a[i].z * b.z + a[i].w * b.w;
    }
    s += __shfl_xor_sync(FULL, s, 1);
    s += __shfl_xor_sync(FULL, s, 2);
    s += __shfl_xor_sync(FULL, s, 4);
    return s;
}

template <int NC>
__device__ __forceinline__ void axpy(float4 (&acc)[NC], float p, const float4* __restrict__ srow, int lane) {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
        const float4 b = srow[lane + LANES * i];
        acc[i].x += p * b.x; acc[i].y += p * b.y; acc[i].z += p * b.z; acc[i].w += p * b.w;
    }
}

template <int NC>
__device__ __forceinline__ void axpy_reg(float4 (&acc)[NC], float p, const float4 (&b)[NC]) {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
        acc[i].x += p * b[i].x; acc[i].y += p * b[i].y; acc[i].z += p * b[i].z; acc[i].w += p * b[i].w;
    }
}

template <int NC>
__device__ __forceinline__ float dot_reg(const float4 (&a)[NC], const float4 (&b)[NC]) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NC; ++i) s += a[i].x * b[i].x + a[i].y * b[i].y + a[i].z * b[i].z + a[i].w * b[i].w;
    s += __shfl_xor_sync(FULL, s, 1);
    s += __shfl_xor_sync(FULL, s, 2);
    s += __shfl_xor_sync(FULL, s, 4);
    return s;
}

template <int NC>
__device__ __forceinline__ void store_row(float* __restrict__ dst, int HS, int lane, const float4 (&r)[NC],
                                          float f) {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
        const int d = 4 * (lane + LANES * i);
        if (d < HS) *(float4*)(dst + d) = make_float4(r[i].x * f, r[i].y * f, r[i].z * f, r[i].w * f);
    }
}

// rows [0, n_valid) of a shared tile from global rows src + r * stride (HS values each); the rest 0
template <int D>
__device__ __forceinline__ void load_tile(float4 (*dst)[Cfg<D>::D4], const float* __restrict__ src,
                                          i64 stride, int n_valid, int HS) {
    constexpr int D4 = Cfg<D>::D4, N = Cfg<D>::SUB * D4;
    for (int e = threadIdx.x; e < N; e += blockDim.x) {
        const int r = e / D4, d = 4 * (e - r * D4);
        dst[r][d / 4] = (r < n_valid && d < HS) ? *(const float4*)(src + r * stride + d)
                                                 : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// the query row of this thread in the forward and dq kernels: block (query tile qt, head h, batch b),
// LANES threads per row; hk: the key/value head of h; t: the row (valid: t < T); nQt, nKt: tile counts
struct QueryRow {
    int qt, h, b, hk, lane, t;
    bool valid;
    int nQt, nKt;
};
__device__ __forceinline__ QueryRow query_row(int T, int S, int NH, int NKV) {
    const int qt = blockIdx.x, row = threadIdx.x / LANES, t = qt * TILE + row;
    return {qt, (int)blockIdx.y, (int)blockIdx.z, (int)blockIdx.y / (NH / NKV), (int)threadIdx.x % LANES, t,
            t < T, (T + TILE - 1) / TILE, (S + TILE - 1) / TILE};
}

// key rows [s0, s0 + n_valid) of key/value head hk of batch b into Ks, Vs, between barriers (the
// previous rows may still be read before, every row is there after)
template <int D>
__device__ __forceinline__ void load_kv(float4 (*Ks)[Cfg<D>::D4], float4 (*Vs)[Cfg<D>::D4], const float* __restrict__ k,
                                       const float* __restrict__ v, int b, i64 kbs, i64 vbs, int s0, int n_valid,
                                       int NKV, int hk, int HS, int HSV) {
    __syncthreads();
    load_tile<D>(Ks, k + b * kbs + ((i64)s0 * NKV + hk) * HS, (i64)NKV * HS, n_valid, HS);
    load_tile<D>(Vs, v + b * vbs + ((i64)s0 * NKV + hk) * HSV, (i64)NKV * HSV, n_valid, HSV);
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(256)
attn_tile_class(const unsigned char* __restrict__ mask, int T, int S, int nQt, int nKt,
                unsigned char* __restrict__ tiles) {
    const int kt = blockIdx.x, qt = blockIdx.y, b = blockIdx.z;
    int allowed = 0, present = 0;
    for (int e0 = 0; e0 < TILE * TILE; e0 += blockDim.x) {  // the same trip count in every thread
        const int e = e0 + threadIdx.x;
        const int t = qt * TILE + e / TILE, s = kt * TILE + e % TILE;
        const bool in = e < TILE * TILE && t < T && s < S;
        present += __syncthreads_count(in);
        allowed += __syncthreads_count(in && mask[((i64)b * T + t) * S + s] != 0);
    }
    if (threadIdx.x == 0)
        tiles[((i64)b * nQt + qt) * nKt + kt] = allowed == 0 ? 0 : (allowed == present ? 1 : 2);
}

// HS: the query and key head size; HSV: the value head size (multi-head latent attention's differs), both
// <= D. sinks: per-head sink logits (gpt-oss), or null: one more logit per row whose value is zero.
template <int D>
__device__ __forceinline__ void attn_fwd(const float* __restrict__ q, const float* __restrict__ k,
                                         const float* __restrict__ v, const float* __restrict__ sinks,
                                         const unsigned char* __restrict__ mask,
                                         const unsigned char* __restrict__ tiles, float* __restrict__ o,
                                         float* __restrict__ lse, int T, int S, int NH, int NKV, int HS,
                                         int HSV, i64 qbs, i64 kbs, i64 vbs, float scale) {
    constexpr int NC = Cfg<D>::NC, D4 = Cfg<D>::D4, SUB = Cfg<D>::SUB;
    __shared__ float4 Ks[SUB][D4];
    __shared__ float4 Vs[SUB][D4];
    const auto [qt, h, b, hk, lane, t, valid, nQt, nKt] = query_row(T, S, NH, NKV);
    float4 qr[NC], acc[NC];
    load_row<NC>(q + b * qbs + ((i64)(valid ? t : 0) * NH + h) * HS, HS, lane, valid, qr);
#pragma unroll
    for (int i = 0; i < NC; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    float m = NEG_INF, l = 0.0f;
    const unsigned char* mrow = mask + ((i64)b * T + (valid ? t : 0)) * S;
    for (int kt = 0; kt < nKt; ++kt) {
        const int cls = tiles[((i64)b * nQt + qt) * nKt + kt];
        if (cls == 0) continue;
        const int s_end = min(kt * TILE + TILE, S);
        for (int s0 = kt * TILE; s0 < s_end; s0 += SUB) {
            const int n_valid = min(SUB, s_end - s0);
            load_kv<D>(Ks, Vs, k, v, b, kbs, vbs, s0, n_valid, NKV, hk, HS, HSV);
            for (int j0 = 0; j0 < n_valid; j0 += 16) {
                float sc[16];
                float mx = NEG_INF;
#pragma unroll
                for (int j = 0; j < 16; ++j) {
                    const float sv = dot8<NC>(qr, Ks[j0 + j], lane) * scale;
                    const int sk = s0 + j0 + j;
                    const bool ok = valid && j0 + j < n_valid && (cls == 1 || mrow[sk] != 0);
                    sc[j] = ok ? sv : NEG_INF;
                    mx = fmaxf(mx, sc[j]);
                }
                const float m_new = fmaxf(m, mx);
                if (m_new == NEG_INF) continue;  // nothing visible yet in this row
                const float corr = expf(m - m_new);
                l *= corr;
#pragma unroll
                for (int i = 0; i < NC; ++i) {
                    acc[i].x *= corr; acc[i].y *= corr; acc[i].z *= corr; acc[i].w *= corr;
                }
#pragma unroll
                for (int j = 0; j < 16; ++j) {
                    const float p = expf(sc[j] - m_new);
                    l += p;
                    axpy<NC>(acc, p, Vs[j0 + j], lane);
                }
                m = m_new;
            }
        }
    }
    if (sinks) {  // the sink's logit joins the row's softmax; its value is zero
        const float sk = sinks[h], m_new = fmaxf(m, sk), corr = expf(m - m_new);
        l = l * corr + expf(sk - m_new);
#pragma unroll
        for (int i = 0; i < NC; ++i) {
            acc[i].x *= corr; acc[i].y *= corr; acc[i].z *= corr; acc[i].w *= corr;
        }
        m = m_new;
    }
    if (valid) {
        store_row<NC>(o + (((i64)b * T + t) * NH + h) * HSV, HSV, lane, acc, l > 0.0f ? 1.0f / l : 0.0f);
        if (lane == 0) lse[((i64)b * NH + h) * T + t] = l > 0.0f ? m + logf(l) : NEG_INF;
    }
}

template <int D>
__device__ __forceinline__ void attn_bwd_dq(const float* __restrict__ q, const float* __restrict__ k,
                                            const float* __restrict__ v, const float* __restrict__ o,
                                            const float* __restrict__ dout, const float* __restrict__ lse,
                                            const unsigned char* __restrict__ mask,
                                            const unsigned char* __restrict__ tiles, float* __restrict__ dq,
                                            float* __restrict__ Dbuf, int T, int S, int NH, int NKV, int HS,
                                            int HSV, i64 qbs, i64 kbs, i64 vbs, float scale) {
    constexpr int NC = Cfg<D>::NC, D4 = Cfg<D>::D4, SUB = Cfg<D>::SUB;
    __shared__ float4 Ks[SUB][D4];
    __shared__ float4 Vs[SUB][D4];
    const auto [qt, h, b, hk, lane, t, valid, nQt, nKt] = query_row(T, S, NH, NKV);
    const int tt = valid ? t : 0;
    const i64 row_v = (((i64)b * T + tt) * NH + h) * HSV;  // o, dout: contiguous (B, T, NH, HSV)
    const i64 row_q = (((i64)b * T + tt) * NH + h) * HS;  // dq: contiguous (B, T, NH, HS)
    float4 qr[NC], dor[NC], acc[NC];
    load_row<NC>(q + b * qbs + ((i64)tt * NH + h) * HS, HS, lane, valid, qr);
    load_row<NC>(dout + row_v, HSV, lane, valid, dor);
    load_row<NC>(o + row_v, HSV, lane, valid, acc);
    const float Dt = dot_reg<NC>(dor, acc);  // sum(dO * O) over the row
#pragma unroll
    for (int i = 0; i < NC; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    const float lt = valid ? lse[((i64)b * NH + h) * T + t] : NEG_INF;
    if (valid && lane == 0) Dbuf[((i64)b * NH + h) * T + t] = Dt;
    const unsigned char* mrow = mask + ((i64)b * T + tt) * S;
    for (int kt = 0; kt < nKt; ++kt) {
        const int cls = tiles[((i64)b * nQt + qt) * nKt + kt];
        if (cls == 0) continue;
        const int s_end = min(kt * TILE + TILE, S);
        for (int s0 = kt * TILE; s0 < s_end; s0 += SUB) {
            const int n_valid = min(SUB, s_end - s0);
            load_kv<D>(Ks, Vs, k, v, b, kbs, vbs, s0, n_valid, NKV, hk, HS, HSV);
            for (int j = 0; j < n_valid; ++j) {
                const float sv = dot8<NC>(qr, Ks[j], lane) * scale;
                const float dp = dot8<NC>(dor, Vs[j], lane);
                const bool ok = valid && lt != NEG_INF && (cls == 1 || mrow[s0 + j] != 0);
                const float p = ok ? expf(sv - lt) : 0.0f;
                axpy<NC>(acc, p * (dp - Dt), Ks[j], lane);
            }
        }
    }
    if (valid) store_row<NC>(dq + row_q, HS, lane, acc, scale);
}

template <int D>
__device__ __forceinline__ void attn_bwd_dkdv(const float* __restrict__ q, const float* __restrict__ k,
                                              const float* __restrict__ v, const float* __restrict__ dout,
                                              const float* __restrict__ lse, const float* __restrict__ Dbuf,
                                              const unsigned char* __restrict__ mask,
                                              const unsigned char* __restrict__ tiles, float* __restrict__ dk,
                                              float* __restrict__ dv, int T, int S, int NH, int NKV, int HS,
                                              int HSV, i64 qbs, i64 kbs, i64 vbs, float scale) {
    constexpr int NC = Cfg<D>::NC, D4 = Cfg<D>::D4, SUB = Cfg<D>::SUB;
    __shared__ float4 Qs[SUB][D4];
    __shared__ float4 Os[SUB][D4];
    __shared__ float Ls[SUB];
    __shared__ float Ds[SUB];
    const int kt = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int G = NH / NKV;
    const int row = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    const int s = kt * TILE + row;
    const bool valid = s < S;
    const int ss = valid ? s : 0;
    const int nQt = (T + TILE - 1) / TILE, nKt = (S + TILE - 1) / TILE;
    float4 kr[NC], vr[NC], dkr[NC], dvr[NC];
    load_row<NC>(k + b * kbs + ((i64)ss * NKV + hk) * HS, HS, lane, valid, kr);
    load_row<NC>(v + b * vbs + ((i64)ss * NKV + hk) * HSV, HSV, lane, valid, vr);
#pragma unroll
    for (int i = 0; i < NC; ++i) {
        dkr[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        dvr[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int g = 0; g < G; ++g) {
        const int h = hk * G + g;
        for (int qt = 0; qt < nQt; ++qt) {
            const int cls = tiles[((i64)b * nQt + qt) * nKt + kt];
            if (cls == 0) continue;
            const int t_end = min(qt * TILE + TILE, T);
            for (int t0 = qt * TILE; t0 < t_end; t0 += SUB) {
                const int n_valid = min(SUB, t_end - t0);
                __syncthreads();
                load_tile<D>(Qs, q + b * qbs + ((i64)t0 * NH + h) * HS, (i64)NH * HS, n_valid, HS);
                load_tile<D>(Os, dout + (((i64)b * T + t0) * NH + h) * HSV, (i64)NH * HSV, n_valid, HSV);
                for (int e = threadIdx.x; e < SUB; e += blockDim.x) {
                    const bool in = e < n_valid;
                    Ls[e] = in ? lse[((i64)b * NH + h) * T + t0 + e] : NEG_INF;
                    Ds[e] = in ? Dbuf[((i64)b * NH + h) * T + t0 + e] : 0.0f;
                }
                __syncthreads();
                for (int i = 0; i < n_valid; ++i) {
                    const float sv = dot8<NC>(kr, Qs[i], lane) * scale;
                    const float dp = dot8<NC>(vr, Os[i], lane);
                    const float li = Ls[i];
                    const bool ok = valid && li != NEG_INF &&
                                    (cls == 1 || mask[((i64)b * T + t0 + i) * S + s] != 0);
                    const float p = ok ? expf(sv - li) : 0.0f;
                    axpy<NC>(dvr, p, Os[i], lane);
                    axpy<NC>(dkr, p * (dp - Ds[i]), Qs[i], lane);
                }
            }
        }
    }
    if (valid) {
        store_row<NC>(dk + (((i64)b * S + s) * NKV + hk) * HS, HS, lane, dkr, scale);
        store_row<NC>(dv + (((i64)b * S + s) * NKV + hk) * HSV, HSV, lane, dvr, 1.0f);
    }
}

// MINB: blocks per SM the register allocation aims for. 256-wide heads hold 64 floats of q and o per
// thread: ptxas's own choice for them (128 registers) spilled 96 bytes, a floor of 1 block (154
// registers) spills nothing. The 64 and 128 heads keep ptxas's choice (d64 fwd: 64 registers,
// 20 bytes spilled, 4 blocks per SM; unspilled it needs 96 registers, 2 blocks): to be timed.
#define ATTN_KERNELS(D, MINB)                                                                           \
    extern "C" __global__ void __launch_bounds__(256, MINB) attn_fwd_d##D(                              \
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,          \
        const float* __restrict__ sinks, const unsigned char* __restrict__ mask,                        \
        const unsigned char* __restrict__ tiles, float* __restrict__ o, float* __restrict__ lse, int T, \
        int S, int NH, int NKV, int HS, int HSV, i64 qbs, i64 kbs, i64 vbs, float scale) {              \
        attn_fwd<D>(q, k, v, sinks, mask, tiles, o, lse, T, S, NH, NKV, HS, HSV, qbs, kbs, vbs, scale); \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(256, MINB) attn_bwd_dq_d##D(                           \
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,          \
        const float* __restrict__ o, const float* __restrict__ dout, const float* __restrict__ lse,     \
        const unsigned char* __restrict__ mask, const unsigned char* __restrict__ tiles,                \
        float* __restrict__ dq, float* __restrict__ Dbuf, int T, int S, int NH, int NKV, int HS,       \
        int HSV, i64 qbs, i64 kbs, i64 vbs, float scale) {                                              \
        attn_bwd_dq<D>(q, k, v, o, dout, lse, mask, tiles, dq, Dbuf, T, S, NH, NKV, HS, HSV, qbs, kbs, \
                       vbs, scale);                                                                     \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(256, MINB) attn_bwd_dkdv_d##D(                         \
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,          \
        const float* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Dbuf,  \
        const unsigned char* __restrict__ mask, const unsigned char* __restrict__ tiles,                \
        float* __restrict__ dk, float* __restrict__ dv, int T, int S, int NH, int NKV, int HS, int HSV, \
        i64 qbs, i64 kbs, i64 vbs, float scale) {                                                       \
        attn_bwd_dkdv<D>(q, k, v, dout, lse, Dbuf, mask, tiles, dk, dv, T, S, NH, NKV, HS, HSV, qbs,   \
                         kbs, vbs, scale);                                                              \
    }

ATTN_KERNELS(64, 0)
ATTN_KERNELS(128, 0)
ATTN_KERNELS(256, 1)
