"""Runs a kernel source's CUDA C++ on the CPU with block-level and warp-level collectives: the MoE kernels.

A sibling of `emulate.py` (which runs each CUDA thread as an OS thread meeting at a std::barrier). The
MoE kernels need more than that: 2-D grids, float parameters, many kernels with different signatures
and, above all, the warp-collective tensor-core instruction `mma.sync.m16n8k16`, whose result in one
lane depends on the fragments of all 32. Here each CUDA thread of a block is a fiber (its own stack,
switched with __builtin_setjmp/__builtin_longjmp on one OS thread), so that:

- `__syncthreads()` is a real barrier, and one that can never be met (a thread that returned while
  others wait, a barrier inside divergent code) is reported as an error instead of hanging;
- `mma_bf16_16816` (the kernel source calls it outside `__CUDA_ARCH__`) is emulated with the PTX
  ISA's fragment layout: every lane posts its A and B registers, the warp meets, and each lane
  computes its own four D elements from its neighbours' registers. A kernel that loads or stores a
  fragment element at the wrong place gets wrong numbers here, as it would on the GPU;
- `cp.async` (16-byte copies with zero fill, commit and wait_group) is emulated with a queue per thread:
  a copy lands only when a `cp.async.wait_group` of its thread completes its group, so a kernel that
  reads a pipeline stage before waiting for it reads what was there before (dynamic shared memory
  starts as 0xFF bytes: NaN); `ldmatrix.x4` (and `.trans`) exchanges the warp's row addresses and gives
  each lane the PTX ISA's fragment elements; both fault on addresses that are not 16-byte aligned;
- kernels are called through their own C++ signature: each launch checks that every argument's kind
  and size (pointer, 4- or 8-byte integer, float) is what the kernel declares, as CuPy would need;
- an 8- or 16-byte `__ldg` from an address that is not a multiple of its size is an error, as it
  is a fault on the GPU (x86 would read it silently).

What it checks: indexing, tiling, the fragment layout, barrier placement (divergence), every value
against the NumPy reference. What it does not: the GPU's memory model beyond barriers (no data race
detection), coalescing, timing, or the GPU compiler's code (FMA contraction: the emulation rounds
each operation, g++ -ffp-contract=off, and sums an mma tile in k order). One block runs at a time.
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from tests.kernels.emulate import BIT_SHIM, _host_source, compiler, gxx_defines

SHIM = (
    r"""
#include <math.h>
#include <cmath>
#include <setjmp.h>
#include <ucontext.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

struct uint4 { unsigned int x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }

struct emu_dim3 { unsigned x, y, z; };
static emu_dim3 blockIdx, threadIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))

static char emu_error[512];
static int emu_faulted;
struct emu_copy { void* dst; const void* src; int bytes, group; };
static std::vector<emu_copy> emu_copies[1024];
static int emu_groups[1024];
template <class T> static inline T __ldg(const T* p) {
    if (sizeof(T) >= 8 && (uintptr_t)p % sizeof(T) != 0 && !emu_faulted) {  // the GPU faults on it
        emu_faulted = 1;
        std::snprintf(emu_error, sizeof emu_error,
                      "misaligned %d-byte load at %p (thread %u of block (%u, %u))", (int)sizeof(T),
                      (const void*)p, threadIdx.x, blockIdx.x, blockIdx.y);
    }
    return *p;
}
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
"""
    + BIT_SHIM
    + r"""
// ---- fibers: one per CUDA thread of a block, on one OS thread ----------------------------------------
// switches are GCC's __builtin_setjmp/__builtin_longjmp: none of glibc _longjmp's unwinding of pthread
// cleanup handlers (a sixth of the emulators' time); __builtin_longjmp must not be called from the
// function of its __builtin_setjmp, hence emu_jump
typedef void* emu_jb[5];
__attribute__((noinline)) static void emu_jump(emu_jb& b) { __builtin_longjmp(b, 1); }
struct emu_fiber { emu_jb jb; ucontext_t uc; int started, done; };
static emu_fiber* emu_fibers;
static emu_jb emu_sched;
static int emu_cur, emu_nthreads;
static long emu_progress;
static void (*emu_body)(void*);
static void* emu_argv;
struct emu_bar { int arrived; unsigned gen; };
static emu_bar emu_block_bar;
static emu_bar emu_warp_bar[32];

static void emu_yield() {
    if (!__builtin_setjmp(emu_fibers[emu_cur].jb)) emu_jump(emu_sched);
}
static void emu_bar_wait(emu_bar& b, int count) {
    const unsigned gen = b.gen;
    ++emu_progress;
    if (++b.arrived == count) {
        b.arrived = 0;
        ++b.gen;
        return;
    }
    while (b.gen == gen) emu_yield();
}
static inline void __syncthreads() { emu_bar_wait(emu_block_bar, emu_nthreads); }
static inline void emu_syncwarp() { emu_bar_wait(emu_warp_bar[threadIdx.x >> 5], 32); }

