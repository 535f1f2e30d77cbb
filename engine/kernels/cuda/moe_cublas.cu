// The cuBLAS route of the MoE expert GEMMs: the tile plan, the gather of rows into a padded tile layout
// (every expert's rows start a fresh MC_TILE-row tile, padding rows are zeros), and the epilogues that
// bring cuBLAS's padded fp32 products back to sorted rows or to pair order, with the expert biases and the
// gated activation (cuda/glu.cuh). The products themselves are one pointer-array batched cuBLAS call per
// weight (Runtime.gemm_indexed). Host side: engine/kernels/moe_cublas.py.

#include <cuda_bf16.h>
#include "glu.cuh"
#include "moe_tiles.cuh"

// set by moe_cublas.py (-D): MC_THREADS, MC_TILE (rows per tile)

__device__ __forceinline__ u16 mc_bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

// mc_plan: tile t's expert, first sorted row and row count (tiles past the last: expert 0, 0 rows, so
// their product reads expert 0's weights against zero rows). Launch: grid T (the row-tile bound), MC_THREADS.
extern "C" __global__ void __launch_bounds__(MC_THREADS)
mc_plan(const int* __restrict__ offsets, int E, int* __restrict__ tile_e, int* __restrict__ tile_p0,
        int* __restrict__ tile_rows) {
    __shared__ int s_scan[MC_THREADS];
    __shared__ int s_found[3];
    TileRows tr;
    const bool live = find_tile<MC_THREADS>(offsets, E, MC_TILE, blockIdx.x, s_scan, s_found, tr);
    if (threadIdx.x == 0) {
        tile_e[blockIdx.x] = live ? tr.e : 0;
        tile_p0[blockIdx.x] = live ? tr.p0 : 0;
        tile_rows[blockIdx.x] = live ? tr.rows : 0;
    }
}

// the sorted row of the padded layout's row blockIdx.x (tile t = blockIdx.x / MC_TILE, row i of it):
// p0(t) + i, or -1 for a padding row, whose n values at pad_row this block zeroes
__device__ __forceinline__ i64 mc_sorted_row(const int* __restrict__ tile_p0, const int* __restrict__ tile_rows,
                                             u16* __restrict__ pad_row, int n) {
    const int t = blockIdx.x / MC_TILE, i = blockIdx.x % MC_TILE;
    if (i >= tile_rows[t]) {
        for (int c = threadIdx.x; c < n; c += MC_THREADS) pad_row[c] = 0;
        return -1;
    }
    return tile_p0[t] + i;
}

// mc_gather: dst[t * MC_TILE + i, :D] = bf16(src row of sorted pair p0(t) + i) (zeros past the tile's
// rows): the row src[p] (mode 0) or src[order[p] / K] (mode 1), float32 (src_f32) or bf16, row stride ld.
// Launch: grid (T * MC_TILE), MC_THREADS. Floor: T MC_TILE D 2 written + the rows read.
extern "C" __global__ void __launch_bounds__(MC_THREADS)
mc_gather(const void* __restrict__ src, long long ld, int mode, int src_f32, const int* __restrict__ order,
          int K, const int* __restrict__ tile_p0, const int* __restrict__ tile_rows, int D,
          u16* __restrict__ dst) {
    u16* out = dst + (i64)blockIdx.x * D;
    const i64 p = mc_sorted_row(tile_p0, tile_rows, out, D);
    if (p < 0) return;
    const i64 row = mode ? (i64)(order[p] / K) : (i64)p;
    if (src_f32) {
        const float* s = (const float*)src + row * ld;
        for (int c = threadIdx.x; c < D; c += MC_THREADS) out[c] = mc_bf16(s[c]);
    } else {
        const u16* s = (const u16*)src + row * ld;
        for (int c = threadIdx.x; c < D; c += MC_THREADS) out[c] = s[c];
    }
}

