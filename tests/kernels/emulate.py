"""Runs a kernel source's CUDA C++ on the CPU, to check its arithmetic and indexing without a GPU.

Two emulators, both building the source unchanged (apart from its CUDA header includes) with g++
over a small shim that maps the CUDA built-ins onto C++20:

- `HostKernels`: each CUDA block runs as `threads` std::threads meeting at a std::barrier, one
  block after another; one fixed parameter list for every kernel of the source (the dequant tests).
- `FiberKernels`: each CUDA thread is a fiber (ucontext) on one OS thread, so barriers cost a user-
  space switch instead of a futex. 1-, 2- and 3-D grids and blocks, dynamic shared memory
  (`extern __shared__`), warp shuffles and votes (`__shfl_xor_sync`, `__shfl_sync`,
  `__shfl_down_sync`, `__ballot_sync`, `__any_sync`, `__all_sync`: every lane of the warp must
  take part, as in the engine's kernels), `__syncthreads_count/_or/_and`, atomics. Each kernel's
  parameter types are read off the compiled code, and every launch checks its arguments against
  them kind for kind and size for size (a pointer for a pointer, an np.int32 for an `int`, ...),
  the mistake that corrupts a CuPy launch silently. Threads of a block run in index order between
  barriers, or in reverse order (`reverse=True`): a missing `__syncthreads` between a write and a
  read by another thread shows in one order or the other. Dynamic shared memory starts filled
  with 0xFF bytes (NaN floats), so a read of shared memory nothing wrote shows too. A barrier
  that some live threads never reach (a deadlock on a GPU) is an error, not a hang.

What it checks: that every value the kernel computes and every index it takes is what the NumPy
reference says (g++ with -ffp-contract=off rounds each float operation as the GPU's
`__fmul_rn`/`__fadd_rn` do; `expf`, `logf` and `rsqrtf` are glibc's, within an ulp or two of the
GPU's). What it does not: the GPU's memory model, coalescing, timing, or the GPU compiler's code
generation; the parity tests on a GPU do that.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# The bit casts, round-to-nearest arithmetic, byte permute and half/bfloat16 conversions of CUDA, on the host:
# every emulator's shim ends its common part with these.
BIT_SHIM = r"""
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }

static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}

struct emu_half { unsigned short bits; };
static inline emu_half __ushort_as_half(unsigned short b) { return {b}; }
static inline float __half2float(emu_half h) {
    const unsigned s = (h.bits >> 15) & 1, e = (h.bits >> 10) & 31, m = h.bits & 1023;
    if (e == 0) {
        const float f = std::ldexp((float)m, -24);  // zero or subnormal, exact
        return s ? -f : f;
    }
    if (e == 31) return __uint_as_float((s << 31) | 0x7f800000u | (m << 13));
    return __uint_as_float((s << 31) | ((e + 112) << 23) | (m << 13));
}

struct emu_bf16 { unsigned short bits; };
static inline emu_bf16 __float2bfloat16_rn(float f) {
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {(unsigned short)0x7fff};  // NaN, as CUDA gives it
    return {(unsigned short)((u + 0x7fffu + ((u >> 16) & 1)) >> 16)};
}
static inline unsigned short __bfloat16_as_ushort(emu_bf16 b) { return b.bits; }
"""

SHIM = (
    r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

struct uint4 { unsigned int x, y, z, w; };
struct float4 { float x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

struct emu_dim3 { unsigned x, y, z; };
static thread_local emu_dim3 blockIdx, threadIdx;
static std::barrier<>* emu_barrier;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict

static inline void __syncthreads() { emu_barrier->arrive_and_wait(); }
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline void __stwb(T* p, T v) { *p = v; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
"""
    + BIT_SHIM
)

_CPP_TYPES = {"ptr": "const void*", "i64": "long long", "i32": "int"}
_CTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_longlong, "i32": ctypes.c_int}