static void emu_trampoline() {
    for (;;) {  // one call of the kernel per block; the scheduler resumes the fiber for the next block
        emu_body(emu_argv);
        emu_fibers[emu_cur].done = 1;
        ++emu_progress;
        emu_yield();
    }
}

static unsigned char* emu_dyn_smem;
static int emu_run(void (*body)(void*), void* argv, int gx, int gy, int threads, long long shmem) {
    const size_t stack = 128 * 1024;
    std::unique_ptr<emu_fiber[]> fibers(new emu_fiber[threads]);
    // the stacks are kept from launch to launch: a fresh allocation each launch page-faults anew
    static std::unique_ptr<char[]> stacks;
    static size_t stacks_size = 0;
    if (stacks_size < stack * threads) {
        stacks.reset(new char[stack * threads]);
        stacks_size = stack * threads;
    }
    std::vector<unsigned char> dyn((size_t)shmem + 16);
    emu_dyn_smem = (unsigned char*)(((uintptr_t)dyn.data() + 15) & ~(uintptr_t)15);
    emu_fibers = fibers.get();
    emu_nthreads = threads;
    emu_body = body;
    emu_argv = argv;
    emu_error[0] = 0;
    emu_faulted = 0;
    blockDim = {(unsigned)threads, 1, 1};
    gridDim = {(unsigned)gx, (unsigned)gy, 1};
    for (int i = 0; i < threads; ++i) {
        emu_fibers[i].started = 0;
        getcontext(&emu_fibers[i].uc);
        emu_fibers[i].uc.uc_stack.ss_sp = stacks.get() + stack * i;
        emu_fibers[i].uc.uc_stack.ss_size = stack;
        emu_fibers[i].uc.uc_link = nullptr;
        makecontext(&emu_fibers[i].uc, emu_trampoline, 0);
    }
    for (int by = 0; by < gy; ++by)
        for (int bx = 0; bx < gx; ++bx) {
            blockIdx = {(unsigned)bx, (unsigned)by, 0};
            emu_block_bar = {0, 0};
            for (auto& w : emu_warp_bar) w = {0, 0};
            for (int i = 0; i < threads; ++i) {
                emu_fibers[i].done = 0;
                emu_copies[i].clear();
                emu_groups[i] = 0;
            }
            std::memset(emu_dyn_smem, 0xff, (size_t)shmem);  // never written: NaN floats, bf16 NaN
            for (;;) {
                const long before = emu_progress;
                int left = 0;
                for (emu_cur = 0; emu_cur < emu_nthreads; ++emu_cur) {
                    if (emu_fibers[emu_cur].done) continue;
                    threadIdx = {(unsigned)emu_cur, 0, 0};
                    if (!__builtin_setjmp(emu_sched)) {
                        if (!emu_fibers[emu_cur].started) {
                            emu_fibers[emu_cur].started = 1;
                            setcontext(&emu_fibers[emu_cur].uc);
                        }
                        emu_jump(emu_fibers[emu_cur].jb);
                    }
                    left += !emu_fibers[emu_cur].done;
                }
                if (!left) break;
                if (emu_progress == before) {
                    int done = 0;
                    for (int i = 0; i < threads; ++i) done += emu_fibers[i].done;
                    std::snprintf(emu_error, sizeof emu_error,
                                  "block (%d, %d): %d of %d threads wait at a barrier that can never be met "
                                  "(%d returned): divergent __syncthreads or warp collective", bx, by,
                                  threads - done, threads, done);
                    return 1;
                }
            }
        }
    return emu_faulted ? 2 : 0;
}

// ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, with the PTX ISA's fragment layout ----------
// lane = 4 * groupID + threadID_in_group; A (16 x 16) reg i holds rows g + 8 (i & 1), columns
// 2t + 8 (i >> 1) + {0, 1}; B (16 x 8) reg i holds k = 2t + 8 i + {0, 1} of column g; D element i is
// row g + 8 (i >> 1), column 2t + (i & 1). The low half of a register holds the lower index.
static unsigned emu_mma_a[32][32][4];
static unsigned emu_mma_b[32][32][2];
static inline float emu_bf16_at(unsigned reg, int half) {
    return __uint_as_float(((reg >> (16 * half)) & 0xffffu) << 16);
}
static void emu_mma_bf16_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = 0; i < 4; ++i) emu_mma_a[w][lane][i] = a[i];
    for (int i = 0; i < 2; ++i) emu_mma_b[w][lane][i] = b[i];
    emu_syncwarp();
    const int g = lane >> 2, t = lane & 3;
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float s = d[i];
        for (int k = 0; k < 16; ++k) {
            const int a_lane = (row & 7) * 4 + ((k & 7) >> 1), a_reg = (row >> 3) + 2 * (k >> 3);
            const float av = emu_bf16_at(emu_mma_a[w][a_lane][a_reg], k & 1);
            const float bv = emu_bf16_at(emu_mma_b[w][col * 4 + ((k & 7) >> 1)][k >> 3], k & 1);
            s = fmaf(av, bv, s);
        }
        out[i] = s;
    }
    emu_syncwarp();  // every lane has read the exchange before any lane's next mma overwrites it
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// ---- cp.async: each thread's copies wait in its queue until a cp.async.wait_group completes them ------
// (so a kernel that reads a stage before waiting for it reads stale or poisoned shared memory, as it
// may on the GPU). Groups are numbered per thread in commit order; copies issued after the last commit
// belong to the open group, which no wait completes.
static void emu_cp_async16(void* dst, const void* src, int bytes) {
    if (((uintptr_t)dst % 16 || (bytes && (uintptr_t)src % 16)) && !emu_faulted) {
        emu_faulted = 1;
        std::snprintf(emu_error, sizeof emu_error,
                      "misaligned cp.async (%p <- %p, thread %u of block (%u, %u))", dst, src, threadIdx.x,
                      blockIdx.x, blockIdx.y);
    }
    emu_copies[threadIdx.x].push_back({dst, src, bytes, emu_groups[threadIdx.x]});
}
static void emu_cp_async_commit() { ++emu_groups[threadIdx.x]; }
static void emu_cp_async_wait(int n) {
    std::vector<emu_copy>& q = emu_copies[threadIdx.x];
    const int done_below = emu_groups[threadIdx.x] - n;
    size_t kept = 0;
    for (size_t i = 0; i < q.size(); ++i) {
        if (q[i].group < done_below) {
            std::memcpy(q[i].dst, q[i].src, q[i].bytes);
            std::memset((char*)q[i].dst + q[i].bytes, 0, 16 - q[i].bytes);
        } else {
            q[kept++] = q[i];
        }
    }
    q.resize(kept);
}

// ---- ldmatrix.sync.aligned.m8n8.x4(.trans).b16: lane l gives the address of row l % 8 of matrix l / 8;
// register j of lane l holds matrix j's elements (row l / 4, columns 2 (l % 4), +1), or transposed
// (rows 2 (l % 4), +1 of column l / 4); the low half holds the first.
static const void* emu_ldsm_rows[32][32];
static void emu_ldmatrix_x4(unsigned (&r)[4], const void* p, bool trans) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if ((uintptr_t)p % 16 && !emu_faulted) {
        emu_faulted = 1;
        std::snprintf(emu_error, sizeof emu_error, "misaligned ldmatrix row %p (thread %u)", p, threadIdx.x);
    }
    emu_ldsm_rows[w][lane] = p;
    emu_syncwarp();
    const int g = lane >> 2, t = lane & 3;
    unsigned out[4];
    for (int j = 0; j < 4; ++j) {
        unsigned short lo, hi;
        if (!trans) {
            const unsigned short* row = (const unsigned short*)emu_ldsm_rows[w][j * 8 + g];
            lo = row[2 * t];
            hi = row[2 * t + 1];
        } else {
            lo = ((const unsigned short*)emu_ldsm_rows[w][j * 8 + 2 * t])[g];
            hi = ((const unsigned short*)emu_ldsm_rows[w][j * 8 + 2 * t + 1])[g];
        }
        out[j] = (unsigned)lo | ((unsigned)hi << 16);
    }
    emu_syncwarp();  // every lane has read the addresses before any lane's next ldmatrix posts its own
    for (int j = 0; j < 4; ++j) r[j] = out[j];
}

