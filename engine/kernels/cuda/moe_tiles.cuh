// Grouped-launch helpers shared by the MoE kernel sources (moe.cu, moe_gemm.cu): the block-wide scan,
// the row tile of a grouped launch (find_tile), and the bf16 tensor-core mma (emulated on the host by
// tests/kernels/emulate_moe.py with the PTX ISA's fragment layout). KernelSource.from_file inlines it.

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

// inclusive prefix sum of s[0..NT) in place (Hillis-Steele); s[tid] is written and synced before
template <int NT>
__device__ __forceinline__ void block_scan(int* s) {
    const int tid = threadIdx.x;
    for (int d = 1; d < NT; d <<= 1) {
        const int v = tid >= d ? s[tid - d] : 0;
        __syncthreads();
        s[tid] += v;
        __syncthreads();
    }
}

struct TileRows {
    int e;     // expert
    int p0;    // first sorted pair row of the tile
    int rows;  // rows in the tile (<= bm)
};

// Row tile t of the grouped launch: expert e's tiles are numbered after those of experts < e, each
// expert having ceil(n_e / bm) of them. Every thread gets the same answer; false past the last tile.
// Cost per block: E + 1 offsets read and a scan of NT values, small beside a tile's matmul.
template <int NT>
__device__ __forceinline__ bool find_tile(const int* __restrict__ offsets, int E, int bm, int t, int* s_scan,
                                          int* s_found, TileRows& tr) {
    const int tid = threadIdx.x;
    const int per = (E + NT - 1) / NT;
    const int e_lo = min(tid * per, E), e_hi = min(e_lo + per, E);
    int mine = 0;
    for (int i = e_lo; i < e_hi; ++i) mine += (offsets[i + 1] - offsets[i] + bm - 1) / bm;
    s_scan[tid] = mine;
    if (tid == 0) s_found[0] = -1;
    __syncthreads();
    block_scan<NT>(s_scan);
    int before = s_scan[tid] - mine;
    if (t >= before && t < before + mine) {
        for (int i = e_lo; i < e_hi; ++i) {
            const int lo = offsets[i], n = offsets[i + 1] - lo, nt = (n + bm - 1) / bm;
            if (t < before + nt) {
                const int p0 = lo + (t - before) * bm;
                s_found[0] = i;
                s_found[1] = p0;
                s_found[2] = min(bm, lo + n - p0);
                break;
            }
            before += nt;
        }
    }
    __syncthreads();
    tr.e = s_found[0];
    tr.p0 = s_found[1];
    tr.rows = s_found[2];
    return tr.e >= 0;
}

// D += A B for one m16n8k16 tile: A 16 x 16 bf16 (4 regs), B 16 x 8 bf16 (2 regs), D 16 x 8 fp32, in the
// PTX ISA's fragment layout (lane = 4 * groupID + threadID_in_group). The CPU emulation supplies
// emu_mma_bf16_16816 with the same layout, exchanging the warp's fragments.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    emu_mma_bf16_16816(d, a, b);
#endif
}