def compiler() -> str | None:
    """The C++ compiler the emulator uses (g++ with C++20), or None when there is none."""
    return shutil.which("g++")


class HostKernels:
    """The kernels of one CUDA source built for the host; launch(name, grid, threads, *args)."""

    def __init__(self, code: str, params: tuple[str, ...], workdir: Path, options: Sequence[str] = ()):
        """`params`: the kernels' parameter kinds in order, each "ptr", "i64" or "i32"; `options`: the
        source's NVRTC options, of which the -D macro definitions are given to g++ too."""
        gxx = compiler()
        if gxx is None:
            raise RuntimeError("g++ is not installed")
        body = re.sub(r"^\s*#include\s*<cuda_(fp16|bf16)\.h>\s*$", "", code, flags=re.M)
        decl = ", ".join(f"{_CPP_TYPES[p]} a{i}" for i, p in enumerate(params))
        names = ", ".join(f"a{i}" for i in range(len(params)))
        launcher = f"""
typedef void (*emu_fn)({", ".join(_CPP_TYPES[p] for p in params)});
extern "C" int emu_launch(const void* fn, int grid, int threads, {decl}) {{
    std::barrier<> in_block(threads), end_block(threads);
    emu_barrier = &in_block;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {{
            threadIdx = {{(unsigned)t, 0, 0}};
            for (int b = 0; b < grid; ++b) {{
                blockIdx = {{(unsigned)b, 0, 0}};
                ((emu_fn)fn)({names});
                end_block.arrive_and_wait();
            }}
        }});
    for (auto& th : pool) th.join();
    return 0;
}}
"""
        src = workdir / "kernels_host.cpp"
        lib = workdir / "kernels_host.so"
        src.write_text(SHIM + body + launcher)
        cmd = [gxx, "-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]
        cmd += ["-pthread", "-w", *gxx_defines(options), str(src), "-o", str(lib)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"g++ could not build the host emulation:\n{done.stderr[-4000:]}")
        self._lib = ctypes.CDLL(str(lib))
        self._lib.emu_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int] + [
            _CTYPES[p] for p in params
        ]
        self._params = params

    def launch(self, name: str, grid: int, threads: int, *args: object) -> None:
        fn = ctypes.cast(getattr(self._lib, name), ctypes.c_void_p)
        self._lib.emu_launch(fn, grid, threads, *args)


# ----------------------------------------------------------------------------------------------
# FiberKernels: every CUDA thread a fiber

