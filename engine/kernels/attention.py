"""Causal grouped-query attention with a block-diagonal mask for packed samples.

`attention_mask` and `attention_forward_ref` / `attention_backward_ref` are the NumPy reference
(the specification: it stores the (B, NKV, G, T, S) probabilities). `attention_forward` /
`attention_backward` are the CUDA twins, two ways: flash-style tiled kernels (here: fp32 on the
CUDA cores, an online softmax that never stores the probabilities; their cache,
`FlashAttentionCache`, keeps the log-sum-exp of each query row instead) for decoding and short
rows, and from `attention_gemm.GEMM_MIN_T` queries up (training, prefill) bf16 tensor-core GEMMs
over materialised scores (engine/kernels/attention_gemm.py). Not here: RoPE, the projections, the KV
cache's bookkeeping.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .nvrtc import KernelSource
from .runtime import Runtime, f32_input, runtime_for


def attention_mask(
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    q_seg: np.ndarray | None = None,
    k_seg: np.ndarray | None = None,
) -> np.ndarray:
    """Boolean (B, T, S): query t sees key s when k_pos <= q_pos (and both lie in the same packed sample)."""
    allowed = k_pos[:, None, :] <= q_pos[:, :, None]
    if q_seg is not None and k_seg is not None:
        allowed &= k_seg[:, None, :] == q_seg[:, :, None]
    return allowed


class AttentionCache(NamedTuple):
    qg: np.ndarray  # (B, NKV, G, T, HS) queries grouped by their key/value head
    kt: np.ndarray  # (B, NKV, 1, HS, S) keys, transposed
    vt: np.ndarray  # (B, NKV, 1, S, HS) values
    p: np.ndarray  # (B, NKV, G, T, S) attention probabilities (0 where masked)
    scale: float


def attention_forward_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float):
    """Grouped-query attention. q (B, T, NH, HS); k, v (B, S, NKV, HS); mask (B, T, S) bool.

    Query head h reads key/value head h // (NH / NKV). Returns (B, T, NH*HS).
    """
    B, T, NH, HS = q.shape
    NKV = k.shape[2]
    G = NH // NKV
    qg = q.reshape(B, T, NKV, G, HS).transpose(0, 2, 3, 1, 4)  # (B, NKV, G, T, HS)
    kt = k.transpose(0, 2, 3, 1)[:, :, None]  # (B, NKV, 1, HS, S)
    att = (qg @ kt) * scale  # (B, NKV, G, T, S)
    m = mask[:, None, None]  # (B, 1, 1, T, S)
    att = np.where(m, att, -np.inf)
    att = att - att.max(axis=-1, keepdims=True)
    p = np.exp(att)
    p /= p.sum(axis=-1, keepdims=True)  # (B, NKV, G, T, S)
    vt = v.transpose(0, 2, 1, 3)[:, :, None]  # (B, NKV, 1, S, HS)
    out = p @ vt  # (B, NKV, G, T, HS)
    y = out.transpose(0, 3, 1, 2, 4).reshape(B, T, NH * HS)
    return y, AttentionCache(qg, kt, vt, p, scale)


def attention_backward_ref(dy: np.ndarray, cache: AttentionCache):
    """forward was: y = softmax(mask(q k^T * scale)) v, per KV group.  Returns (dq, dk, dv)."""
    qg, kt, vt, p, scale = cache
    B, NKV, G, T, HS = qg.shape
    do = dy.reshape(B, T, NKV, G, HS).transpose(0, 2, 3, 1, 4)  # (B, NKV, G, T, HS)
    dp = do @ vt.swapaxes(-1, -2)  # (B, NKV, G, T, S)
    dv = (p.swapaxes(-1, -2) @ do).sum(axis=2)  # (B, NKV, S, HS)
    datt = p * (dp - (dp * p).sum(axis=-1, keepdims=True))  # softmax backward; masked p = 0
    datt *= scale
    dqg = datt @ kt.swapaxes(-1, -2)  # (B, NKV, G, T, HS)
    dk = (datt.swapaxes(-1, -2) @ qg).sum(axis=2)  # (B, NKV, S, HS)
    dq = dqg.transpose(0, 3, 1, 2, 4).reshape(B, T, NKV * G, HS)
    return dq, dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3)


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract: q (B, T, NH, HS), k, v (B, S, NKV, HS) float32 CuPy arrays, each with its inner three
# axes contiguous (a batch stride is allowed: the KV cache's [:, :S] views run without a copy);
# HS % 4 == 0 and HS <= 256; NH % NKV == 0; mask (B, T, S) bool (host or device). fp32 math; y
# is (B, T, NH*HS). A query row that sees no key gives 0 (the reference gives NaN there).
#
# The cache is a FlashAttentionCache: the reference's AttentionCache fields, holding
#   qg = q as given (B, T, NH, HS); kt = k (B, S, NKV, HS); vt = v; scale; and
#   p = FlashState(o, lse, mask, tiles) in place of the probabilities: o the output (y's memory),
#   lse (B, NH, T) the log-sum-exp of each row's scaled, masked scores, mask (B, T, S) as uint8 on
#   the device, tiles (B, nQt, nKt) the class of each 32 x 32 tile of the mask: 0 nothing visible
#   (skipped), 1 all visible (the mask is not read), 2 mixed (read). Causal and packed-sample masks
#   make most tiles 0 or 1, so about half the work of a causal mask is skipped outright.
#
# attn_tile_class: grid (nKt, nQt, B), 256 threads, one 32 x 32 tile each (__syncthreads_count).
#   Reads the mask once: B T S bytes.
# attn_fwd_d{D}: grid (nQt = ceil(T/32), NH, B), 256 threads: 32 query rows per block, 8 lanes per
#   row, each lane holding D/8 of the row's values (float4 chunks lane, lane + 8, ...: the 8 lanes of
#   a row read 128 contiguous bytes). D (64, 128, 256) is the smallest >= HS (real models:
#   64, 80, 96, 128, 256; smaller test heads run padded to 64). Per visible key
#   tile, K and V rows go to shared memory (SUB = min(32, 4096/D) rows at a time, 16-byte loads,
#   32 KB at most); every row takes its scores 16 keys at a time (an 8-lane dot product, 3
#   shuffles), updates its running max m and sum l (online softmax), rescales and accumulates
#   o += p v. Writes o / l and lse = m + log l. FLOPs 4 B NH T S_vis HS (S_vis: visible keys per
#   query; T/2 causal); bytes q, o: 8 B T NH HS, k, v: 8 B S NKV HS per query block (L2-resident
#   across the blocks of a head). SIMT fp32 (FFMA), not tensor cores: the ceiling is the fp32 rate
#   (~60 TFLOP/s on an H100), so at T = 4096 attention costs about what a layer's bf16 GEMMs do;
#   a bf16 mma version is the next step once this one is verified on a GPU.
# attn_bwd_dq_d{D}: grid (nQt, NH, B), the forward's layout. Each row first forms
#   Dt = sum(dO * O) (written for the dK/dV kernel), then per visible key: s, p = exp(s - lse),
#   dp = dO . v, ds = p (dp - Dt), dq += ds k; dq *= scale. FLOPs 6 B NH T S_vis HS.
# attn_bwd_dkdv_d{D}: grid (nKt, NKV, B), 32 key rows per block, 8 lanes per row holding k, v and
#   the dk, dv accumulators; loops over the G query heads of its KV head and the visible query
#   tiles (Q and dO rows in shared memory): p, dp as above, dv += p dO, dk += ds q; dk *= scale.
#   FLOPs 8 B NH T S_vis HS. Splitting dQ from dK/dV recomputes q.k and dO.v once more (7 products
#   instead of FlashAttention-2's 5) but needs no atomics: every gradient is the same on every run.

ATTN_DIMS = (64, 128, 256)  # head-size instantiations (HS is padded up to the next one)
TILE = 32  # rows and columns of a mask tile; query rows per block of the forward and dq kernels
THREADS = 256


class FlashState(NamedTuple):
    """What the CUDA attention keeps for its backward instead of the probabilities."""

    o: Any  # (B, T, NH, HS) the output (the memory of y)
    lse: Any  # (B, NH, T) log-sum-exp of each query row's scaled, masked scores (-inf: no key visible)
    mask: Any  # (B, T, S) uint8: the bool mask's bytes, on the device
    tiles: Any  # (B, ceil(T/32), ceil(S/32)) uint8: 0 no key visible, 1 all visible, 2 mixed


class FlashAttentionCache(AttentionCache):
    """The CUDA twin's AttentionCache: the same fields, holding qg = q (B, T, NH, HS) as given,
    kt = k (B, S, NKV, HS), vt = v (B, S, NKV, HS), p = FlashState (see there), scale."""

    __slots__ = ()


_CUDA_SOURCE = r"""
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

