// The output head fused with the loss: ce_stats, ce_finish, ce_grad over vocabulary chunks whose logits
// cuBLAS computes, each logit soft-capped first when cap > 0 (Gemma 3); the soft-cap alone
// (softcap_fwd, softcap_bwd) for inference logits. Host side and design: engine/kernels/cross_entropy.py.

#define NEG_INF __uint_as_float(0xff800000u)
typedef long long i64;
#include "common.cuh"

// z' = cap tanh(z / cap), or z when cap is 0
__device__ __forceinline__ float capped(float z, float cap) { return cap > 0.0f ? cap * tanhf(z / cap) : z; }

// calls f(c, x, xr) for the columns of one row this thread owns (xr: the reference row, or x)
template <class F>
__device__ __forceinline__ void for_cols(const float* __restrict__ row, const float* __restrict__ rrow,
                                         int width, int vec, F f) {
    int c0 = 0;
    if (vec) {
        const int w4 = width / 4;
        for (int c = threadIdx.x; c < w4; c += blockDim.x) {
            const float4 a = ((const float4*)row)[c], b = ((const float4*)rrow)[c];
            f(4 * c, a.x, b.x); f(4 * c + 1, a.y, b.y); f(4 * c + 2, a.z, b.z); f(4 * c + 3, a.w, b.w);
        }
        c0 = 4 * w4;
    }
    for (int c = c0 + threadIdx.x; c < width; c += blockDim.x) f(c, row[c], rrow[c]);
}

// online (max, sum exp) over one thread's values, with the exp-weighted sums of x and of xr
struct Online {
    float m, s, ex, exr;
    __device__ __forceinline__ void init() { m = NEG_INF; s = 0.0f; ex = 0.0f; exr = 0.0f; }
    __device__ __forceinline__ void add(float x, float xr) {
        if (x > m) {
            const float r = expf(m - x);
            s = s * r + 1.0f; ex = ex * r + x; exr = exr * r + xr; m = x;
        } else {
            const float e = expf(x - m);
            s += e; ex += e * x; exr += e * xr;
        }
    }
};

extern "C" __global__ void __launch_bounds__(256)
ce_stats(const float* __restrict__ z, const float* __restrict__ zr, const int* __restrict__ tgt, int width,
         int lo, int vec, int kl, float cap, float* __restrict__ m, float* __restrict__ s,
         float* __restrict__ zt, float* __restrict__ mr, float* __restrict__ sr, float* __restrict__ ez,
         float* __restrict__ ezr) {
    __shared__ float scratch[32];
    const i64 i = blockIdx.x;
    const float* row = z + i * width;
    const float* rrow = kl ? zr + i * width : row;
    Online a, b;  // a: policy logits (with the reference's weighted sum); b: reference logits alone
    a.init();
    b.init();
    for_cols(row, rrow, width, vec, [&](int, float x, float xr) {
        x = capped(x, cap);
        xr = capped(xr, cap);
        a.add(x, xr);
        if (kl) b.add(xr, xr);
    });
    const float M = block_max(a.m, scratch);
    const float f = expf(a.m - M);
    const float S = block_sum(a.s * f, scratch);
    const float EZ = kl ? block_sum(a.ex * f, scratch) : 0.0f;
    const float EZR = kl ? block_sum(a.exr * f, scratch) : 0.0f;
    float MR = NEG_INF, SR = 0.0f;
    if (kl) {
        MR = block_max(b.m, scratch);
        SR = block_sum(b.s * expf(b.m - MR), scratch);
    }
    if (threadIdx.x == 0) {
        const float m0 = m[i], m1 = fmaxf(m0, M);
        const float ra = expf(m0 - m1), rb = expf(M - m1);
        s[i] = s[i] * ra + S * rb;
        if (kl) {
            ez[i] = ez[i] * ra + EZ * rb;
            ezr[i] = ezr[i] * ra + EZR * rb;
            const float q0 = mr[i], q1 = fmaxf(q0, MR);
            sr[i] = sr[i] * expf(q0 - q1) + SR * expf(MR - q1);
            mr[i] = q1;
        }
        m[i] = m1;
        const int c = tgt[i] - lo;
        if (c >= 0 && c < width) zt[i] = capped(row[c], cap);
    }
}