FIBER_SHIM = (
    r"""
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <memory>
#include <vector>
#include <csetjmp>
#include <ucontext.h>

struct uint4 { unsigned int x, y, z, w; };
struct int4 { int x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct uint2 { unsigned int x, y; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }

struct emu_dim3 { unsigned x, y, z; };
static emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
static const int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))

template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline void __stwb(T* p, T v) { *p = v; }
template <class T> static inline void __stcs(T* p, T v) { *p = v; }
template <class T> static inline T __ldcs(const T* p) { return *p; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
"""
    + BIT_SHIM
    + r"""typedef emu_bf16 __nv_bfloat16;
static inline emu_bf16 __ushort_as_bfloat16(unsigned short b) { return {b}; }
static inline float __bfloat162float(emu_bf16 b) { return __uint_as_float((unsigned)b.bits << 16); }

template <class T> static inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
template <class T> static inline T atomicMax(T* p, T v) { T old = *p; *p = old > v ? old : v; return old; }
template <class T> static inline T atomicMin(T* p, T v) { T old = *p; *p = old < v ? old : v; return old; }
template <class T> static inline T atomicOr(T* p, T v) { T old = *p; *p = old | v; return old; }
template <class T> static inline T atomicExch(T* p, T v) { T old = *p; *p = v; return old; }
static inline void __threadfence() {}
static inline void __threadfence_block() {}

// ---- fibers -------------------------------------------------------------------------------------
enum { EMU_RUN = 0, EMU_AT_BLOCK = 1, EMU_AT_WARP = 2, EMU_DONE = 3 };
// a fiber starts once through makecontext/setcontext; after that, switches are GCC's
// __builtin_setjmp/__builtin_longjmp (no signal-mask system call per switch, unlike swapcontext: ~50x
// cheaper; and none of glibc _longjmp's unwinding of pthread cleanup handlers, a sixth of the
// emulator's time). __builtin_longjmp must not be called from the function of its __builtin_setjmp.
typedef void* emu_jb[5];
__attribute__((noinline)) static void emu_jump(emu_jb& b) { __builtin_longjmp(b, 1); }
struct emu_fiber {
    ucontext_t ctx;
    emu_jb jb;
    int started, state, lin, pred, phase;
    emu_dim3 tid;
};
static std::vector<emu_fiber> emu_fibers;
static emu_jb emu_sched;
static int emu_cur;
static int emu_bar_result, emu_bar_total;  // predicate count and threads of the last block barrier
static unsigned char* emu_dyn_smem;
static void (*emu_call)(void**);
static void** emu_args;
static uint64_t emu_slots[32][2][32];  // [warp][phase][lane]
static unsigned emu_warp_live[32];  // lanes released together from a warp's last warp barrier

static void emu_yield(int state) {
    emu_fibers[emu_cur].state = state;
    if (!__builtin_setjmp(emu_fibers[emu_cur].jb)) emu_jump(emu_sched);
}
static void emu_fiber_main() {
    for (;;) {  // one call of the kernel per block: the scheduler resumes the fiber for the next block
        emu_call(emu_args);
        emu_yield(EMU_DONE);
    }
}

static inline void __syncthreads() { emu_yield(EMU_AT_BLOCK); }
static inline int __syncthreads_count(int p) {
    emu_fibers[emu_cur].pred = p != 0;
    emu_yield(EMU_AT_BLOCK);
    return emu_bar_result;
}
static inline int __syncthreads_or(int p) { return __syncthreads_count(p) > 0; }
static inline int __syncthreads_and(int p) { return __syncthreads_count(p) == emu_bar_total; }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_yield(EMU_AT_WARP); }

static inline uint64_t* emu_exchange(uint64_t v, int* lane) {
    emu_fiber& f = emu_fibers[emu_cur];
    const int w = f.lin >> 5;
    *lane = f.lin & 31;
    f.phase ^= 1;
    const int ph = f.phase;
    emu_slots[w][ph][*lane] = v;
    emu_yield(EMU_AT_WARP);
    return emu_slots[w][ph];
}
template <class T> static inline uint64_t emu_bits(T v) {
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T> static inline T emu_from(uint64_t b) { T v; std::memcpy(&v, &b, sizeof(T)); return v; }

template <class T> static inline T __shfl_xor_sync(unsigned, T v, int m, int width = 32) {
    int lane;
    uint64_t* s = emu_exchange(emu_bits(v), &lane);
    const int src = lane ^ m;
    return emu_from<T>(s[(src / width == lane / width) ? src : lane]);
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    int lane;
    uint64_t* s = emu_exchange(emu_bits(v), &lane);
    return emu_from<T>(s[(lane & ~(width - 1)) + (src & (width - 1))]);
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
    int lane;
    uint64_t* s = emu_exchange(emu_bits(v), &lane);
    const int src = lane + (int)d;
    return emu_from<T>(s[(src / width == lane / width) ? src : lane]);
}
template <class T> static inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
    int lane;
    uint64_t* s = emu_exchange(emu_bits(v), &lane);
    const int src = lane - (int)d;
    return emu_from<T>(s[(src >= 0 && src / width == lane / width) ? src : lane]);
}
static inline unsigned __ballot_sync(unsigned, int p) {
    int lane;
    uint64_t* s = emu_exchange(p != 0, &lane);
    const unsigned live = emu_warp_live[emu_fibers[emu_cur].lin >> 5];
    unsigned r = 0;
    for (int i = 0; i < 32; ++i)
        if (((live >> i) & 1) && s[i]) r |= 1u << i;
    return r;
}
static inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0; }
static inline int __all_sync(unsigned m, int p) {
    const unsigned r = __ballot_sync(m, p);
    return r == emu_warp_live[emu_fibers[emu_cur].lin >> 5];
}
"""
)

