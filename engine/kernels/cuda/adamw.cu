// AdamW over every LoRA tensor of a step at once: adamw_norms, adamw_reduce, adamw_update.
// Host side, contract and launch plan: engine/kernels/adamw.py (its CUDA section).

// CHUNK (set by adamw.py, -DCHUNK=...): values per block
typedef unsigned long long u64;
typedef long long i64;
#include "common.cuh"

// per-tensor table: ptrs[4 t + 0..3] = p, g, m, v; coef[3 t + 0..2] = bc2, lr_bc1, lr_wd
// flags[t]: bit 0 decay, bit 1 16-byte aligned (all four arrays and the size a multiple of 4)

__device__ __forceinline__ void chunk_of(const int* chunk_tensor, const i64* chunk_start, const i64* sizes,
                                         int* t, i64* start, i64* end) {
    *t = chunk_tensor[blockIdx.x];
    *start = chunk_start[blockIdx.x];
    *end = min(*start + (i64)CHUNK, sizes[*t]);
}

// a block's float64 sums for the norms of a gradient chunk: of g^2, of clamp(g, -gclip, gclip)^2 and the
// count of |g| > gclip (both only when clip_on); write() adds them over the block and stores the
// block's 3 partials
struct NormSums {
    double all = 0.0, clip = 0.0, out = 0.0;
    __device__ __forceinline__ void add(float x, float gclip_f, double gclip_d, int clip_on) {
        const double xd = (double)x;
        all += xd * xd;
        if (clip_on) {
            const double c = (double)fminf(fmaxf(x, -gclip_f), gclip_f);
            clip += c * c;
            out += (xd > gclip_d || xd < -gclip_d) ? 1.0 : 0.0;
        }
    }
    __device__ __forceinline__ void write(double* scratch, double* __restrict__ partials) {
        all = block_sum_d(all, scratch);
        clip = block_sum_d(clip, scratch);
        out = block_sum_d(out, scratch);
        if (threadIdx.x == 0) {
            partials[3 * (i64)blockIdx.x + 0] = all;
            partials[3 * (i64)blockIdx.x + 1] = clip;
            partials[3 * (i64)blockIdx.x + 2] = out;
        }
    }
};

extern "C" __global__ void __launch_bounds__(256)
adamw_norms(const u64* __restrict__ ptrs, const i64* __restrict__ sizes, const int* __restrict__ chunk_tensor,
            const i64* __restrict__ chunk_start, float gclip_f, double gclip_d, int clip_on,
            double* __restrict__ partials) {
    __shared__ double scratch[32];
    int t;
    i64 start, end;
    chunk_of(chunk_tensor, chunk_start, sizes, &t, &start, &end);
    const float* g = (const float*)ptrs[4 * t + 1];
    NormSums sums;
    for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) sums.add(g[i], gclip_f, gclip_d, clip_on);
    sums.write(scratch, partials);
}

// out[c] = sum over rows r of partials[r * k + c], c < k; one block
extern "C" __global__ void __launch_bounds__(256)
adamw_reduce(const double* __restrict__ partials, int n_rows, int k, double* __restrict__ out) {
    __shared__ double scratch[32];
    for (int c = 0; c < k; ++c) {
        double s = 0.0;
        for (int r = threadIdx.x; r < n_rows; r += blockDim.x) s += partials[(i64)r * k + c];
        s = block_sum_d(s, scratch);
        if (threadIdx.x == 0) out[c] = s;
    }
}

struct Hyper {
    float b1, omb1, b2, omb2, eps, gclip, scale;
    int clip_on, scale_on;
};

__device__ __forceinline__ void adam1(float& p, float g, float& m, float& v, float bc2, float lr_bc1,
                                      float lr_wd, int decay, const Hyper& h, double& su, double& sp) {
    if (h.clip_on) g = fminf(fmaxf(g, -h.gclip), h.gclip);
    if (h.scale_on) g = __fmul_rn(g, h.scale);
    m = __fadd_rn(__fmul_rn(m, h.b1), __fmul_rn(g, h.omb1));
    v = __fadd_rn(__fmul_rn(v, h.b2), __fmul_rn(__fmul_rn(g, g), h.omb2));
    float tmp = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bc2), h.eps);
    tmp = __fmul_rn(__fdiv_rn(m, tmp), lr_bc1);
    const float delta = decay ? __fadd_rn(__fmul_rn(p, lr_wd), tmp) : tmp;
    p = __fsub_rn(p, delta);
    su += (double)delta * (double)delta;
    sp += (double)p * (double)p;
}

