// MoE grouped expert GEMMs v2 on the tensor cores: bf16 operands in global memory, a MG_STAGES-deep
// cp.async pipeline into padded shared memory, ldmatrix fragments, mma.sync m16n8k16 with fp32
// accumulation, 128 x 128 tiles over 8 warps, the expert LoRA folded into the K dimension of the base
// product (a second K segment: the rank-r intermediates beside the activations, the LoRA factor beside
// the weights); the expert biases and the gated activation (cuda/glu.cuh: SwiGLU, gpt-oss's clamped
// SwiGLU) in the epilogues; OUT_PROD_ID (per-expert sums of outer products) on the tensor cores; the
// packing of LoRA factors into bf16. Host side, layouts and determinism: engine/kernels/moe_gemm.py.

#include <cuda_bf16.h>
#include "glu.cuh"
#include "moe_tiles.cuh"

// set by moe_gemm.py (-D): MG_THREADS (8 warps), MG_BM, MG_BN, MG_SBN (skinny tiles), MG_BK, MG_STAGES,
// MG_OBK (rows per OUT_PROD_ID step)
#define MG_LDA (MG_BK + 8)  // padded strides (elements): 16-byte rows, ldmatrix without bank conflicts

// ---- primitives: PTX on the GPU, emulated on the host (tests/kernels/emulate_moe.py) ----------------

// 16 bytes global -> shared, asynchronous; bytes < 16 fills the rest with zeros (0: all zeros, src unread)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
#ifdef __CUDA_ARCH__
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(bytes));
#else
    emu_cp_async16(dst, src, bytes);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::);
#else
    emu_cp_async_commit();
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {  // all but the N most recent groups have landed
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#else
    emu_cp_async_wait(N);
#endif
}
// four 8 x 8 bf16 matrices (TRANS: each transposed); lane l gives the address of row l % 8 of matrix l / 8
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], const void* p) {
#ifdef __CUDA_ARCH__
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
#else
    emu_ldmatrix_x4(r, p, TRANS);
#endif
}

__device__ __forceinline__ u16 mg_bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float mg_f32(u16 b) { return __uint_as_float((u32)b << 16); }

// ---- the grouped GEMM ---------------------------------------------------------------------------------
//
// For the rows p of every expert e at once (sorted pairs, expert e's rows offsets[e]..offsets[e+1]):
//   acc[p, n] = sum_k A0[p, k] W0_e(k, n)  (k < K0)  +  sum_k AX[p, k] WX_e(k, n)  (k < KX)
// A0 rows: a0[p] (gather 0) or a0[order[p] / K] (gather 1: the token's row); AX rows: ax[p]. Both bf16.
// W0_e: NT = 1: w0[e] is (n, k) row-major (y = a W^T); with `split`, tile columns [0, BN/2) are rows
// f0 + n of w0a[e] and [BN/2, BN) rows f0 + n of w0b[e] (gate | up, f0 = blockIdx.x * BN/2), and WX's
// rows are f (gate) and N + f (up). NT = 0: w0[e] is (k, n) row-major (y = a W); rows k >= split come
// from w0b[e] (row k - split). WX_e likewise, one stack. Every row stride a multiple of 8 elements,
// every base 16-byte aligned, K0, KX, N multiples of 8 (zeros are filled past them).
// Launch: grid (column tiles, row_tiles(P, E, BM)), MG_THREADS threads, dynamic shared memory
// mg_smem_bytes(BN, NT) (moe_gemm.py). Blocks past the last row tile exit at once.

enum { EPI_ROWS = 0, EPI_SCATTER = 1, EPI_GLU = 2, EPI_GLU_BWD = 3 };

struct GemmArgs {
    const u16* a0;
    i64 lda0;
    int gather;
    const int* order;
    const int* offsets;
    int K, E, K0;
    const u16* w0a;
    const u16* w0b;
    i64 ldw0, w0_estride;
    int split;
    const u16* ax;
    i64 ldx;
    int KX;
    const u16* wx;
    i64 ldwx, wx_estride;
    int N;
};