FIBER_LAUNCHER = r"""
template <class... A, size_t... I>
static void emu_invoke_impl(void (*f)(A...), void** a, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(a[I])...);
}
template <class... A> static void emu_invoke(void (*f)(A...), void** a) {
    emu_invoke_impl(f, a, std::index_sequence_for<A...>{});
}
template <class T> static void emu_code(std::string& s) {
    using U = std::remove_cv_t<T>;
    if (std::is_pointer_v<U>) s += "p";
    else if (std::is_floating_point_v<U>) s += "f" + std::to_string(sizeof(U));
    else if (std::is_signed_v<U>) s += "i" + std::to_string(sizeof(U));
    else s += "u" + std::to_string(sizeof(U));
    s += ",";
}
template <class... A> static const char* emu_signature(void (*)(A...)) {
    static std::string s;
    s.clear();
    (emu_code<A>(s), ...);
    return s.c_str();
}

static const size_t EMU_STACK = 64 * 1024;

extern "C" int emu_launch(void (*call)(void**), void** args, int gx, int gy, int gz, int bx, int by,
                          int bz, long long shmem, int reverse, char* err, int errlen) {
    const int n = bx * by * bz;
    if (n <= 0 || n > 1024) { snprintf(err, errlen, "block of %d threads", n); return 1; }
    // the fibers' stacks, kept from launch to launch (a fresh zeroed allocation each launch cost more
    // than most launches of the tiny test models); a stack's bytes are never read before written
    static std::unique_ptr<char[]> stacks;
    static size_t stacks_size = 0;
    if (stacks_size < (size_t)n * EMU_STACK) {
        stacks.reset(new char[(size_t)n * EMU_STACK]);
        stacks_size = (size_t)n * EMU_STACK;
    }
    std::vector<unsigned char> smem((size_t)shmem + 16, 0xff);
    emu_dyn_smem = smem.data();
    emu_call = call;
    emu_args = args;
    blockDim = {(unsigned)bx, (unsigned)by, (unsigned)bz};
    gridDim = {(unsigned)gx, (unsigned)gy, (unsigned)gz};
    emu_fibers.assign(n, emu_fiber{});
    for (int t = 0; t < n; ++t) {  // each fiber made once a launch, and run block after block
        emu_fiber& f = emu_fibers[t];
        f.lin = t;
        f.started = 0;
        f.tid = {(unsigned)(t % bx), (unsigned)((t / bx) % by), (unsigned)(t / (bx * by))};
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = stacks.get() + (size_t)t * EMU_STACK;
        f.ctx.uc_stack.ss_size = EMU_STACK;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, emu_fiber_main, 0);
    }
    for (int bzi = 0; bzi < gz; ++bzi)
    for (int byi = 0; byi < gy; ++byi)
    for (int bxi = 0; bxi < gx; ++bxi) {
        blockIdx = {(unsigned)bxi, (unsigned)byi, (unsigned)bzi};
        std::fill(smem.begin(), smem.end(), 0xff);
        for (int t = 0; t < n; ++t) {
            emu_fiber& f = emu_fibers[t];
            f.state = EMU_RUN;
            f.phase = 0;
            f.pred = 0;
        }
        for (;;) {
            for (int k = 0; k < n; ++k) {
                const int t = reverse ? n - 1 - k : k;
                if (emu_fibers[t].state != EMU_RUN) continue;
                emu_cur = t;
                threadIdx = emu_fibers[t].tid;
                if (!__builtin_setjmp(emu_sched)) {
                    if (emu_fibers[t].started) emu_jump(emu_fibers[t].jb);
                    emu_fibers[t].started = 1;
                    setcontext(&emu_fibers[t].ctx);
                }
            }
            int alive = 0, at_block = 0, count = 0;
            for (auto& f : emu_fibers) {
                alive += f.state != EMU_DONE;
                at_block += f.state == EMU_AT_BLOCK;
                count += f.state == EMU_AT_BLOCK && f.pred;
            }
            if (alive == 0) break;
            bool released = false;
            for (int w = 0; w * 32 < n; ++w) {  // a warp whose live lanes all wait at a warp barrier
                int live = 0, waiting = 0;
                for (int t = w * 32; t < std::min(n, w * 32 + 32); ++t) {
                    live += emu_fibers[t].state != EMU_DONE;
                    waiting += emu_fibers[t].state == EMU_AT_WARP;
                }
                if (live && waiting == live) {
                    emu_warp_live[w] = 0;
                    for (int t = w * 32; t < std::min(n, w * 32 + 32); ++t)
                        if (emu_fibers[t].state == EMU_AT_WARP) {
                            emu_fibers[t].state = EMU_RUN;
                            emu_warp_live[w] |= 1u << (t - w * 32);
                        }
                    released = true;
                }
            }
            if (!released && at_block == alive) {
                emu_bar_result = count;
                emu_bar_total = at_block;
                for (auto& f : emu_fibers) {
                    if (f.state == EMU_AT_BLOCK) { f.state = EMU_RUN; f.pred = 0; }
                }
                released = true;
            }
            if (!released) {
                snprintf(err, errlen,
                         "deadlock in block (%d,%d,%d): %d live threads, %d at __syncthreads, the rest at a "
                         "warp barrier with lanes of their warp elsewhere", bxi, byi, bzi, alive, at_block);
                return 2;
            }
        }
    }
    return 0;
}
"""