extern "C" __global__ void __launch_bounds__(256)
adamw_update(const u64* __restrict__ ptrs, const i64* __restrict__ sizes, const float* __restrict__ coef,
             const int* __restrict__ flags, const int* __restrict__ chunk_tensor,
             const i64* __restrict__ chunk_start, float b1, float omb1, float b2, float omb2, float eps,
             float gclip, int clip_on, float scale, int scale_on, double* __restrict__ partials) {
    __shared__ double scratch[32];
    int t;
    i64 start, end;
    chunk_of(chunk_tensor, chunk_start, sizes, &t, &start, &end);
    float* p = (float*)ptrs[4 * t + 0];
    const float* g = (const float*)ptrs[4 * t + 1];
    float* m = (float*)ptrs[4 * t + 2];
    float* v = (float*)ptrs[4 * t + 3];
    const float bc2 = coef[3 * t], lr_bc1 = coef[3 * t + 1], lr_wd = coef[3 * t + 2];
    const int decay = flags[t] & 1, vec = (flags[t] >> 1) & 1;
    Hyper h;
    h.b1 = b1; h.omb1 = omb1; h.b2 = b2; h.omb2 = omb2; h.eps = eps; h.gclip = gclip; h.scale = scale;
    h.clip_on = clip_on; h.scale_on = scale_on;
    double su = 0.0, sp = 0.0;
    if (vec) {  // start is a multiple of CHUNK, so of 4; end - start a multiple of 4
        for (i64 i = start + 4 * threadIdx.x; i < end; i += 4 * blockDim.x) {
            float4 P = *(float4*)(p + i), M = *(float4*)(m + i), W = *(float4*)(v + i);
            const float4 G = *(const float4*)(g + i);
            adam1(P.x, G.x, M.x, W.x, bc2, lr_bc1, lr_wd, decay, h, su, sp);
            adam1(P.y, G.y, M.y, W.y, bc2, lr_bc1, lr_wd, decay, h, su, sp);
            adam1(P.z, G.z, M.z, W.z, bc2, lr_bc1, lr_wd, decay, h, su, sp);
            adam1(P.w, G.w, M.w, W.w, bc2, lr_bc1, lr_wd, decay, h, su, sp);
            *(float4*)(p + i) = P;
            *(float4*)(m + i) = M;
            *(float4*)(v + i) = W;
        }
    } else {
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x)
            adam1(p[i], g[i], m[i], v[i], bc2, lr_bc1, lr_wd, decay, h, su, sp);
    }
    su = block_sum_d(su, scratch);
    sp = block_sum_d(sp, scratch);
    if (threadIdx.x == 0) {
        partials[2 * (i64)blockIdx.x + 0] = su;
        partials[2 * (i64)blockIdx.x + 1] = sp;
    }
}

// ---- the fused step's AdamW: every decision on the device ----------------------------------------
// Per tensor: ptrs[5 t + 0..4] = p, g, m, v, shadow (bf16 bits of the new p for the GEMMs, or 0);
// dims[4 t + 0..3] = size, cols, g_ld (row stride of g), s_ld (row stride of the shadow): value i of
// the tensor is p[i], m[i], v[i], g[(i / cols) g_ld + i % cols], shadow[(i / cols) s_ld + i % cols].
// stats (float64): 0 loss, 1 ce_sum, 2 grad sumsq, 3 clipped, 4 skipped, 5 update sumsq,
// 6 param sumsq, 7 max |p|, 8 non-finite params, 9 clip scale.

__device__ __forceinline__ i64 at(i64 i, i64 cols, i64 ld) { return (i / cols) * ld + i % cols; }

extern "C" __global__ void __launch_bounds__(256)
adamw_norms_dev(const u64* __restrict__ ptrs, const i64* __restrict__ dims, const int* __restrict__ chunk_tensor,
                const i64* __restrict__ chunk_start, float gclip_f, double gclip_d, int clip_on,
                double* __restrict__ partials) {
    __shared__ double scratch[32];
    const int t = chunk_tensor[blockIdx.x];
    const i64 start = chunk_start[blockIdx.x], end = min(start + (i64)CHUNK, dims[4 * t]);
    const i64 cols = dims[4 * t + 1], ld = dims[4 * t + 2];
    const float* g = (const float*)ptrs[5 * t + 1];
    NormSums sums;
    for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) sums.add(g[at(i, cols, ld)], gclip_f, gclip_d, clip_on);
    sums.write(scratch, partials);
}

// one block: the norms (as adamw_reduce adds them), the global-norm clip's scale, whether the step
// is skipped (a non-finite gradient norm or loss): what the host decided before, read by nobody here
extern "C" __global__ void __launch_bounds__(256)
adamw_decide(const double* __restrict__ partials, int n_rows, int clip_on, double max_grad_norm,
             double* __restrict__ stats) {
    __shared__ double scratch[32];
    double s[3];
    for (int c = 0; c < 3; ++c) {
        double a = 0.0;
        for (int r = threadIdx.x; r < n_rows; r += blockDim.x) a += partials[(i64)r * 3 + c];
        s[c] = block_sum_d(a, scratch);
    }
    if (threadIdx.x == 0) {
        const double gn = sqrt(s[0]);
        const double norm = clip_on ? sqrt(s[1]) : gn;
        const double scale = (max_grad_norm > 0.0 && norm > max_grad_norm) ? max_grad_norm / norm : 1.0;
        const double loss = stats[0];
        const int skip = !(gn - gn == 0.0) || !(loss - loss == 0.0);  // inf or nan
        stats[2] = s[0];
        stats[3] = ((clip_on && s[2] > 0.0) || scale != 1.0) && !skip ? 1.0 : 0.0;
        stats[4] = skip ? 1.0 : 0.0;
        stats[9] = scale;
    }
}

