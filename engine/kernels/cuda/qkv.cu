// The attention input of the fused step: q, k, v from one projection's output, with the bias, the
// per-head q/k RMSNorm (qwen3) and RoPE (norm or neox) in one pass; and its backward.
// Host side, reference and layout: engine/kernels/qkv.py.

typedef long long i64;
#include "common.cuh"

// rows of one head: r = n * H + j over N tokens and H = NH + 2 NKV heads (q heads, then k, then v);
// one warp per row, 8 rows per block of 256; the row goes through shared memory (HS <= 256) so that
// each lane can read the partner of its rotation pair
#define ROWS 8

struct Head {
    int kind;  // 0 q, 1 k, 2 v
    int col;   // first column of the head in the projection's output
};
__device__ __forceinline__ Head head_of(int j, int NH, int NKV, int HS) {
    Head h;
    h.kind = j < NH ? 0 : (j < NH + NKV ? 1 : 2);
    h.col = j * HS;
    return h;
}

// y = rope(theta) x over the first 2 half dims (sign -1: the inverse rotation), in shared memory
__device__ __forceinline__ float rope_at(const float* row, int d, int half, int neox, float c, float s) {
    // c, s: cos and sin of the pair d belongs to
    if (neox) {
        if (d < half) return row[d] * c - row[d + half] * s;
        return row[d - half] * s + row[d] * c;
    }
    if ((d & 1) == 0) return row[d] * c - row[d + 1] * s;
    return row[d - 1] * s + row[d] * c;
}
__device__ __forceinline__ int pair_of(int d, int half, int neox) { return neox ? (d < half ? d : d - half) : d >> 1; }

extern "C" __global__ void __launch_bounds__(256)
qkv_rope_fwd(const unsigned short* __restrict__ qkv, i64 ld, const float* __restrict__ bias,
             const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ cosv,
             const float* __restrict__ sinv, float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
             i64 N, int NH, int NKV, int HS, int half, int neox, float eps) {
    __shared__ float buf[ROWS][256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int H = NH + 2 * NKV;
    const i64 r = (i64)blockIdx.x * ROWS + warp;
    if (r >= N * H) return;  // a whole warp leaves together
    const i64 n = r / H;
    const int j = (int)(r % H);
    const Head hd = head_of(j, NH, NKV, HS);
    float* row = buf[warp];
    float ss = 0.0f;
    for (int d = lane; d < HS; d += 32) {
        float z = bf16_bits_to_f32(qkv[n * ld + hd.col + d]);
        if (bias) z += bias[hd.col + d];
        row[d] = z;
        ss += z * z;
    }
    const float* nw = hd.kind == 0 ? qn : (hd.kind == 1 ? kn : nullptr);
    if (nw) {
        const float rs = 1.0f / sqrtf(warp_sum(ss) / (float)HS + eps);
        for (int d = lane; d < HS; d += 32) row[d] = (row[d] * rs) * nw[d];
    }
    __syncwarp();
    float* dst;
    if (hd.kind == 0) dst = q + (n * NH + j) * HS;
    else if (hd.kind == 1) dst = k + (n * NKV + (j - NH)) * HS;
    else dst = v + (n * NKV + (j - NH - NKV)) * HS;
    for (int d = lane; d < HS; d += 32) {
        float y = row[d];
        if (hd.kind < 2 && d < 2 * half) {
            const int p = pair_of(d, half, neox);
            y = rope_at(row, d, half, neox, cosv[n * half + p], sinv[n * half + p]);
        }
        dst[d] = y;
    }
}

// backward: dz (bf16 bits, row stride ld_out) of the projection's q, k, v columns from dq, dk, dv;
// forward was z = qkv + bias, y = rmsnorm_head(z) w (q, k; when the norm is there), out = rope(y)
extern "C" __global__ void __launch_bounds__(256)
qkv_rope_bwd(const float* __restrict__ dq, const float* __restrict__ dk, const float* __restrict__ dv,
             const unsigned short* __restrict__ qkv, i64 ld, const float* __restrict__ bias,
             const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ cosv,
             const float* __restrict__ sinv, unsigned short* __restrict__ dz, i64 ld_out, i64 N, int NH,
             int NKV, int HS, int half, int neox, float eps) {
    __shared__ float buf[ROWS][256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int H = NH + 2 * NKV;
    const i64 r = (i64)blockIdx.x * ROWS + warp;
    if (r >= N * H) return;
    const i64 n = r / H;
    const int j = (int)(r % H);
    const Head hd = head_of(j, NH, NKV, HS);
    const float* src;
    if (hd.kind == 0) src = dq + (n * NH + j) * HS;
    else if (hd.kind == 1) src = dk + (n * NKV + (j - NH)) * HS;
    else src = dv + (n * NKV + (j - NH - NKV)) * HS;
    float* row = buf[warp];
    for (int d = lane; d < HS; d += 32) row[d] = src[d];
    __syncwarp();
    float g[8];  // dy of this lane's dims (HS <= 256: at most 8 per lane)
    int m = 0;
    for (int d = lane; d < HS; d += 32, ++m) {
        float y = row[d];
        if (hd.kind < 2 && d < 2 * half) {
            const int p = pair_of(d, half, neox);
            y = rope_at(row, d, half, neox, cosv[n * half + p], -sinv[n * half + p]);
        }
        g[m] = y;
    }
    const float* nw = hd.kind == 0 ? qn : (hd.kind == 1 ? kn : nullptr);
    if (nw) {
        // dx = rstd (dy w - xn mean(dy w xn)), xn = z rstd
        float z[8], ss = 0.0f;
        m = 0;
        for (int d = lane; d < HS; d += 32, ++m) {
            z[m] = bf16_bits_to_f32(qkv[n * ld + hd.col + d]);
            if (bias) z[m] += bias[hd.col + d];
            ss += z[m] * z[m];
        }
        const float rs = 1.0f / sqrtf(warp_sum(ss) / (float)HS + eps);
        float dot = 0.0f;
        m = 0;
        for (int d = lane; d < HS; d += 32, ++m) dot += (g[m] * nw[d]) * (z[m] * rs);
        const float mean = warp_sum(dot) / (float)HS;
        m = 0;
        for (int d = lane; d < HS; d += 32, ++m) g[m] = rs * (g[m] * nw[d] - (z[m] * rs) * mean);
    }
    m = 0;
    for (int d = lane; d < HS; d += 32, ++m) dz[n * ld_out + hd.col + d] = f32_to_bf16_bits(g[m]);
}