template <int BN, bool NT>
struct GemmShape {
    static constexpr int WN = BN == 128 ? 32 : BN;  // warp tile: 8 warps as (BM / WM) x (BN / WN)
    static constexpr int WARPS_N = BN / WN;
    static constexpr int WM = MG_BM / (8 / WARPS_N);
    static constexpr int MF = WM / 16, NF = WN / 8;
    static constexpr int LDB = NT ? MG_LDA : BN + 8;
    static constexpr int A_STAGE = MG_BM * MG_LDA;  // elements
    static constexpr int B_STAGE = NT ? BN * MG_LDA : MG_BK * LDB;
    static constexpr int STAGE = A_STAGE + B_STAGE;
};

template <int BN, bool NT>
__device__ __forceinline__ void load_stage(const GemmArgs& g, int kt, int KT0, const TileRows& tr, int f0,
                                           const i64* s_arow, u16* stage) {
    typedef GemmShape<BN, NT> S;
    const int tid = threadIdx.x;
    const bool ext = kt >= KT0;
    const int k0 = (ext ? kt - KT0 : kt) * MG_BK;
    const int kseg = ext ? g.KX : g.K0;
    u16* As = stage;
    u16* Bs = stage + S::A_STAGE;
    constexpr int ACH = MG_BM * MG_BK / 8;  // 16-byte chunks per stage
    for (int c = tid; c < ACH; c += MG_THREADS) {
        const int m = c / (MG_BK / 8), k = k0 + (c % (MG_BK / 8)) * 8;
        const u16* src = g.a0;
        int bytes = 0;
        if (m < tr.rows && k < kseg) {
            src = ext ? g.ax + (i64)(tr.p0 + m) * g.ldx + k : g.a0 + s_arow[m] + k;
            bytes = 16;
        }
        cp_async16(As + m * MG_LDA + (c % (MG_BK / 8)) * 8, src, bytes);
    }
    constexpr int BCH = BN * MG_BK / 8;
    const u16* wbase = ext ? g.wx + (i64)tr.e * g.wx_estride : g.w0a + (i64)tr.e * g.w0_estride;
    const i64 ldw = ext ? g.ldwx : g.ldw0;
    for (int c = tid; c < BCH; c += MG_THREADS) {
        const u16* src = g.a0;
        int bytes = 0;
        u16* dst;
        if (NT) {
            const int n = c / (MG_BK / 8), kc = (c % (MG_BK / 8)) * 8, k = k0 + kc;
            dst = Bs + n * MG_LDA + kc;
            int row;
            const u16* base = wbase;
            if (g.split) {
                const int half = n >= BN / 2, f = f0 + n - half * (BN / 2);
                row = f < g.N ? (ext ? f + half * g.N : f) : -1;
                if (!ext && half) base = g.w0b + (i64)tr.e * g.w0_estride;
            } else {
                const int col = blockIdx.x * BN + n;
                row = col < g.N ? col : -1;
            }
            if (row >= 0 && k < kseg) {
                src = base + (i64)row * ldw + k;
                bytes = 16;
            }
        } else {
            const int kr = c / (BN / 8), nc = (c % (BN / 8)) * 8, k = k0 + kr, n = blockIdx.x * BN + nc;
            dst = Bs + kr * S::LDB + nc;
            if (n < g.N && k < kseg) {
                const bool second = !ext && k >= g.split;
                const u16* base = second ? g.w0b + (i64)tr.e * g.w0_estride : wbase;
                src = base + (i64)(second ? k - g.split : k) * ldw + n;
                bytes = 16;
            }
        }
        cp_async16(dst, src, bytes);
    }
}