extern "C" __global__ void __launch_bounds__(256)
adamw_update_dev(const u64* __restrict__ ptrs, const i64* __restrict__ dims, const float* __restrict__ coef,
                 const int* __restrict__ flags, const int* __restrict__ chunk_tensor,
                 const i64* __restrict__ chunk_start, float b1, float omb1, float b2, float omb2, float eps,
                 float gclip, int clip_on, const double* __restrict__ stats, int shadow_only,
                 double* __restrict__ partials) {
    __shared__ double scratch[32];
    const int t = chunk_tensor[blockIdx.x];
    const i64 start = chunk_start[blockIdx.x], end = min(start + (i64)CHUNK, dims[4 * t]);
    const i64 cols = dims[4 * t + 1], ld = dims[4 * t + 2], sld = dims[4 * t + 3];
    float* p = (float*)ptrs[5 * t + 0];
    const float* g = (const float*)ptrs[5 * t + 1];
    float* m = (float*)ptrs[5 * t + 2];
    float* v = (float*)ptrs[5 * t + 3];
    unsigned short* sh = (unsigned short*)ptrs[5 * t + 4];
    const float bc2 = coef[3 * t], lr_bc1 = coef[3 * t + 1], lr_wd = coef[3 * t + 2];
    const int decay = flags[t] & 1;
    const double scale = stats ? stats[9] : 1.0;
    const int skip = shadow_only || (stats && stats[4] != 0.0);
    Hyper h;
    h.b1 = b1; h.omb1 = omb1; h.b2 = b2; h.omb2 = omb2; h.eps = eps; h.gclip = gclip;
    h.scale = (float)scale;
    h.clip_on = clip_on; h.scale_on = scale != 1.0;
    double su = 0.0, sp = 0.0, pmax = 0.0, bad = 0.0;
    for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) {
        float P = p[i];
        if (!skip) {
            float M = m[i], W = v[i];
            adam1(P, g[at(i, cols, ld)], M, W, bc2, lr_bc1, lr_wd, decay, h, su, sp);
            p[i] = P;
            m[i] = M;
            v[i] = W;
        } else {
            sp += (double)P * (double)P;
        }
        if (sh) sh[at(i, cols, sld)] = f32_to_bf16_bits(P);
        const float a = fabsf(P);
        if (a - a != 0.0f) bad += 1.0;
        else pmax = fmax(pmax, (double)a);
    }
    su = block_sum_d(su, scratch);
    sp = block_sum_d(sp, scratch);
    bad = block_sum_d(bad, scratch);
    // block max through the shared scratch (no float max helper for doubles)
    for (int o = 16; o > 0; o >>= 1) pmax = fmax(pmax, __shfl_xor_sync(0xffffffffu, pmax, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = pmax;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) pmax = fmax(pmax, scratch[w]);
        partials[4 * (i64)blockIdx.x + 0] = su;
        partials[4 * (i64)blockIdx.x + 1] = sp;
        partials[4 * (i64)blockIdx.x + 2] = pmax;
        partials[4 * (i64)blockIdx.x + 3] = bad;
    }
}

// one block: the update's and the params' sums of squares, max |p| and the non-finite count into stats
extern "C" __global__ void __launch_bounds__(256)
adamw_finish(const double* __restrict__ partials, int n_rows, double* __restrict__ stats) {
    __shared__ double scratch[32];
    double s[4];
    for (int c = 0; c < 4; ++c) {
        double a = 0.0;
        for (int r = threadIdx.x; r < n_rows; r += blockDim.x) {
            const double x = partials[(i64)r * 4 + c];
            a = c == 2 ? fmax(a, x) : a + x;
        }
        if (c == 2) {
            for (int o = 16; o > 0; o >>= 1) a = fmax(a, __shfl_xor_sync(0xffffffffu, a, o));
            __syncthreads();
            if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = a;
            __syncthreads();
            if (threadIdx.x == 0)
                for (int w = 1; w < (int)(blockDim.x >> 5); ++w) a = fmax(a, scratch[w]);
            s[c] = a;
        } else {
            s[c] = block_sum_d(a, scratch);
        }
    }
    if (threadIdx.x == 0) {
        stats[5] = s[0];
        stats[6] = s[1];
        stats[7] = s[2];
        stats[8] = s[3];
    }
}
