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
// lse[g] = max + log(sum); a row that sees no key gets P = 0 and lse = -inf. With sinks (per-head
// logits, or null), head h's softmax has one more logit sinks[h] whose value is zero: it joins the
// max and the sum (so lse counts it), and takes its share of the probability from the keys.
extern "C" __global__ void __launch_bounds__(256)
attg_softmax(const float* __restrict__ z, const unsigned char* __restrict__ mask,
             const float* __restrict__ sinks, unsigned short* __restrict__ p, float* __restrict__ lse,
             i64 row0, int T, int S, int NH) {
    __shared__ float scratch[32];
    const i64 r = blockIdx.x, g = row0 + r;
    const i64 t = g % T, b = g / ((i64)T * NH);
    const int h = (int)((g / T) % NH);
    const float* zr = z + r * S;
    const unsigned char* mr = mask + (b * T + t) * S;
    unsigned short* pr = p + r * S;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < S; s += blockDim.x)
        if (mr[s]) mx = fmaxf(mx, zr[s]);
    mx = block_max(mx, scratch);
    if (sinks) mx = fmaxf(mx, sinks[h]);
    float sum = 0.0f;
    if (mx != -INFINITY)
        for (int s = threadIdx.x; s < S; s += blockDim.x)
            if (mr[s]) sum += expf(zr[s] - mx);
    sum = block_sum(sum, scratch);
    if (sinks) sum += expf(sinks[h] - mx);
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

// dsinks[h] = -sum over (b, t) of exp(sinks[h] - lse[b, h, t]) D[b, h, t]: the gradient of a sink logit
// whose value is zero (a row's sink probability times -rowsum(dO * O)). One block per head, a fixed-order
// sum over its B T rows: deterministic.
extern "C" __global__ void __launch_bounds__(256)
attn_sink_grad(const float* __restrict__ sinks, const float* __restrict__ lse, const float* __restrict__ D,
               int B, int NH, int T, float* __restrict__ dsinks) {
    __shared__ float scratch[32];
    const int h = blockIdx.x;
    const float sk = sinks[h];
    float acc = 0.0f;
    for (i64 i = threadIdx.x; i < (i64)B * T; i += blockDim.x) {
        const i64 b = i / T, t = i % T, row = (b * NH + h) * T + t;
        acc -= expf(sk - lse[row]) * D[row];
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) dsinks[h] = acc;
}