// The pipelined k loop of one BM x BN tile; on return the fp32 tile is in Cs = (float*)smem (row stride
// BN + 4), synced, and every cp.async has landed.
template <int BN, bool NT>
__device__ __forceinline__ void gemm_tile(const GemmArgs& g, const TileRows& tr, int f0, const i64* s_arow,
                                          unsigned char* smem) {
    typedef GemmShape<BN, NT> S;
    u16* stages = (u16*)smem;
    const int KT0 = (g.K0 + MG_BK - 1) / MG_BK, KT = KT0 + (g.KX + MG_BK - 1) / MG_BK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = (warp / S::WARPS_N) * S::WM, wn = (warp % S::WARPS_N) * S::WN;
    float acc[S::MF][S::NF][4];
#pragma unroll
    for (int i = 0; i < S::MF; ++i)
#pragma unroll
        for (int j = 0; j < S::NF; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
#pragma unroll
    for (int s = 0; s < MG_STAGES - 1; ++s) {
        if (s < KT) load_stage<BN, NT>(g, s, KT0, tr, f0, s_arow, stages + s * S::STAGE);
        cp_async_commit();  // an empty group past the end keeps the count of groups in step
    }
    // the lane's ldmatrix row: matrix j = lane / 8, row r = lane % 8
    const int lj = lane >> 3, lr = lane & 7;
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<MG_STAGES - 2>();
        __syncthreads();  // stage kt has landed for every thread, and stage kt - 1 is no longer read
        const int pf = kt + MG_STAGES - 1;
        if (pf < KT) load_stage<BN, NT>(g, pf, KT0, tr, f0, s_arow, stages + (pf % MG_STAGES) * S::STAGE);
        cp_async_commit();
        const u16* As = stages + (kt % MG_STAGES) * S::STAGE;
        const u16* Bs = As + S::A_STAGE;
#pragma unroll
        for (int kk = 0; kk < MG_BK; kk += 16) {
            u32 af[S::MF][4];
#pragma unroll
            for (int i = 0; i < S::MF; ++i)
                ldsm_x4<false>(af[i], As + (wm + i * 16 + (lj & 1) * 8 + lr) * MG_LDA + kk + (lj >> 1) * 8);
#pragma unroll
            for (int j = 0; j < S::NF; j += 2) {
                u32 b[4];  // b[0], b[1]: n-fragment j; b[2], b[3]: j + 1
                if (NT)
                    ldsm_x4<false>(b, Bs + (wn + j * 8 + (lj >> 1) * 8 + lr) * MG_LDA + kk + (lj & 1) * 8);
                else
                    ldsm_x4<true>(b, Bs + (kk + (lj & 1) * 8 + lr) * S::LDB + wn + j * 8 + (lj >> 1) * 8);
                const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
                for (int i = 0; i < S::MF; ++i) {
                    mma_bf16_16816(acc[i][j], af[i], b0);
                    mma_bf16_16816(acc[i][j + 1], af[i], b1);
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages: the tile goes over them
    float* Cs = (float*)smem;
    const int gq = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < S::MF; ++i)
#pragma unroll
        for (int j = 0; j < S::NF; ++j) {
            const int r = wm + i * 16 + gq, c = wn + j * 8 + t * 2;
            Cs[r * (BN + 4) + c] = acc[i][j][0];
            Cs[r * (BN + 4) + c + 1] = acc[i][j][1];
            Cs[(r + 8) * (BN + 4) + c] = acc[i][j][2];
            Cs[(r + 8) * (BN + 4) + c + 1] = acc[i][j][3];
        }
    __syncthreads();
}

// Epilogues: EPI_ROWS writes acc to out_f[p, col] (ld_f) and/or bf16(scale * acc) to out_b[p, col]
// (ld_b), either may be null; EPI_SCATTER writes acc (+ bias[e, col] when bias is not null) to
// out_f[order[p], col]; EPI_GLU and EPI_GLU_BWD are the gate/up and down-backward epilogues (mg_gate_up,
// mg_down_back below). `act` is a glu.cuh ACT_* code; biases are (E, N) float32 or null.
template <int BN, bool NT, int EPI>
__device__ __forceinline__ void gemm_body(const GemmArgs& g, float* __restrict__ out_f, i64 ld_f,
                                          u16* __restrict__ out_b, i64 ld_b, float scale,
                                          const float* __restrict__ rw, const float* __restrict__ gin,
                                          const float* __restrict__ uin, float* __restrict__ uout,
                                          float* __restrict__ hout, const float* __restrict__ bias,
                                          const float* __restrict__ bias2, int act) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int s_scan[MG_THREADS];
    __shared__ int s_found[3];
    __shared__ i64 s_arow[MG_BM];
    __shared__ int s_pair[MG_BM];
    TileRows tr;
    if (!find_tile<MG_THREADS>(g.offsets, g.E, MG_BM, blockIdx.y, s_scan, s_found, tr)) return;
    const int tid = threadIdx.x;
    if (tid < MG_BM) {
        const int pair = tid < tr.rows ? g.order[tr.p0 + tid] : -1;
        s_pair[tid] = pair;
        s_arow[tid] = tid < tr.rows ? (g.gather ? (i64)(pair / g.K) : (i64)(tr.p0 + tid)) * g.lda0 : 0;
    }
    __syncthreads();
    const int f0 = blockIdx.x * (BN / 2);
    gemm_tile<BN, NT>(g, tr, f0, s_arow, smem);
    const float* Cs = (const float*)smem;
    if (EPI == EPI_GLU) {
        // g = acc (gate columns) + b_gate[e], u = acc (up columns) + b_up[e], h = act(g, u): fp32 g, u, h
        // and bf16 h, rows p (bias: b_gate, bias2: b_up, either null)
        const float* bge = bias ? bias + (i64)tr.e * g.N : nullptr;
        const float* bue = bias2 ? bias2 + (i64)tr.e * g.N : nullptr;
        for (int idx = tid; idx < MG_BM * (BN / 2); idx += MG_THREADS) {
            const int m = idx / (BN / 2), n = idx % (BN / 2), f = f0 + n;
            if (m >= tr.rows || f >= g.N) continue;
            const i64 p = tr.p0 + m;
            float gv = Cs[m * (BN + 4) + n], uv = Cs[m * (BN + 4) + BN / 2 + n];
            if (bge) gv += bge[f];
            if (bue) uv += bue[f];
            const float hv = glu_f(act, gv, uv, nullptr);
            out_f[p * ld_f + f] = gv;
            uout[p * ld_f + f] = uv;
            hout[p * ld_f + f] = hv;
            out_b[p * ld_b + f] = mg_bf16(hv);
        }
        return;
    }
    const int n0 = blockIdx.x * BN;
    const float* be = bias ? bias + (i64)tr.e * g.N : nullptr;
    for (int idx = tid; idx < MG_BM * BN; idx += MG_THREADS) {
        const int m = idx / BN, n = idx % BN, col = n0 + n;
        if (m >= tr.rows || col >= g.N) continue;
        const i64 p = tr.p0 + m;
        const float v = Cs[m * (BN + 4) + n];
        if (EPI == EPI_ROWS) {
            if (out_f) out_f[p * ld_f + col] = v;
            if (out_b) out_b[p * ld_b + col] = mg_bf16(scale * v);
        } else if (EPI == EPI_SCATTER) {
            out_f[(i64)s_pair[m] * ld_f + col] = be ? v + be[col] : v;
        } else {  // EPI_GLU_BWD: dh = rw * acc, then the activation's backward with the cached g, u
            const float2 d = glu_back_f(act, v * rw[s_pair[m]], gin[p * g.N + col], uin[p * g.N + col], nullptr);
            out_b[p * ld_b + col] = mg_bf16(d.x);
            out_b[p * ld_b + g.N + col] = mg_bf16(d.y);
        }
    }
}

#define MG_GEMM_PARAMS                                                                                     \
    const u16 *__restrict__ a0, i64 lda0, int gather, const int *__restrict__ order,                      \
        const int *__restrict__ offsets, int K, int E, int K0, const u16 *__restrict__ w0a,               \
        const u16 *__restrict__ w0b, i64 ldw0, i64 w0_estride, int split, const u16 *__restrict__ ax,     \
        i64 ldx, int KX, const u16 *__restrict__ wx, i64 ldwx, i64 wx_estride, int N
#define MG_GEMM_ARGS \
    GemmArgs { a0, lda0, gather, order, offsets, K, E, K0, w0a, w0b, ldw0, w0_estride, split, ax, ldx, KX, wx, ldwx, wx_estride, N }

// Every kernel below asks for two blocks of MG_THREADS an SM (__launch_bounds__(MG_THREADS, 2): at most 128
// registers a thread), the occupancy the tiles are sized for, whatever ptxas version builds them.

// mg_rows_{nt,nn}: the plain grouped product, out_f = acc and out_b = bf16(scale * acc) in sorted rows
// (a column offset is the caller's pointer). mg_skinny_nt: the same with MG_SBN-wide tiles, for the rank-r LoRA
// intermediates (x A^T, h A^T, dy B, dg B). Floor: 2 P K N FLOPs.
extern "C" __global__ void __launch_bounds__(MG_THREADS, 2)
mg_rows_nt(MG_GEMM_PARAMS, float* __restrict__ out_f, i64 ld_f, u16* __restrict__ out_b, i64 ld_b, float scale) {
    gemm_body<MG_BN, true, EPI_ROWS>(MG_GEMM_ARGS, out_f, ld_f, out_b, ld_b, scale, nullptr, nullptr, nullptr,
                                     nullptr, nullptr, nullptr, nullptr, 0);
}
extern "C" __global__ void __launch_bounds__(MG_THREADS, 2)
mg_rows_nn(MG_GEMM_PARAMS, float* __restrict__ out_f, i64 ld_f, u16* __restrict__ out_b, i64 ld_b, float scale) {
    gemm_body<MG_BN, false, EPI_ROWS>(MG_GEMM_ARGS, out_f, ld_f, out_b, ld_b, scale, nullptr, nullptr, nullptr,
                                      nullptr, nullptr, nullptr, nullptr, 0);
}
extern "C" __global__ void __launch_bounds__(MG_THREADS, 2)
mg_skinny_nt(MG_GEMM_PARAMS, float* __restrict__ out_f, i64 ld_f, u16* __restrict__ out_b, i64 ld_b,
             float scale) {
    gemm_body<MG_SBN, true, EPI_ROWS>(MG_GEMM_ARGS, out_f, ld_f, out_b, ld_b, scale, nullptr, nullptr, nullptr,
                                      nullptr, nullptr, nullptr, nullptr, 0);
}
// mg_gate_up: split NT tile (64 gate + 64 up columns of W_gate[e], W_up[e]), K = C (+ the LoRA segment
// [s_g x A_g^T | s_u x A_u^T] against [B_g | B_u]); g and u get their biases b_gate, b_up (E, F) when
// not null, h = act(g, u); writes g, u, h (P, F) fp32 and h bf16. Floor: 4 P C F.
extern "C" __global__ void __launch_bounds__(MG_THREADS, 2)
mg_gate_up(MG_GEMM_PARAMS, const float* __restrict__ b_gate, const float* __restrict__ b_up, int act,
           float* __restrict__ g, float* __restrict__ u, float* __restrict__ h, u16* __restrict__ hb) {
    gemm_body<MG_BN, true, EPI_GLU>(MG_GEMM_ARGS, g, (i64)N, hb, (i64)N, 1.0f, nullptr, nullptr, nullptr, u, h,
                                    b_gate, b_up, act);
}
// mg_scatter_{nt,nn}: acc to out[order[p]] (pair order): the down projection (NT over W_down[e], plus
// b_down[e] (E, C) when not null) and dx (NN over [W_gate[e]; W_up[e]], split at k = F). Floor: 2 P K N.
extern "C" __global__ void __launch_bounds__(MG_THREADS, 2)
mg_scatter_nt(MG_GEMM_PARAMS, const float* __restrict__ b_down, float* __restrict__ out) {
    gemm_body<MG_BN, true, EPI_SCATTER>(MG_GEMM_ARGS, out, (i64)N, nullptr, 0, 1.0f, nullptr, nullptr, nullptr,
                                        nullptr, nullptr, b_down, nullptr, 0);
}
extern "C" __global__ void __launch_bounds__(MG_THREADS, 2)
mg_scatter_nn(MG_GEMM_PARAMS, float* __restrict__ out) {
    gemm_body<MG_BN, false, EPI_SCATTER>(MG_GEMM_ARGS, out, (i64)N, nullptr, 0, 1.0f, nullptr, nullptr, nullptr,
                                         nullptr, nullptr, nullptr, nullptr, 0);
}
// mg_down_back: NN over W_down[e] (C, F), A = dy[token] bf16; dh = rw[pair] * acc, then the backward of
// h = act(g, u) with the cached fp32 g, u (biases included): writes [dg | du] (P, 2F) bf16. Floor: 2 P C F.
extern "C" __global__ void __launch_bounds__(MG_THREADS, 2)
mg_down_back(MG_GEMM_PARAMS, const float* __restrict__ rw, const float* __restrict__ gin,
             const float* __restrict__ uin, int act, u16* __restrict__ dgu) {
    gemm_body<MG_BN, false, EPI_GLU_BWD>(MG_GEMM_ARGS, nullptr, 0, dgu, (i64)2 * N, 1.0f, rw, gin, uin, nullptr,
                                         nullptr, nullptr, nullptr, act);
}

// ---- OUT_PROD_ID on the tensor cores ---------------------------------------------------------------
//
// out[e] (I x J) = scale * sum over the rows p of expert e, in sorted order, of L(p)^T R(p): L(p) the
// I-vector l[row] (row = p, or order[p] / K when l_mode is 1), times rw[order[p]] when l_rw; R likewise.
// l and r are bf16 (l_f32 = 0) or fp32 (1) rows with unit stride; the block rounds them to bf16 as it
// stages them (through registers: the row scale and the conversion need them), and the tensor cores
// sum the products in fp32. With transpose = 1 the block writes out[e] as (J x I): out[e][j][i]. One
// block per (I tile x J tile, expert), its rows in steps of MG_OBK, so every element is one thread's
// fixed-order sum: deterministic. Experts without rows get zeros.
// Launch: grid (tiles of I * tiles of J, E), MG_THREADS threads, static shared memory.
// Floor: 2 P I J FLOPs; (P I + P J) operand bytes per J / I tile pass.

struct OuterSrc {
    const void* p;
    i64 ld;
    int mode, f32, scaled;
};

__device__ __forceinline__ uint4 outer_chunk(const OuterSrc& s, i64 row, int c, int n, float w) {
    if (c >= n) return make_uint4(0u, 0u, 0u, 0u);
    float v[8];
    if (s.f32) {
        const float4* q = (const float4*)((const float*)s.p + row * s.ld + c);
        const float4 lo = __ldg(q), hi = __ldg(q + 1);
        v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w; v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
    } else {
        const uint4 q = __ldg((const uint4*)((const u16*)s.p + row * s.ld + c));
        if (!s.scaled) return q;
        const u32 w4[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[2 * i] = mg_f32((u16)(w4[i] & 0xffffu));
            v[2 * i + 1] = mg_f32((u16)(w4[i] >> 16));
        }
    }
    if (s.scaled)
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] *= w;
    u32 o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = (u32)mg_bf16(v[2 * i]) | ((u32)mg_bf16(v[2 * i + 1]) << 16);
    return make_uint4(o[0], o[1], o[2], o[3]);
}

// one side's (L or R) share of the MG_OBK rows from p0 on, W columns from x0 (of n), as chunks of 8 bf16
// in registers, PT per thread; zeros past the expert's rows (hi) or past n
template <int W, int PT>
__device__ __forceinline__ void outer_fetch(uint4 (&regs)[PT], const OuterSrc& s, int x0, int n, int p0, int hi,
                                            const int* __restrict__ order, int K, const float* __restrict__ rw) {
    constexpr int CH = MG_OBK * W / 8;  // chunks of the side's tile
#pragma unroll
    for (int q = 0; q < PT; ++q) {
        const int c = threadIdx.x + q * MG_THREADS, pr = c / (W / 8), col = (c % (W / 8)) * 8, p = p0 + pr;
        regs[q] = make_uint4(0u, 0u, 0u, 0u);
        if (c < CH && p < hi) {
            const int pair = order[p];
            regs[q] = outer_chunk(s, s.mode ? (i64)(pair / K) : (i64)p, x0 + col, n, s.scaled ? rw[pair] : 1.0f);
        }
    }
}

// those registers into the side's shared tile (MG_OBK rows of W, row stride LD)
template <int W, int LD, int PT>
__device__ __forceinline__ void outer_stage(u16* tile, const uint4 (&regs)[PT]) {
    constexpr int CH = MG_OBK * W / 8;
#pragma unroll
    for (int q = 0; q < PT; ++q) {
        const int c = threadIdx.x + q * MG_THREADS;
        if (c < CH) *(uint4*)(tile + (c / (W / 8)) * LD + (c % (W / 8)) * 8) = regs[q];
    }
}

template <int BI>
__device__ __forceinline__ void outer_body(OuterSrc L, OuterSrc R, const float* __restrict__ rw,
                                           const int* __restrict__ order, const int* __restrict__ offsets,
                                           int K, int I, int J, float scale, int transpose,
                                           float* __restrict__ out) {
    constexpr int BJ = 128, WJ = 32, WI = BI / 2, MF = WI / 16, NF = WJ / 8;  // 8 warps: 2 (i) x 4 (j)
    constexpr int LDL = BI + 8, LDR = BJ + 8;
    constexpr int LCH = MG_OBK * BI / 8, RCH = MG_OBK * BJ / 8;
    constexpr int LPT = (LCH + MG_THREADS - 1) / MG_THREADS, RPT = (RCH + MG_THREADS - 1) / MG_THREADS;
    __shared__ __align__(16) u16 Ls[MG_OBK * LDL];
    __shared__ __align__(16) u16 Rs[MG_OBK * LDR];
    const int e = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int tiles_j = (J + BJ - 1) / BJ;
    const int i0 = (blockIdx.x / tiles_j) * BI, j0 = (blockIdx.x % tiles_j) * BJ;
    const int lo = offsets[e], hi = offsets[e + 1];
    const int wi = (warp >> 2) * WI, wj = (warp & 3) * WJ;
    float acc[MF][NF][4];
#pragma unroll
    for (int a = 0; a < MF; ++a)
#pragma unroll
        for (int b = 0; b < NF; ++b)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[a][b][q] = 0.0f;
    uint4 rl[LPT], rr[RPT];
    auto fetch = [&](int p0) {
        outer_fetch<BI>(rl, L, i0, I, p0, hi, order, K, rw);
        outer_fetch<BJ>(rr, R, j0, J, p0, hi, order, K, rw);
    };
    const int lj = lane >> 3, lr = lane & 7;
    if (lo < hi) fetch(lo);
    for (int p0 = lo; p0 < hi; p0 += MG_OBK) {
        outer_stage<BI, LDL>(Ls, rl);
        outer_stage<BJ, LDR>(Rs, rr);
        __syncthreads();
        if (p0 + MG_OBK < hi) fetch(p0 + MG_OBK);  // the next rows' loads fly while this step computes
#pragma unroll
        for (int kk = 0; kk < MG_OBK; kk += 16) {
            u32 af[MF][4];
#pragma unroll
            for (int a = 0; a < MF; ++a)  // A = L^T: (i, p) from Ls[p][i], transposed
                ldsm_x4<true>(af[a], Ls + (kk + (lj >> 1) * 8 + lr) * LDL + wi + a * 16 + (lj & 1) * 8);
#pragma unroll
            for (int b = 0; b < NF; b += 2) {
                u32 bb[4];  // B = R: (p, j) from Rs[p][j], transposed fragments
                ldsm_x4<true>(bb, Rs + (kk + (lj & 1) * 8 + lr) * LDR + wj + b * 8 + (lj >> 1) * 8);
                const u32 b0[2] = {bb[0], bb[1]}, b1[2] = {bb[2], bb[3]};
#pragma unroll
                for (int a = 0; a < MF; ++a) {
                    mma_bf16_16816(acc[a][b], af[a], b0);
                    mma_bf16_16816(acc[a][b + 1], af[a], b1);
                }
            }
        }
        __syncthreads();
    }
    float* oe = out + (i64)e * I * J;
    const int gq = lane >> 2, t = lane & 3;
#pragma unroll
    for (int a = 0; a < MF; ++a)
#pragma unroll
        for (int b = 0; b < NF; ++b)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int i = i0 + wi + a * 16 + gq + (q >> 1) * 8, j = j0 + wj + b * 8 + t * 2 + (q & 1);
                if (i < I && j < J) oe[transpose ? (i64)j * I + i : (i64)i * J + j] = scale * acc[a][b][q];
            }
}