// per row: lse, ce, KL; out[0] = sum w ce + kl_coef sum |w| KL, out[1] = sum ce (float64, fixed order)
extern "C" __global__ void __launch_bounds__(256)
ce_finish(const float* __restrict__ m, const float* __restrict__ s, const float* __restrict__ zt,
          const float* __restrict__ wt, const float* __restrict__ mr, const float* __restrict__ sr,
          const float* __restrict__ ez, const float* __restrict__ ezr, const int* __restrict__ tgt, int n,
          int kl, float kl_coef, float* __restrict__ lse, float* __restrict__ lse_r, float* __restrict__ klv,
          double* __restrict__ out) {
    __shared__ double scratch[32];
    double loss = 0.0, ce_sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float l = m[i] + logf(s[i]);
        const float ce = l - zt[i];
        lse[i] = l;
        if (tgt[i] < 0) continue;  // a padding row (fixed shapes): no loss, no gradient (its weight is 0)
        loss += (double)(wt[i] * ce);
        ce_sum += (double)ce;
        if (kl) {
            const float lr = mr[i] + logf(sr[i]);
            const float k = ez[i] / s[i] - l - ezr[i] / s[i] + lr;
            lse_r[i] = lr;
            klv[i] = k;
            loss += (double)kl_coef * (double)(fabsf(wt[i]) * k);
        }
    }
    loss = block_sum_d(loss, scratch);
    ce_sum = block_sum_d(ce_sum, scratch);
    if (threadIdx.x == 0) {
        out[0] = loss;
        out[1] = ce_sum;
    }
}

// dz = w (p - onehot) (+ kl_coef |w| p (log p - log q - KL)), in place over the chunk's logits; with a
// cap, p and q of the capped logits and dz taken back through the cap: dz (1 - tanh(z / cap)^2)
extern "C" __global__ void __launch_bounds__(256)
ce_grad(float* __restrict__ z, const float* __restrict__ zr, const int* __restrict__ tgt,
        const float* __restrict__ wt, const float* __restrict__ lse, const float* __restrict__ lse_r,
        const float* __restrict__ klv, int width, int lo, int vec, int kl, float kl_coef, float cap) {
    const i64 i = blockIdx.x;
    float* row = z + i * width;
    const float* rrow = kl ? zr + i * width : row;
    const float w = wt[i], l = lse[i];
    const float lr = kl ? lse_r[i] : 0.0f, k = kl ? klv[i] : 0.0f, kw = kl_coef * fabsf(w);
    const int tc = tgt[i] - lo;
    auto grad = [&](int c, float x, float xr) {
        float back = 1.0f;
        if (cap > 0.0f) {
            const float t = tanhf(x / cap);
            x = cap * t;
            xr = capped(xr, cap);
            back = 1.0f - t * t;
        }
        const float logp = x - l;
        const float p = expf(logp);
        float d = p * w;
        if (c == tc) d -= w;
        if (kl) d += kw * p * ((logp - (xr - lr)) - k);
        return d * back;
    };
    int c0 = 0;
    if (vec) {
        const int w4 = width / 4;
        for (int c = threadIdx.x; c < w4; c += blockDim.x) {
            const float4 a = ((const float4*)row)[c], b = ((const float4*)rrow)[c];
            ((float4*)row)[c] = make_float4(grad(4 * c, a.x, b.x), grad(4 * c + 1, a.y, b.y),
                                            grad(4 * c + 2, a.z, b.z), grad(4 * c + 3, a.w, b.w));
        }
        c0 = 4 * w4;
    }
    for (int c = c0 + threadIdx.x; c < width; c += blockDim.x) row[c] = grad(c, row[c], rrow[c]);
}

// y = cap tanh(z / cap), elementwise (grid-stride)
extern "C" __global__ void __launch_bounds__(256)
softcap_fwd(const float* __restrict__ z, float* __restrict__ y, i64 n, float cap) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = cap * tanhf(z[i] / cap);
}

// forward was: y = cap tanh(z / cap); dz = dy (1 - tanh(z / cap)^2), tanh recomputed from z
extern "C" __global__ void __launch_bounds__(256)
softcap_bwd(const float* __restrict__ dy, const float* __restrict__ z, float* __restrict__ dz, i64 n, float cap) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float t = tanhf(z[i] / cap);
        dz[i] = dy[i] * (1.0f - t * t);
    }
}
