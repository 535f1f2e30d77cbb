"""The CPU twin of `engine.kernels.blockq.xwt_ref`: x @ w^T straight from a BlockQ's int8 codes, each
weight formed as scale * code - offset in registers as it is used, never stored as float32.

Why: an MoE expert's product has few rows (~32 per expert in a batch of 256 tokens with top-8 of 64
experts). OpenBLAS then spends as long reading and packing the expert's float32 weights (a fresh
2-4 MiB per expert, from memory) as multiplying; reading 1.25 bytes a weight instead of 4 and no
packing made one OLMoE-shaped layer's experts 1.36-1.52x faster on two workers beside OpenBLAS's
AVX2 kernel, 1.07-1.10x beside its AVX-512 one (bench/expert_codes.py, bench/CPU_NOTES.md), and the
weight store keeps the experts at 2.5 bytes a value (3 for groups of 16; both layouts) instead of 4.

How: 4 rows of w (codes and their group's scale and offset) against 4 rows of x, 16 sums that LLVM
keeps in vector registers along the shared axis (the kernel is compiled with reassociation,
engine.kernels.jit: a product's sums have no order of their own, as in BLAS); left-over rows of x
one at a time. Within float32 rounding of the reference (tests/kernels/test_blockq.py). Runs the
reference while compiled kernels are off, for a float type other than float32, and for a w whose
row count is not a multiple of 4.
"""

from __future__ import annotations

import numpy as np

from . import jit
from .blockq import BlockQ, xwt_ref

ROWS = 64  # rows of x per kernel call: 64 x 4096 float32 is 1 MiB, what an L2 cache holds


@jit.kernel(reassociate=True)
def _w4(q, s, m, i, k, shift, down):
    """w[i:i+4, k] formed from the codes: groups along w's rows, w[i, k] = q[i, k] s[i, k >> shift] -
    m[i, k >> shift], or with `down` down its columns, w[i, k] = q[i, k] s[i >> shift, k] - m[...]
    (the 4 rows then share their group: 4 divides 16 and 32)."""
    if down:
        g = i >> shift
        sk, mk = s[g, k], m[g, k]
        return (np.float32(q[i, k]) * sk - mk, np.float32(q[i + 1, k]) * sk - mk,
                np.float32(q[i + 2, k]) * sk - mk, np.float32(q[i + 3, k]) * sk - mk)  # fmt: skip
    g = k >> shift
    return (np.float32(q[i, k]) * s[i, g] - m[i, g], np.float32(q[i + 1, k]) * s[i + 1, g] - m[i + 1, g],
            np.float32(q[i + 2, k]) * s[i + 2, g] - m[i + 2, g],
            np.float32(q[i + 3, k]) * s[i + 3, g] - m[i + 3, g])  # fmt: skip


@jit.kernel(reassociate=True)
def _xwt(x, q, s, m, y, shift, down):  # y = x @ w^T, w's values as `_w4` forms them
    n, K = x.shape
    N = q.shape[0]
    n4 = n - n % 4
    for i in range(0, N, 4):
        for j in range(0, n4, 4):
            a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0.0)
            a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = np.float32(0.0)
            for k in range(K):
                w0, w1, w2, w3 = _w4(q, s, m, i, k, shift, down)
                x0, x1, x2, x3 = x[j, k], x[j + 1, k], x[j + 2, k], x[j + 3, k]
                a00 += w0 * x0
                a01 += w0 * x1
                a02 += w0 * x2
                a03 += w0 * x3
                a10 += w1 * x0
                a11 += w1 * x1
                a12 += w1 * x2
                a13 += w1 * x3
                a20 += w2 * x0
                a21 += w2 * x1
                a22 += w2 * x2
                a23 += w2 * x3
                a30 += w3 * x0
                a31 += w3 * x1
                a32 += w3 * x2
                a33 += w3 * x3
            y[j, i], y[j + 1, i], y[j + 2, i], y[j + 3, i] = a00, a01, a02, a03
            y[j, i + 1], y[j + 1, i + 1], y[j + 2, i + 1], y[j + 3, i + 1] = a10, a11, a12, a13
            y[j, i + 2], y[j + 1, i + 2], y[j + 2, i + 2], y[j + 3, i + 2] = a20, a21, a22, a23
            y[j, i + 3], y[j + 1, i + 3], y[j + 2, i + 3], y[j + 3, i + 3] = a30, a31, a32, a33
        for j in range(n4, n):
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for k in range(K):
                w0, w1, w2, w3 = _w4(q, s, m, i, k, shift, down)
                xv = x[j, k]
                a0 += w0 * xv
                a1 += w1 * xv
                a2 += w2 * xv
                a3 += w3 * xv
            y[j, i], y[j, i + 1], y[j, i + 2], y[j, i + 3] = a0, a1, a2, a3


# The group's shift and the layout must be constants where the kernel runs: LLVM vectorised
# `k >> shift` with a constant shift and not with one given at run time (9x slower). Each wrapper
# calls the body with its constants, and LLVM inlines it.


@jit.kernel(reassociate=True)
def _xwt_in32(x, q, s, m, y):
    _xwt(x, q, s, m, y, 5, False)


