// The tensor-core attention's elementwise kernels (bf16 pack, softmax, its backward, rowdot); cuBLAS
// runs the products. Host side and design: engine/kernels/attention_gemm.py.

typedef long long i64;
#include "common.cuh"

// x (B, L, H, HS) float32, inner three axes contiguous, batch stride bs -> y (B, H, L, HS) bf16
extern "C" __global__ void __launch_bounds__(256)
attg_pack(const float* __restrict__ x, unsigned short* __restrict__ y, i64 bs, int L, int H, int HS,
          i64 n) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int d = (int)(i % HS);
        i64 r = i / HS;
        const int l = (int)(r % L);
        r /= L;
        const int h = (int)(r % H);
        const i64 b = r / H;
        y[i] = f32_to_bf16_bits(x[b * bs + ((i64)l * H + h) * HS + d]);
    }
}

// One block per score row of the chunk: row r is global row g = row0 + r = (b NH + h) T + t; its S
// scaled scores z (fp32) -> P = softmax over the keys the mask shows (bf16, 0 elsewhere) and
// lse[g] = max + log(sum); a row that sees no key gets P = 0 and lse = -inf.
extern "C" __global__ void __launch_bounds__(256)
attg_softmax(const float* __restrict__ z, const unsigned char* __restrict__ mask,
             unsigned short* __restrict__ p, float* __restrict__ lse, i64 row0, int T, int S, int NH) {
    __shared__ float scratch[32];
    const i64 r = blockIdx.x, g = row0 + r;
    const i64 t = g % T, b = g / ((i64)T * NH);
    const float* zr = z + r * S;
    const unsigned char* mr = mask + (b * T + t) * S;
    unsigned short* pr = p + r * S;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < S; s += blockDim.x)
        if (mr[s]) mx = fmaxf(mx, zr[s]);
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    if (mx != -INFINITY)
        for (int s = threadIdx.x; s < S; s += blockDim.x)
            if (mr[s]) sum += expf(zr[s] - mx);
    sum = block_sum(sum, scratch);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int s = threadIdx.x; s < S; s += blockDim.x)
        pr[s] = f32_to_bf16_bits(mr[s] ? expf(zr[s] - mx) * inv : 0.0f);
    if (threadIdx.x == 0) lse[g] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
}

// Elementwise over the chunk's n = rows * S scores: P = exp(z - lse) where the mask shows the key,
// dS = P (dP - D) scale; both written as bf16 (the operands of the dV, dK and dQ products).
extern "C" __global__ void __launch_bounds__(256)
attg_softmax_back(const float* __restrict__ z, const float* __restrict__ dp,
                  const unsigned char* __restrict__ mask, const float* __restrict__ lse,
                  const float* __restrict__ Drow, unsigned short* __restrict__ p,
                  unsigned short* __restrict__ ds, i64 row0, i64 n, int T, int S, int NH, float scale) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const i64 r = i / S, s = i % S, g = row0 + r;
        const i64 t = g % T, b = g / ((i64)T * NH);
        const float pv = mask[(b * T + t) * S + s] ? expf(z[i] - lse[g]) : 0.0f;
        p[i] = f32_to_bf16_bits(pv);
        ds[i] = f32_to_bf16_bits(pv * (dp[i] - Drow[g]) * scale);
    }
}

// D[(b NH + h) T + t] = sum_d dO[b, t, h, d] O[b, t, h, d]: one warp per (b, t, h) row
extern "C" __global__ void __launch_bounds__(256)
attg_rowdot(const float* __restrict__ dout, const float* __restrict__ o, float* __restrict__ Drow,
            i64 rows, int T, int NH, int HS) {
    const i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= rows) return;  // the whole warp leaves together
    const float* a = dout + w * HS;
    const float* c = o + w * HS;
    float acc = 0.0f;
    for (int d = lane; d < HS; d += 32) acc += a[d] * c[d];
    acc = warp_sum(acc);
    const i64 h = w % NH, bt = w / NH, t = bt % T, b = bt / T;
    if (lane == 0) Drow[(b * NH + h) * T + t] = acc;
}
