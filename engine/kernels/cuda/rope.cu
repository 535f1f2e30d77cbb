// Rotary position embedding, norm and neox styles, 16-byte and scalar variants (forward, and the
// backward as a rotation by -theta). Host side and design: engine/kernels/rope.py.

template <int P>
__device__ __forceinline__ void rope_body(const float* __restrict__ x, const float* __restrict__ cosv,
                                          const float* __restrict__ sinv, float* __restrict__ y,
                                          long long n_rows, int H, int HS, int half, int neox, float sign) {
    // P: values rotated per unit (neox: 4 or 1; norm: pairs 2 or 1); pass-through dims go V at a time
    constexpr int V = P == 1 ? 1 : 4;
    const int n_rot = 2 * half;
    const int rot_units = half / P;
    const int units = rot_units + (HS - n_rot) / V;
    const long long total = n_rows * units;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long it = (long long)blockIdx.x * blockDim.x + threadIdx.x; it < total; it += stride) {
        const long long row = it / units;
        const int k = (int)(it - row * units);
        const long long tok = row / H;
        const float* xr = x + row * HS;
        float* yr = y + row * HS;
        if (k < rot_units) {
            const int i0 = k * P;  // first pair index
            float c[P], s[P];
#pragma unroll
            for (int p = 0; p < P; ++p) {
                c[p] = cosv[tok * half + i0 + p];
                s[p] = sign * sinv[tok * half + i0 + p];
            }
            if (neox) {
                float a[P], b[P], ya[P], yb[P];
                if (P == 4) {
                    const float4 A = *(const float4*)(xr + i0), Bv = *(const float4*)(xr + i0 + half);
                    a[0] = A.x; a[1] = A.y; a[2 % P] = A.z; a[3 % P] = A.w;
                    b[0] = Bv.x; b[1] = Bv.y; b[2 % P] = Bv.z; b[3 % P] = Bv.w;
                } else {
#pragma unroll
                    for (int p = 0; p < P; ++p) { a[p] = xr[i0 + p]; b[p] = xr[i0 + half + p]; }
                }
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    ya[p] = a[p] * c[p] - b[p] * s[p];
                    yb[p] = a[p] * s[p] + b[p] * c[p];
                }
                if (P == 4) {
                    *(float4*)(yr + i0) = make_float4(ya[0], ya[1], ya[2 % P], ya[3 % P]);
                    *(float4*)(yr + i0 + half) = make_float4(yb[0], yb[1], yb[2 % P], yb[3 % P]);
                } else {
#pragma unroll
                    for (int p = 0; p < P; ++p) { yr[i0 + p] = ya[p]; yr[i0 + half + p] = yb[p]; }
                }
            } else {
                float v[2 * P], o[2 * P];
                if (P == 2) {
                    const float4 A = *(const float4*)(xr + 2 * i0);
                    v[0] = A.x; v[1] = A.y; v[2 % (2 * P)] = A.z; v[3 % (2 * P)] = A.w;
                } else {
#pragma unroll
                    for (int e = 0; e < 2 * P; ++e) v[e] = xr[2 * i0 + e];
                }
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    o[2 * p] = v[2 * p] * c[p] - v[2 * p + 1] * s[p];
                    o[2 * p + 1] = v[2 * p] * s[p] + v[2 * p + 1] * c[p];
                }
                if (P == 2) {
                    *(float4*)(yr + 2 * i0) = make_float4(o[0], o[1], o[2 % (2 * P)], o[3 % (2 * P)]);
                } else {
#pragma unroll
                    for (int e = 0; e < 2 * P; ++e) yr[2 * i0 + e] = o[e];
                }
            }
        } else {
            const int d = n_rot + (k - rot_units) * V;
            if (V == 4) {
                *(float4*)(yr + d) = *(const float4*)(xr + d);
            } else {
                yr[d] = xr[d];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
rope_v4(const float* __restrict__ x, const float* __restrict__ cosv, const float* __restrict__ sinv,
        float* __restrict__ y, long long n_rows, int H, int HS, int half, int neox, float sign) {
    if (neox) rope_body<4>(x, cosv, sinv, y, n_rows, H, HS, half, 1, sign);
    else rope_body<2>(x, cosv, sinv, y, n_rows, H, HS, half, 0, sign);
}

extern "C" __global__ void __launch_bounds__(256)
rope_v1(const float* __restrict__ x, const float* __restrict__ cosv, const float* __restrict__ sinv,
        float* __restrict__ y, long long n_rows, int H, int HS, int half, int neox, float sign) {
    rope_body<1>(x, cosv, sinv, y, n_rows, H, HS, half, neox, sign);
}