#define MG_OUTER_PARAMS                                                                                    \
    const void *__restrict__ l, i64 ldl, int l_mode, int l_f32, int l_rw, const void *__restrict__ r, i64 ldr, \
        int r_mode, int r_f32, int r_rw, const float *__restrict__ rw, const int *__restrict__ order,          \
        const int *__restrict__ offsets, int K, int I, int J, float scale, int transpose, float *__restrict__ out
// mg_outer: 128 x 128 tiles (expert weight gradients, I and J both large); mg_outer_skinny: 32 x 128
// tiles (the LoRA factor gradients, I = r).
extern "C" __global__ void __launch_bounds__(MG_THREADS, 2) mg_outer(MG_OUTER_PARAMS) {
    outer_body<128>(OuterSrc{l, ldl, l_mode, l_f32, l_rw}, OuterSrc{r, ldr, r_mode, r_f32, r_rw}, rw, order,
                    offsets, K, I, J, scale, transpose, out);
}
extern "C" __global__ void __launch_bounds__(MG_THREADS, 2) mg_outer_skinny(MG_OUTER_PARAMS) {
    outer_body<32>(OuterSrc{l, ldl, l_mode, l_f32, l_rw}, OuterSrc{r, ldr, r_mode, r_f32, r_rw}, rw, order,
                   offsets, K, I, J, scale, transpose, out);
}

// ---- packing -----------------------------------------------------------------------------------------

// mg_pack: dst[e][row_off + i][col_off + j] = bf16(src[e][i][j]) (transpose = 0) or bf16(src[e][j][i])
// (transpose = 1, src (E, cols, rows)), for i < rows, j < cols; dst (E, dst_rows, dst_cols) zeroed by the
// caller where nothing lands. The LoRA factors' bf16 copies, each step (they change every step). Launch:
// grid (ceil(rows * cols / MG_THREADS), E). Floor: E rows cols (4 + 2) bytes.
extern "C" __global__ void __launch_bounds__(MG_THREADS)
mg_pack(const float* __restrict__ src, int rows, int cols, int transpose, u16* __restrict__ dst, int dst_rows,
        int dst_cols, int row_off, int col_off) {
    const i64 e = blockIdx.y;
    const int idx = blockIdx.x * MG_THREADS + threadIdx.x;
    if (idx >= rows * cols) return;
    const int i = idx / cols, j = idx % cols;
    const float v = transpose ? src[(e * cols + j) * rows + i] : src[(e * rows + i) * cols + j];
    dst[(e * dst_rows + row_off + i) * dst_cols + col_off + j] = mg_bf16(v);
}
