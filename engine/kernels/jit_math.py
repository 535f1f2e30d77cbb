"""Math the compiled CPU kernels share, as numba functions: imported by engine.kernels.jit only once
numba has imported (this module imports numba at its top), and reached from kernels as `jit.exp32`.

`exp32(x)`: e^x of a float32, in float32 arithmetic that the compiler vectorises (numba's `np.exp` on
a float32 is a call to the C library's expf per element: 8 ns a value here against NumPy's 2 ns, so
a fused kernel built on it lost to NumPy's separate passes). Cephes' expf: n = round(x log2 e),
r = x - n ln 2 (in two parts), e^r by a degree-7 polynomial, times 2^n built from exponent bits (in
two factors, so that results down to the smallest subnormal come out by the final rounding).
Within 2 ulp of the exact value over the whole float32 range (a test holds it against NumPy's
`np.exp`); 0 below -103.97, inf above 88.72, NaN for NaN.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def f32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the low 32 bits of the integer `bits` (an LLVM bitcast: free,
    vectorisable)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low = args[0] if bits.bitwidth == 32 else builder.trunc(args[0], ir.IntType(32))
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits), codegen


_LOG2E = np.float32(1.44269504088896341)
_C1 = np.float32(0.693359375)  # ln 2 = C1 - C2, C1 exact in few bits
_C2 = np.float32(-2.12194440e-4)
_P0 = np.float32(1.9875691500e-4)
_P1 = np.float32(1.3981999507e-3)
_P2 = np.float32(8.3334519073e-3)
_P3 = np.float32(4.1665795894e-2)
_P4 = np.float32(1.6666665459e-1)
_P5 = np.float32(5.0000001201e-1)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_LO = np.float32(-103.97208)  # below: e^x rounds to 0 in float32
_HI = np.float32(88.72284)  # above: e^x overflows
_ZERO = np.float32(0.0)
_INF = np.float32(np.inf)


@numba.njit(inline="always", nogil=True, error_model="numpy")
def exp32(x):
    """e^x, float32 in and out (see the module docstring)."""
    xc = min(max(x, _LO), _HI)
    fx = np.floor(xc * _LOG2E + _HALF)
    r = xc - fx * _C1
    r = r - fx * _C2
    z = r * r
    y = (((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5) * z + r + _ONE
    n = np.int32(fx)
    n1 = n >> 1
    n2 = n - n1
    y = y * f32_from_bits((n1 + 127) << 23) * f32_from_bits((n2 + 127) << 23)
    if x < _LO:
        y = _ZERO
    if x > _HI:
        y = _INF
    if x != x:
        y = x
    return y


# Row reductions in 16 lanes: a sequential `m = max(m, x[i])` or `total += x[i]` is a dependency chain
# LLVM may not reorder (no fastmath), so it stays scalar; 16 independent lanes, combined in a fixed
# order at the end, vectorise and give the same result on every run. Indices are unsigned offsets
# (numba wraps negative signed indices around, a select that blocks vectorisation).
_NINF = np.float32(-np.inf)


@numba.njit(inline="always", nogil=True, error_model="numpy")
def row_max(x, off, n, lanes):
    """max of x[off : off + n] (x flat float32, off unsigned); lanes: float32 scratch of 16."""
    body = np.uint64(n - n % 16)
    for k in range(16):
        lanes[k] = _NINF
    for v0 in range(np.uint64(0), body, np.uint64(16)):
        for k in range(np.uint64(16)):
            z = x[off + v0 + k]
            if z > lanes[k]:
                lanes[k] = z
    m = _NINF
    for k in range(16):
        if lanes[k] > m:
            m = lanes[k]
    for v in range(body, np.uint64(n)):
        if x[off + v] > m:
            m = x[off + v]
    return m


@numba.njit(inline="always", nogil=True, error_model="numpy")
def row_exp_sum(x, off, n, m, acc):
    """x[off : off + n] = exp(x - m) in place; returns their sum in float64; acc: float64 scratch of 16."""
    body = np.uint64(n - n % 16)
    for k in range(16):
        acc[k] = 0.0
    for v0 in range(np.uint64(0), body, np.uint64(16)):
        for k in range(np.uint64(16)):
            e = exp32(x[off + v0 + k] - m)
            x[off + v0 + k] = e
            acc[k] += np.float64(e)
    total = 0.0
    for k in range(16):
        total += acc[k]
    for v in range(body, np.uint64(n)):
        e = exp32(x[off + v] - m)
        x[off + v] = e
        total += np.float64(e)
    return total


@numba.njit(inline="always", nogil=True, error_model="numpy")
def row_dot(x, xo, y, yo, n, acc):
    """sum of x[xo + i] y[yo + i] for i < n, in float64 (offsets unsigned); acc: float64 scratch of 16."""
    body = np.uint64(n - n % 16)
    for k in range(16):
        acc[k] = 0.0
    for v0 in range(np.uint64(0), body, np.uint64(16)):
        for k in range(np.uint64(16)):
            acc[k] += np.float64(x[xo + v0 + k]) * np.float64(y[yo + v0 + k])
    total = 0.0
    for k in range(16):
        total += acc[k]
    for v in range(body, np.uint64(n)):
        total += np.float64(x[xo + v]) * np.float64(y[yo + v])
    return total