@jit.kernel(reassociate=True)
def _xwt_in16(x, q, s, m, y):
    _xwt(x, q, s, m, y, 4, False)


@jit.kernel(reassociate=True)
def _xwt_out32(x, q, s, m, y):
    _xwt(x, q, s, m, y, 5, True)


@jit.kernel(reassociate=True)
def _xwt_out16(x, q, s, m, y):
    _xwt(x, q, s, m, y, 4, True)


_KERNELS = {("in", 32): _xwt_in32, ("in", 16): _xwt_in16, ("out", 32): _xwt_out32, ("out", 16): _xwt_out16}


@jit.kernel
def _swap(a, b, mask, shift):
    """Swap the pieces of two 64-bit rows that a transpose exchanges: b's pieces under `mask` with a's
    `shift` bits above them."""
    t = ((a >> shift) ^ b) & mask
    return a ^ (t << shift), b ^ t


@jit.kernel
def _t8(x0, x1, x2, x3, x4, x5, x6, x7):
    """The transpose of an 8 x 8 block of bytes given as eight little-endian 64-bit rows: three rounds
    that swap 1-, 2- and 4-byte pieces between rows 1, 2 and 4 apart."""
    m, s = np.uint64(0x00FF00FF00FF00FF), np.uint64(8)
    x0, x1 = _swap(x0, x1, m, s)
    x2, x3 = _swap(x2, x3, m, s)
    x4, x5 = _swap(x4, x5, m, s)
    x6, x7 = _swap(x6, x7, m, s)
    m, s = np.uint64(0x0000FFFF0000FFFF), np.uint64(16)
    x0, x2 = _swap(x0, x2, m, s)
    x1, x3 = _swap(x1, x3, m, s)
    x4, x6 = _swap(x4, x6, m, s)
    x5, x7 = _swap(x5, x7, m, s)
    m, s = np.uint64(0x00000000FFFFFFFF), np.uint64(32)
    x0, x4 = _swap(x0, x4, m, s)
    x1, x5 = _swap(x1, x5, m, s)
    x2, x6 = _swap(x2, x6, m, s)
    x3, x7 = _swap(x3, x7, m, s)
    return x0, x1, x2, x3, x4, x5, x6, x7


@jit.kernel
def _transpose_bytes(a, out, tile):
    """out = a^T for int8 matrices seen as 64-bit words: a (n, k / 8), out (k, n / 8), n and k
    multiples of 8; 8 x 8 blocks, `tile` words of a's rows at a time (the output rows they write stay
    in cache)."""
    n, k8 = a.shape
    for j0 in range(0, k8, tile):
        for i in range(0, n, 8):
            w = i >> 3
            for j in range(j0, min(j0 + tile, k8)):
                y = _t8(a[i, j], a[i + 1, j], a[i + 2, j], a[i + 3, j], a[i + 4, j], a[i + 5, j], a[i + 6, j],
                        a[i + 7, j])  # fmt: skip
                c = 8 * j
                out[c, w], out[c + 1, w], out[c + 2, w], out[c + 3, w] = y[0], y[1], y[2], y[3]
                out[c + 4, w], out[c + 5, w], out[c + 6, w], out[c + 7, w] = y[4], y[5], y[6], y[7]


def transposed_cpu(w: BlockQ) -> BlockQ:
    """CPU twin of `BlockQ.transposed` (the same values, groups running the other way): the codes
    moved as 8 x 8 blocks of bytes in 64-bit words, 0.24-0.27 ms for a 768 x 2048 expert either way
    against NumPy's 0.8-2.3 ms (a strided byte copy). The reference where compiled kernels are off
    or a side is not a multiple of 8."""
    n, k = w.q.shape
    if n % 8 or k % 8 or not jit.enabled() or not w.q.flags.c_contiguous:
        return w.transposed()
    q = np.empty((k, n), np.int8)
    _transpose_bytes(w.q.view(np.uint64), q.view(np.uint64), 2)
    flip = {"in": "out", "out": "in"}[w.along]
    t = np.ascontiguousarray
    return BlockQ(q, t(w.s.T), t(w.m.T), flip, w.group)


def compiled_for(w: BlockQ) -> bool:
    """Whether `xwt_cpu` multiplies by w compiled (not through the reference)."""
    return w.q.shape[0] % 4 == 0 and (w.along, w.group) in _KERNELS and jit.enabled()


def xwt_cpu(x: np.ndarray, w: BlockQ) -> np.ndarray:
    """CPU twin of `xwt_ref` (same arguments and result)."""
    if x.dtype != np.float32 or x.ndim != 2 or type(x) is not np.ndarray or not compiled_for(w):
        return xwt_ref(x, w)
    if x.shape[1] != w.q.shape[1]:
        raise ValueError(f"x {x.shape} cannot be multiplied by w^T of w {w.q.shape}")
    x = np.ascontiguousarray(x)
    y = np.empty((x.shape[0], w.q.shape[0]), np.float32)
    kernel = _KERNELS[w.along, w.group]
    for j in range(0, x.shape[0], ROWS):  # x's rows a block at a time: each stays in L2 over w's rows
        kernel(x[j : j + ROWS], w.q, w.s, w.m, y[j : j + ROWS])
    return y


__all__ = ["compiled_for", "transposed_cpu", "xwt_cpu"]