template <int D>
__device__ __forceinline__ void attn_fwd(const float* __restrict__ q, const float* __restrict__ k,
                                         const float* __restrict__ v, const unsigned char* __restrict__ mask,
                                         const unsigned char* __restrict__ tiles, float* __restrict__ o,
                                         float* __restrict__ lse, int T, int S, int NH, int NKV, int HS,
                                         i64 qbs, i64 kbs, i64 vbs, float scale) {
    constexpr int NC = Cfg<D>::NC, D4 = Cfg<D>::D4, SUB = Cfg<D>::SUB;
    __shared__ float4 Ks[SUB][D4];
    __shared__ float4 Vs[SUB][D4];
    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (NH / NKV);
    const int row = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    const int t = qt * TILE + row;
    const bool valid = t < T;
    const int nQt = (T + TILE - 1) / TILE, nKt = (S + TILE - 1) / TILE;
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
            __syncthreads();
            load_tile<D>(Ks, k + b * kbs + ((i64)s0 * NKV + hk) * HS, (i64)NKV * HS, n_valid, HS);
            load_tile<D>(Vs, v + b * vbs + ((i64)s0 * NKV + hk) * HS, (i64)NKV * HS, n_valid, HS);
            __syncthreads();
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
    if (valid) {
        store_row<NC>(o + (((i64)b * T + t) * NH + h) * HS, HS, lane, acc, l > 0.0f ? 1.0f / l : 0.0f);
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
                                            i64 qbs, i64 kbs, i64 vbs, float scale) {
    constexpr int NC = Cfg<D>::NC, D4 = Cfg<D>::D4, SUB = Cfg<D>::SUB;
    __shared__ float4 Ks[SUB][D4];
    __shared__ float4 Vs[SUB][D4];
    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (NH / NKV);
    const int row = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    const int t = qt * TILE + row;
    const bool valid = t < T;
    const int tt = valid ? t : 0;
    const int nQt = (T + TILE - 1) / TILE, nKt = (S + TILE - 1) / TILE;
    const i64 row_off = (((i64)b * T + tt) * NH + h) * HS;  // o, dout, dq are contiguous (B, T, NH, HS)
    float4 qr[NC], dor[NC], acc[NC];
    load_row<NC>(q + b * qbs + ((i64)tt * NH + h) * HS, HS, lane, valid, qr);
    load_row<NC>(dout + row_off, HS, lane, valid, dor);
    load_row<NC>(o + row_off, HS, lane, valid, acc);
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
            __syncthreads();
            load_tile<D>(Ks, k + b * kbs + ((i64)s0 * NKV + hk) * HS, (i64)NKV * HS, n_valid, HS);
            load_tile<D>(Vs, v + b * vbs + ((i64)s0 * NKV + hk) * HS, (i64)NKV * HS, n_valid, HS);
            __syncthreads();
            for (int j = 0; j < n_valid; ++j) {
                const float sv = dot8<NC>(qr, Ks[j], lane) * scale;
                const float dp = dot8<NC>(dor, Vs[j], lane);
                const bool ok = valid && lt != NEG_INF && (cls == 1 || mrow[s0 + j] != 0);
                const float p = ok ? expf(sv - lt) : 0.0f;
                axpy<NC>(acc, p * (dp - Dt), Ks[j], lane);
            }
        }
    }
    if (valid) store_row<NC>(dq + row_off, HS, lane, acc, scale);
}