_DYN_SMEM = re.compile(
    r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w ]*?)\s+(\w+)\s*\[\s*\]\s*;"
)
_CTYPE_OF = {
    "i1": (np.int8, ctypes.c_int8),
    "u1": (np.uint8, ctypes.c_uint8),
    "i2": (np.int16, ctypes.c_int16),
    "u2": (np.uint16, ctypes.c_uint16),
    "i4": (np.int32, ctypes.c_int32),
    "u4": (np.uint32, ctypes.c_uint32),
    "i8": (np.int64, ctypes.c_int64),
    "u8": (np.uint64, ctypes.c_uint64),
    "f4": (np.float32, ctypes.c_float),
    "f8": (np.float64, ctypes.c_double),
}


class EmulationError(RuntimeError):
    """A launch the GPU would refuse or hang on: wrong argument types, a deadlock, a bad block."""


def _host_source(code: str) -> str:
    body = re.sub(r"^\s*#include\s*<cuda_(fp16|bf16)\.h>\s*$", "", code, flags=re.M)
    return _DYN_SMEM.sub(lambda m: f"{m.group(1)}* {m.group(2)} = ({m.group(1)}*)emu_dyn_smem;", body)


class FiberKernels:
    """The kernels of one CUDA source built for the host, every CUDA thread a fiber.

    `launch(name, grid, block, args, shared_mem=0, reverse=False)` runs kernel `name` with
    `args` as a CuPy launch takes them: arrays (NumPy here) for pointers, NumPy scalars of the
    exact C type for values, None for a null pointer.
    """

    def __init__(self, code: str, kernels: Sequence[str], workdir: Path, options: Sequence[str] = ()):
        gxx = compiler()
        if gxx is None:
            raise RuntimeError("g++ is not installed")
        tramp = "".join(
            f'extern "C" void emu_call_{k}(void** a) {{ emu_invoke(&{k}, a); }}\n'
            f'extern "C" const char* emu_sig_{k}() {{ return emu_signature(&{k}); }}\n'
            for k in kernels
        )
        text = FIBER_SHIM + _host_source(code) + FIBER_LAUNCHER + tramp
        digest = hashlib.sha1((text + " ".join(options)).encode()).hexdigest()[:16]
        src = workdir / f"fiber_{digest}.cpp"
        lib = workdir / f"fiber_{digest}.so"
        if not lib.exists():
            src.write_text(text)
            cmd = [gxx, "-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]
            # _longjmp between fiber stacks: the fortified longjmp would reject the stack switch
            cmd += ["-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0", "-w", *gxx_defines(options)]
            cmd += [str(src), "-o", str(lib)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"g++ could not build the fiber emulation:\n{done.stderr[-6000:]}")
        self._lib = ctypes.CDLL(str(lib))
        self._lib.emu_launch.argtypes = (
            [ctypes.c_void_p, ctypes.c_void_p]
            + [ctypes.c_int] * 6
            + [
                ctypes.c_longlong,
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_int,
            ]
        )
        self._sig: dict[str, list[str]] = {}
        for k in kernels:
            fn = getattr(self._lib, f"emu_sig_{k}")
            fn.restype = ctypes.c_char_p
            self._sig[k] = [c for c in fn().decode().split(",") if c]

    def signature(self, name: str) -> list[str]:
        """The kernel's parameter kinds: "p" pointer, "i4" int, "u4" unsigned, "f4" float, ..."""
        return self._sig[name]

    def launch(
        self,
        name: str,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        args: Sequence[object],
        shared_mem: int = 0,
        reverse: bool = False,
    ) -> None:
        sig = self._sig.get(name)
        if sig is None:
            raise KeyError(f"kernel {name!r} was not built; built: {', '.join(self._sig)}")
        if len(args) != len(sig):
            raise EmulationError(f"{name} takes {len(sig)} arguments ({','.join(sig)}), given {len(args)}")
        keep: list[object] = []
        ptrs = (ctypes.c_void_p * max(1, len(sig)))()
        for i, (code, a) in enumerate(zip(sig, args, strict=True)):
            if code == "p":
                if a is None:
                    obj = ctypes.c_void_p(0)
                elif isinstance(a, np.ndarray):
                    obj = ctypes.c_void_p(a.ctypes.data)
                else:
                    raise EmulationError(f"{name} argument {i} is a pointer; given {type(a).__name__}")
            else:
                want, ctype = _CTYPE_OF[code]
                if type(a) is not want:
                    raise EmulationError(
                        f"{name} argument {i} is a {code} ({np.dtype(want).name}); given "
                        f"{type(a).__name__} {a!r}: a CuPy launch would pass the wrong bytes"
                    )
                obj = ctype(a.item())
            keep.append(obj)
            ptrs[i] = ctypes.cast(ctypes.pointer(obj), ctypes.c_void_p)
        g = _dims(grid)
        b = _dims(block)
        if min(g) <= 0:
            return
        err = ctypes.create_string_buffer(512)
        fn = ctypes.cast(getattr(self._lib, f"emu_call_{name}"), ctypes.c_void_p)
        rc = self._lib.emu_launch(fn, ptrs, *g, *b, int(shared_mem), int(reverse), err, len(err))
        if rc != 0:
            raise EmulationError(f"{name}: {err.value.decode()}")


def gxx_defines(options: Sequence[str]) -> list[str]:
    """The -D macro definitions among a source's NVRTC options (g++ reads them alike)."""
    return [o for o in options if o.startswith("-D")]


def _dims(d: int | Sequence[int]) -> tuple[int, int, int]:
    t = (int(d),) if isinstance(d, (int, np.integer)) else tuple(int(x) for x in d)
    return (t + (1, 1, 1))[:3]  # type: ignore[return-value]
