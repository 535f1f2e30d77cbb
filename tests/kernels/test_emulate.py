"""The fiber emulator (tests/kernels/emulate.py `FiberKernels`) itself: that it runs CUDA semantics the
kernels rely on, and that it catches the mistakes it is there to catch (a missing barrier, a
deadlocked barrier, an argument of the wrong C type)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.emulate import EmulationError, FiberKernels, compiler

pytestmark = pytest.mark.skipif(compiler() is None, reason="the emulator needs g++")

CODE = r"""
extern "C" __global__ void reduce(const float* __restrict__ x, float* __restrict__ out, int n, float s) {
    extern __shared__ __align__(16) float sm[];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    sm[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    float v = sm[blockDim.x - 1 - threadIdx.x];  // another thread's value: needs the barrier
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int c = __syncthreads_count(threadIdx.x % 3 == 0);
    const unsigned b = __ballot_sync(0xffffffffu, threadIdx.x & 1);
    if (i < n) out[i] = v * s + c + (b == 0xaaaaaaaau ? 0.5f : 0.0f);
}
extern "C" __global__ void racy(const float* __restrict__ x, float* __restrict__ out) {
    __shared__ float sm[64];
    sm[threadIdx.x] = x[threadIdx.x];
    out[threadIdx.x] = sm[63 - threadIdx.x];  // no __syncthreads: a race
}
extern "C" __global__ void deadlock(float* out) {
    float v = 1.0f;
    if (threadIdx.x < 48) __syncthreads();  // half of warp 1 waits here, the other half in a shuffle
    else v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}
extern "C" __global__ void grid3(int* out) {
    const int b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const int t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    out[b * blockDim.x * blockDim.y * blockDim.z + t] = 1000 * b + t;
}
"""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> FiberKernels:
    return FiberKernels(CODE, ("reduce", "racy", "deadlock", "grid3"), tmp_path_factory.mktemp("fibers"))


def test_shared_memory_shuffles_and_votes(kernels):
    x = np.arange(100, dtype=np.float32)
    out = np.full(100, np.nan, np.float32)
    kernels.launch("reduce", 2, 64, (x, out, np.int32(100), np.float32(2.0)), shared_mem=64 * 4)
    xs = np.concatenate([x, np.zeros(28, np.float32)]).reshape(2, 64)
    for blk in range(2):
        rev = xs[blk][::-1]
        for t in range(64):
            i = blk * 64 + t
            if i < 100:
                warp = rev[(t // 32) * 32 : (t // 32) * 32 + 32]
                assert out[i] == warp.sum() * 2 + 22 + 0.5, (blk, t)


def test_a_missing_barrier_shows_in_one_thread_order(kernels):
    x = np.arange(64, dtype=np.float32)
    fwd = np.full(64, np.nan, np.float32)
    rev = np.full(64, np.nan, np.float32)
    kernels.launch("racy", 1, 64, (x, fwd))
    kernels.launch("racy", 1, 64, (x, rev), reverse=True)
    assert not np.array_equal(fwd, rev)


def test_deadlock_is_an_error(kernels):
    with pytest.raises(EmulationError, match="deadlock"):
        kernels.launch("deadlock", 1, 64, (np.zeros(64, np.float32),))


def test_argument_types_are_checked(kernels):
    x = np.zeros(4, np.float32)
    with pytest.raises(EmulationError, match="argument 2 is a i4"):
        kernels.launch("reduce", 1, 32, (x, x, np.int64(4), np.float32(1)))
    with pytest.raises(EmulationError, match="argument 3 is a f4"):
        kernels.launch("reduce", 1, 32, (x, x, np.int32(4), 1.0))
    with pytest.raises(EmulationError, match="takes 4 arguments"):
        kernels.launch("reduce", 1, 32, (x, x))
    assert kernels.signature("reduce") == ["p", "p", "i4", "f4"]


def test_three_dimensional_grids_and_blocks(kernels):
    out = np.full(3 * 2 * 2 * 4 * 2 * 4, -1, np.int32)
    kernels.launch("grid3", (3, 2, 2), (4, 2, 4), (out,))
    per = 4 * 2 * 4
    expect = np.array([1000 * b + t for b in range(12) for t in range(per)], np.int32)
    np.testing.assert_array_equal(out, expect)