template <int D>
__device__ __forceinline__ void attn_bwd_dkdv(const float* __restrict__ q, const float* __restrict__ k,
                                              const float* __restrict__ v, const float* __restrict__ dout,
                                              const float* __restrict__ lse, const float* __restrict__ Dbuf,
                                              const unsigned char* __restrict__ mask,
                                              const unsigned char* __restrict__ tiles, float* __restrict__ dk,
                                              float* __restrict__ dv, int T, int S, int NH, int NKV, int HS,
                                              i64 qbs, i64 kbs, i64 vbs, float scale) {
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
    load_row<NC>(v + b * vbs + ((i64)ss * NKV + hk) * HS, HS, lane, valid, vr);
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
                load_tile<D>(Os, dout + (((i64)b * T + t0) * NH + h) * HS, (i64)NH * HS, n_valid, HS);
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
        store_row<NC>(dv + (((i64)b * S + s) * NKV + hk) * HS, HS, lane, dvr, 1.0f);
    }
}

// MINB: blocks per SM the register allocation aims for. 256-wide heads hold 64 floats of q and o per
// thread: ptxas's own choice for them (128 registers) spilled 96 bytes, a floor of 1 block (154
// registers) spills nothing. The 64 and 128 heads keep ptxas's choice (d64 fwd: 64 registers,
// 20 bytes spilled, 4 blocks per SM; unspilled it needs 96 registers, 2 blocks): to be timed.
#define ATTN_KERNELS(D, MINB)                                                                           \
    extern "C" __global__ void __launch_bounds__(256, MINB) attn_fwd_d##D(                                   \
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,          \
        const unsigned char* __restrict__ mask, const unsigned char* __restrict__ tiles,                \
        float* __restrict__ o, float* __restrict__ lse, int T, int S, int NH, int NKV, int HS, i64 qbs, \
        i64 kbs, i64 vbs, float scale) {                                                                \
        attn_fwd<D>(q, k, v, mask, tiles, o, lse, T, S, NH, NKV, HS, qbs, kbs, vbs, scale);             \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(256, MINB) attn_bwd_dq_d##D(                                \
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,          \
        const float* __restrict__ o, const float* __restrict__ dout, const float* __restrict__ lse,     \
        const unsigned char* __restrict__ mask, const unsigned char* __restrict__ tiles,                \
        float* __restrict__ dq, float* __restrict__ Dbuf, int T, int S, int NH, int NKV, int HS,       \
        i64 qbs, i64 kbs, i64 vbs, float scale) {                                                       \
        attn_bwd_dq<D>(q, k, v, o, dout, lse, mask, tiles, dq, Dbuf, T, S, NH, NKV, HS, qbs, kbs, vbs, \
                       scale);                                                                          \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(256, MINB) attn_bwd_dkdv_d##D(                              \
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,          \
        const float* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Dbuf,  \
        const unsigned char* __restrict__ mask, const unsigned char* __restrict__ tiles,                \
        float* __restrict__ dk, float* __restrict__ dv, int T, int S, int NH, int NKV, int HS, i64 qbs, \
        i64 kbs, i64 vbs, float scale) {                                                                \
        attn_bwd_dkdv<D>(q, k, v, dout, lse, Dbuf, mask, tiles, dk, dv, T, S, NH, NKV, HS, qbs, kbs,   \
                         vbs, scale);                                                                   \
    }