// ---- calling a kernel through its own signature --------------------------------------------------------
template <class T> constexpr char emu_kind() {
    return std::is_pointer<T>::value ? 'p' : std::is_floating_point<T>::value ? 'f' : 'i';
}
template <class... A> static int emu_signature(void (*)(A...), char* kinds, int* sizes) {
    int i = 0;
    ((kinds[i] = emu_kind<A>(), sizes[i] = (int)sizeof(A), ++i), ...);
    return i;
}
template <class... A, size_t... I>
static void emu_call(void (*fn)(A...), void** argv, std::index_sequence<I...>) {
    fn(*reinterpret_cast<typename std::remove_cv<A>::type*>(argv[I])...);
}
template <class... A> static void emu_invoke(void (*fn)(A...), void** argv) {
    emu_call(fn, argv, std::index_sequence_for<A...>{});
}
"""
)


class EmulationError(RuntimeError):
    """The emulated kernel could not finish (a barrier that can never be met) or faulted (a misaligned
    16-byte load, which the GPU would refuse)."""


class FiberKernels:
    """The kernels of one CUDA source built for the host: `launch(name, grid, threads, args)`.

    `args` as a CuPy launch takes them: arrays (NumPy here, passed as pointers), None (a null
    pointer), np.int32 / np.int64 / np.float32 scalars, checked against the kernel's signature.
    """

    def __init__(self, code: str, kernels: Iterable[str], workdir: Path, options: Iterable[str] = ()):
        gxx = compiler()
        if gxx is None:
            raise RuntimeError("g++ is not installed")
        self.kernels = tuple(kernels)
        body = _host_source(code)
        glue = []
        for k in self.kernels:
            glue.append(
                f"static void emu_body_{k}(void* a) {{ emu_invoke({k}, (void**)a); }}\n"
                f'extern "C" int emu_launch_{k}(int gx, int gy, int threads, long long shmem, void** argv) '
                f"{{ return emu_run(emu_body_{k}, argv, gx, gy, threads, shmem); }}\n"
                f'extern "C" int emu_sig_{k}(char* kinds, int* sizes) '
                f"{{ return emu_signature({k}, kinds, sizes); }}\n"
            )
        glue.append('extern "C" const char* emu_last_error() { return emu_error; }\n')
        text = SHIM + body + "".join(glue)
        digest = hashlib.sha1((text + " ".join(options)).encode()).hexdigest()[:16]
        src = workdir / f"moe_host_{digest}.cpp"
        lib = workdir / f"moe_host_{digest}.so"  # one file per source: dlopen keeps a path's first library
        src.write_text(text)
        cmd = [gxx, "-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing"]
        cmd += [
            "-U_FORTIFY_SOURCE",
            "-D_FORTIFY_SOURCE=0",
            "-fPIC",
            "-shared",
            "-w",
            *gxx_defines(options),
            str(src),
            "-o",
            str(lib),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"g++ could not build the host emulation:\n{done.stderr[-6000:]}")
        self._lib = ctypes.CDLL(str(lib))
        self._lib.emu_last_error.restype = ctypes.c_char_p
        self._sig: dict[str, list[tuple[str, int]]] = {}
        for k in self.kernels:
            kinds = ctypes.create_string_buffer(64)
            sizes = (ctypes.c_int * 64)()
            n = getattr(self._lib, f"emu_sig_{k}")(kinds, sizes)
            self._sig[k] = [(kinds.raw[i : i + 1].decode(), sizes[i]) for i in range(n)]
            getattr(self._lib, f"emu_launch_{k}").argtypes = [
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_longlong,
                ctypes.c_void_p,
            ]
        self.launches: list[tuple[str, tuple[int, int]]] = []  # every launch, for tests to inspect

    def _arg(self, name: str, i: int, a: object, kind: str, size: int) -> ctypes._SimpleCData:
        where = f"{name} argument {i}"
        if kind == "p":
            if a is None:
                return ctypes.c_void_p(None)
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{where} is a pointer; got {type(a).__name__}")
            if not a.flags.c_contiguous:
                raise ValueError(f"{where}: array is not C-contiguous")
            return ctypes.c_void_p(a.ctypes.data)
        if isinstance(a, np.ndarray) or a is None:
            raise TypeError(f"{where} is a {size}-byte {'float' if kind == 'f' else 'integer'}; got an array")
        expected = {("i", 4): np.int32, ("i", 8): np.int64, ("f", 4): np.float32}[(kind, size)]
        if type(a) is not expected:
            raise TypeError(
                f"{where} must be {expected.__name__} for the kernel's C type; got {type(a).__name__}"
            )
        return {np.int32: ctypes.c_int32, np.int64: ctypes.c_int64, np.float32: ctypes.c_float}[expected](a)

    def launch(
        self, name: str, grid: tuple[int, int], threads: int, args: tuple, shared_mem: int = 0
    ) -> None:
        sig = self._sig[name]
        if len(args) != len(sig):
            raise TypeError(f"{name} takes {len(sig)} arguments, got {len(args)}")
        if threads % 32 or not 0 < threads <= 1024:
            raise ValueError(f"{name}: {threads} threads per block")
        values = [
            self._arg(name, i, a, kind, size)
            for i, (a, (kind, size)) in enumerate(zip(args, sig, strict=True))
        ]
        argv = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values]
        )
        self.launches.append((name, grid))
        rc = getattr(self._lib, f"emu_launch_{name}")(grid[0], grid[1], threads, int(shared_mem), argv)
        if rc:
            raise EmulationError(f"{name} grid {grid}: {self._lib.emu_last_error().decode()}")