// mc_glu: g, u (padded fp32 products) + the biases b_gate[e], b_up[e] (E, F; either null) -> g, u,
// h = act(g, u) (P, F) fp32 in sorted rows and h as bf16 in the padded layout (zeros in padding rows)
// for the down product. Launch: grid (T * MC_TILE), MC_THREADS.
extern "C" __global__ void __launch_bounds__(MC_THREADS)
mc_glu(const float* __restrict__ cg, const float* __restrict__ cu, const int* __restrict__ tile_e,
       const int* __restrict__ tile_p0, const int* __restrict__ tile_rows, int F, const float* __restrict__ b_gate,
       const float* __restrict__ b_up, int act, float* __restrict__ g, float* __restrict__ u, float* __restrict__ h,
       u16* __restrict__ hb_pad) {
    const int q = blockIdx.x, t = q / MC_TILE;
    u16* hq = hb_pad + (i64)q * F;
    const i64 p = mc_sorted_row(tile_p0, tile_rows, hq, F);
    if (p < 0) return;
    const float* gq = cg + (i64)q * F;
    const float* uq = cu + (i64)q * F;
    float* gp = g + p * F;
    float* up = u + p * F;
    float* hp = h + p * F;
    const float* bg = b_gate ? b_gate + (i64)tile_e[t] * F : nullptr;
    const float* bu = b_up ? b_up + (i64)tile_e[t] * F : nullptr;
    for (int f = threadIdx.x; f < F; f += MC_THREADS) {
        const float gv = bg ? gq[f] + bg[f] : gq[f], uv = bu ? uq[f] + bu[f] : uq[f];
        const float hv = glu_f(act, gv, uv, nullptr);
        gp[f] = gv;
        up[f] = uv;
        hp[f] = hv;
        hq[f] = mc_bf16(hv);
    }
}

// mc_glu_back: dh = rw[pair] * (padded fp32 product dy W_d), then the backward of h = act(g, u) with the
// cached g, u (biases included): [dg | du] bf16 in sorted rows (P, 2F) and in the padded layout (zeros in
// padding rows). Launch: grid (T * MC_TILE), MC_THREADS.
extern "C" __global__ void __launch_bounds__(MC_THREADS)
mc_glu_back(const float* __restrict__ cdh, const float* __restrict__ rw, const int* __restrict__ order,
            const int* __restrict__ tile_p0, const int* __restrict__ tile_rows, int F,
            const float* __restrict__ g, const float* __restrict__ u, int act, u16* __restrict__ dgu,
            u16* __restrict__ dgu_pad) {
    const int q = blockIdx.x, t = q / MC_TILE, i = q % MC_TILE;
    const bool live = i < tile_rows[t];
    const i64 p = live ? tile_p0[t] + i : 0;
    const float w = live ? rw[order[p]] : 0.0f;
    for (int f = threadIdx.x; f < F; f += MC_THREADS) {
        if (!live) {
            dgu_pad[(i64)q * 2 * F + f] = 0;
            dgu_pad[(i64)q * 2 * F + F + f] = 0;
            continue;
        }
        const float2 d = glu_back_f(act, w * cdh[(i64)q * F + f], g[p * F + f], u[p * F + f], nullptr);
        const u16 dg = mc_bf16(d.x), du = mc_bf16(d.y);
        dgu[p * 2 * F + f] = dg;
        dgu[p * 2 * F + F + f] = du;
        dgu_pad[(i64)q * 2 * F + f] = dg;
        dgu_pad[(i64)q * 2 * F + F + f] = du;
    }
}

// mc_scatter: out[order[p]] = the padded fp32 product's row of sorted pair p, + bias[e] (E, D) when not
// null (pair order: pair_out with the down bias, dx_pairs). Launch: grid (T * MC_TILE), MC_THREADS.
extern "C" __global__ void __launch_bounds__(MC_THREADS)
mc_scatter(const float* __restrict__ c, const int* __restrict__ order, const int* __restrict__ tile_e,
           const int* __restrict__ tile_p0, const int* __restrict__ tile_rows, int D, const float* __restrict__ bias,
           float* __restrict__ out) {
    const int q = blockIdx.x, t = q / MC_TILE, i = q % MC_TILE;
    if (i >= tile_rows[t]) return;
    const i64 pair = order[tile_p0[t] + i];
    const float* b = bias ? bias + (i64)tile_e[t] * D : nullptr;
    for (int d = threadIdx.x; d < D; d += MC_THREADS) {
        const float v = c[(i64)q * D + d];
        out[pair * D + d] = b ? v + b[d] : v;
    }
}
