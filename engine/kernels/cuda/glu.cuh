// The gated activations h = act(g, u) and their derivatives, as engine/kernels/glu.py's reference
// writes them: SwiGLU (silu), GEGLU (gelu, ggml's fp16 table or the exact tanh form) and gpt-oss's
// clamped SwiGLU (swiglu_oai). glu.cu's elementwise kernels and moe.cu's fused expert epilogues
// include this file, so each kind's arithmetic is written once.

#ifndef GLU_CUH
#define GLU_CUH

#define ACT_SILU 0
#define ACT_GELU 1
#define ACT_OAI 2
#define OAI_ALPHA 1.702f
#define OAI_LIMIT 7.0f
#define GELU_COEF_A 0.044715f
#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_TABLE_LIMIT 10.0f

__device__ __forceinline__ float sigmoid_f(float g) { return 1.0f / (1.0f + expf(-g)); }
__device__ __forceinline__ float silu_f(float g) { return g / (1.0f + expf(-g)); }

// float32 -> fp16 bit pattern, round to nearest even (subnormals included; |x| past 65520 is inf)
__device__ __forceinline__ unsigned f32_to_f16_bits(float f) {
    const unsigned x = __float_as_uint(f);
    const unsigned sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u;  // NaN
    if (ax >= 0x477ff000u) return sign | 0x7c00u;  // rounds past the largest half (65504): inf
    if (ax < 0x38800000u)  // below 2^-14: a subnormal half, m 2^-24 (the scaling is exact)
        return sign | (unsigned)rintf(__uint_as_float(ax) * 16777216.0f);
    const unsigned m = ax & 0x7fffffu;
    unsigned h = (((ax >> 23) - 112u) << 10) | (m >> 13);
    const unsigned rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1u;  // a carry into the exponent is right
    return sign | h;
}

__device__ __forceinline__ float gelu_tanh_f(float x) {
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
}
__device__ __forceinline__ float gelu_tanh_grad_f(float x) {
    const float t = tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x));
    const float dinner = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_COEF_A * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
}
// gelu(g): through ggml's table (float32 values of fp16 results, indexed by fp16(g)), or exact (table null)
__device__ __forceinline__ float gelu_f(float g, const float* __restrict__ table) {
    if (!table) return gelu_tanh_f(g);
    if (g <= -GELU_TABLE_LIMIT) return 0.0f;
    if (g >= GELU_TABLE_LIMIT) return g;
    return __ldg(table + f32_to_f16_bits(g));
}

// h = act(g, u)
__device__ __forceinline__ float glu_f(int act, float g, float u, const float* __restrict__ table) {
    if (act == ACT_SILU) return silu_f(g) * u;
    if (act == ACT_GELU) return gelu_f(g, table) * u;
    const float gc = fminf(g, OAI_LIMIT), uc = fminf(fmaxf(u, -OAI_LIMIT), OAI_LIMIT);
    const float s = 1.0f / (1.0f + expf(-OAI_ALPHA * gc));
    return gc * s * (uc + 1.0f);
}

// (dg, du) of h = act(g, u) for the gradient dh, by value: no stack
__device__ __forceinline__ float2 glu_back_f(int act, float dh, float g, float u,
                                             const float* __restrict__ table) {
    if (act == ACT_SILU) {
        const float sig = sigmoid_f(g);
        return make_float2(dh * u * (sig * (1.0f + g * (1.0f - sig))), dh * silu_f(g));
    }
    if (act == ACT_GELU) return make_float2(dh * u * gelu_tanh_grad_f(g), dh * gelu_f(g, table));
    const float gc = fminf(g, OAI_LIMIT), uc = fminf(fmaxf(u, -OAI_LIMIT), OAI_LIMIT);
    const float s = 1.0f / (1.0f + expf(-OAI_ALPHA * gc));
    const float dgc = dh * (uc + 1.0f) * (s + OAI_ALPHA * gc * s * (1.0f - s));
    return make_float2(g < OAI_LIMIT ? dgc : 0.0f, fabsf(u) < OAI_LIMIT ? dh * gc * s : 0.0f);
}

#endif