ATTN_KERNELS(64, 0)
ATTN_KERNELS(128, 0)
ATTN_KERNELS(256, 1)
"""

SOURCE = KernelSource(
    name="attention",
    code=_CUDA_SOURCE,
    kernels=("attn_tile_class",)
    + tuple(f"attn_{k}_d{d}" for d in ATTN_DIMS for k in ("fwd", "bwd_dq", "bwd_dkdv")),
)
SOURCES = (SOURCE,)


def _heads(rt: Runtime, a: Any, what: str) -> tuple[Any, int]:
    """(array, batch stride in elements) for a float32 (B, L, H, HS) array whose inner three axes
    are contiguous (a batch stride is kept: the KV cache's views); anything else is copied."""
    a = rt.xp.asarray(a)
    if a.dtype.name != "float32" or a.ndim != 4:
        raise ValueError(f"attention {what} must be float32 (B, L, H, HS), got {a.dtype} {tuple(a.shape)}")
    _, L, H, HS = a.shape
    inner = (L * H * HS * 4, H * HS * 4, HS * 4, 4)
    if tuple(a.strides[1:]) != inner[1:] or a.strides[0] < inner[0] or rt.address(a) % 16:
        a = rt.xp.ascontiguousarray(a)
    return a, int(a.strides[0] // 4)


def head_dim_kernel(HS: int) -> int:
    """The kernels' D for head size HS (ValueError when none fits)."""
    if HS % 4 or HS > ATTN_DIMS[-1] or HS <= 0:
        raise ValueError(f"head size {HS} is not supported by the CUDA attention (a multiple of 4, <= 256)")
    return next(d for d in ATTN_DIMS if d >= HS)


def attention_forward_on(
    rt: Runtime, q: Any, k: Any, v: Any, mask: Any, scale: float, method: str | None = None
):
    """`attention_forward` on a runtime. method: "flash" (these kernels: fp32, SIMT), "gemm" (bf16
    tensor cores, engine/kernels/attention_gemm.py), or None: "gemm" from GEMM_MIN_T queries up
    (training, prefill), else "flash" (decoding)."""
    from . import attention_gemm

    xp = rt.xp
    q, qbs = _heads(rt, q, "queries q")
    k, kbs = _heads(rt, k, "keys k")
    v, vbs = _heads(rt, v, "values v")
    B, T, NH, HS = q.shape
    S, NKV = k.shape[1], k.shape[2]
    if tuple(k.shape) != (B, S, NKV, HS) or tuple(v.shape) != tuple(k.shape) or NKV == 0 or NH % NKV:
        raise ValueError(
            f"attention shapes do not agree: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
            "(k and v (B, S, NKV, HS) with NH a multiple of NKV)"
        )
    mask = xp.asarray(mask)
    if tuple(mask.shape) != (B, T, S) or mask.dtype.itemsize != 1:
        raise ValueError(f"attention mask must be bool ({B}, {T}, {S}), got {mask.dtype} {tuple(mask.shape)}")
    mask_u8 = xp.ascontiguousarray(mask).view(xp.uint8)
    if method is None:
        method = "gemm" if T >= attention_gemm.GEMM_MIN_T and B and S else "flash"
    if method == "gemm":
        return attention_gemm.forward_on(rt, q, k, v, mask_u8, scale, (qbs, kbs, vbs))
    if method != "flash":
        raise ValueError(f"attention method must be 'flash', 'gemm' or None, got {method!r}")
    D = head_dim_kernel(HS)
    nQt, nKt = -(-T // TILE), -(-S // TILE)
    tiles = xp.empty((B, nQt, nKt), dtype=xp.uint8)
    o = xp.empty((B, T, NH, HS), dtype=xp.float32)
    lse = xp.empty((B, NH, T), dtype=xp.float32)
    if B and T and S:
        args = (mask_u8, np.int32(T), np.int32(S), np.int32(nQt), np.int32(nKt), tiles)
        rt.launch(SOURCE, "attn_tile_class", (nKt, nQt, B), (THREADS,), args)
        dims = (np.int32(T), np.int32(S), np.int32(NH), np.int32(NKV), np.int32(HS))
        strides = (np.int64(qbs), np.int64(kbs), np.int64(vbs), np.float32(scale))
        args = (q, k, v, mask_u8, tiles, o, lse, *dims, *strides)
        rt.launch(SOURCE, f"attn_fwd_d{D}", (nQt, NH, B), (THREADS,), args)
    elif o.size:
        o.fill(0)
        lse.fill(-np.inf)
    cache = FlashAttentionCache(q, k, v, FlashState(o, lse, mask_u8, tiles), float(scale))
    return o.reshape(B, T, NH * HS), cache


def attention_backward_on(rt: Runtime, dy: Any, cache: AttentionCache):
    """`attention_backward` on a runtime."""
    from . import attention_gemm

    if isinstance(cache, attention_gemm.GemmAttentionCache):
        return attention_gemm.backward_on(rt, dy, cache)
    xp = rt.xp
    q, k, v, state, scale = cache
    if not isinstance(state, FlashState):
        raise TypeError(
            "attention_backward (CUDA) needs the cache of attention_forward (CUDA), a FlashAttentionCache; "
            f"got {type(cache).__name__} holding {type(state).__name__}"
        )
    B, T, NH, HS = q.shape
    S, NKV = k.shape[1], k.shape[2]
    D = head_dim_kernel(HS)
    qbs, kbs, vbs = (int(a.strides[0] // 4) for a in (q, k, v))
    dout = f32_input(rt, dy, "attention gradient dy")
    if dout.size != B * T * NH * HS:
        raise ValueError(
            f"attention gradient has shape {tuple(dy.shape)}, the output is ({B}, {T}, {NH * HS})"
        )
    dout = dout.reshape(B, T, NH, HS)
    dq = xp.empty((B, T, NH, HS), dtype=xp.float32)
    dk = xp.empty((B, S, NKV, HS), dtype=xp.float32)
    dv = xp.empty((B, S, NKV, HS), dtype=xp.float32)
    Dbuf = xp.empty((B, NH, T), dtype=xp.float32)
    if not (B and T and S):
        for a in (dq, dk, dv):
            a.fill(0)
        return dq, dk, dv
    nQt, nKt = -(-T // TILE), -(-S // TILE)
    dims = (np.int32(T), np.int32(S), np.int32(NH), np.int32(NKV), np.int32(HS))
    strides = (np.int64(qbs), np.int64(kbs), np.int64(vbs), np.float32(scale))
    args = (q, k, v, state.o, dout, state.lse, state.mask, state.tiles, dq, Dbuf, *dims, *strides)
    rt.launch(SOURCE, f"attn_bwd_dq_d{D}", (nQt, NH, B), (THREADS,), args)
    args = (q, k, v, dout, state.lse, Dbuf, state.mask, state.tiles, dk, dv, *dims, *strides)
    rt.launch(SOURCE, f"attn_bwd_dkdv_d{D}", (nKt, NKV, B), (THREADS,), args)
    return dq, dk, dv


def attention_forward(q: Any, k: Any, v: Any, mask: Any, scale: float):
    """CUDA twin of `attention_forward_ref`: y (B, T, NH*HS) and a FlashAttentionCache."""
    return attention_forward_on(runtime_for(q, "attention_forward"), q, k, v, mask, scale)


def attention_backward(dy: Any, cache: AttentionCache):
    """CUDA twin of `attention_backward_ref`: (dq (B, T, NH, HS), dk, dv (B, S, NKV, HS))."""
    return attention_backward_on(runtime_for(dy, "attention_backward"), dy, cache)
