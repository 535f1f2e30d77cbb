"""Runs a kernel source's CUDA C++ on the CPU, to check its arithmetic and indexing without a GPU.

A small shim maps the CUDA built-ins the engine's kernels use (`threadIdx`, `blockIdx`,
`__shared__`, `__syncthreads`, `__ldg`, `__stwb`, `__byte_perm`, half and bfloat16 conversions,
`__fmul_rn` and friends) onto C++20, and g++ builds the source unchanged apart from its CUDA
header includes. Each CUDA block runs as `threads` std::threads meeting at a std::barrier, one
block after another.

What it checks: that every value the kernel computes and every index it takes is what the NumPy
reference says, bit for bit (g++ with -ffp-contract=off rounds each float operation as the GPU's
`__fmul_rn`/`__fadd_rn` do). What it does not: the GPU's memory model, coalescing, timing, or the
GPU compiler's code generation; the parity tests on a GPU do that.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

SHIM = r"""
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

static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }

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

_CPP_TYPES = {"ptr": "const void*", "i64": "long long", "i32": "int"}
_CTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_longlong, "i32": ctypes.c_int}


def compiler() -> str | None:
    """The C++ compiler the emulator uses (g++ with C++20), or None when there is none."""
    return shutil.which("g++")


class HostKernels:
    """The kernels of one CUDA source built for the host; launch(name, grid, threads, *args)."""

    def __init__(self, code: str, params: tuple[str, ...], workdir: Path):
        """`params`: the kernels' parameter kinds in order, each "ptr", "i64" or "i32"."""
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
        cmd += ["-pthread", "-w", str(src), "-o", str(lib)]
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
