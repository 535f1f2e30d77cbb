"""The CPU twin of dequantization: `dequant_cpu(raw, qtype, rows=None, out=None)`, the arguments and
result of `engine.kernels.dequant.dequant_ref` (gguf-py's), bit for bit, with compiled kernels
(engine.kernels.jit) for the common quantized types (`COMPILED_TYPES`): one pass over the blocks
that reads each byte once and writes each float once, where NumPy takes a dozen passes through
scratch buffers (engine.io.quants). The weight store's dequantization (engine.io.quants.dequantize,
split over threads in spans of blocks) runs the same kernels through `blocks_kernel`.

Bit for bit: every value is gguf-py's float32 arithmetic in its order, each product and sum rounded
once (no FMA contraction): Q8_0 q d; Q4_0 d (q - 8); Q4_1 d q + m; Q4_K and Q5_K (d sc) q - (dmin m);
Q6_K (d sc) q; the f16 scales through NumPy's own float16 conversion (a table of all 65536).
Other types, and every call while compiled kernels are off, run the NumPy path (engine.io.quants
for the store; `dequant_ref` here). The parity test is tests/kernels/test_cpu_twins.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import jit
from .dequant import block_geometry, dequant_ref

# float16 bits -> float32 through NumPy's conversion (the one gguf-py uses)
F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
F16_TO_F32.setflags(write=False)


# Every kernel takes `run`, the length of its innermost loops (16 or 32 values), as an argument given
# at run time: with the constant LLVM unrolls those loops fully and then stores one value at a time;
# given at run time it vectorises them. Measured on a 768 x 2048 matrix, one thread: dequantizing
# Q8_0 0.48 -> 0.14 ms, Q4_0 0.43 -> 0.10, Q4_1 0.45 -> 0.11, Q6_K 0.66 -> 0.38 (its loop also split
# at the 16-value groups), Q4_K's codes 0.24 -> 0.03 (bench/CPU_NOTES.md, round 5).


@jit.kernel
def _q8_0(src, table, dst, run):  # blocks of 34 bytes: d (f16), 32 int8 codes; run = 32
    for b in range(src.size // 34):
        o = b * 34
        d = table[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]
        for i in range(run):
            q = np.int32(src[o + 2 + i])
            dst[b * 32 + i] = np.float32(q - ((q >> 7) << 8)) * d  # the byte as int8


@jit.kernel
def _q4_0(src, table, dst, run):  # 18 bytes: d, 16 bytes of nibbles (low: values 0-15, high: 16-31); run = 16
    for b in range(src.size // 18):
        o = b * 18
        d = table[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]
        for i in range(run):
            byte = np.int32(src[o + 2 + i])
            dst[b * 32 + i] = d * np.float32((byte & 15) - 8)
            dst[b * 32 + 16 + i] = d * np.float32((byte >> 4) - 8)


@jit.kernel
def _q4_1(src, table, dst, run):  # 20 bytes: d, m, 16 bytes of nibbles; run = 16
    for b in range(src.size // 20):
        o = b * 20
        d = table[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]
        m = table[np.int64(src[o + 2]) | (np.int64(src[o + 3]) << 8)]
        for i in range(run):
            byte = np.int32(src[o + 4 + i])
            dst[b * 32 + i] = d * np.float32(byte & 15) + m
            dst[b * 32 + 16 + i] = d * np.float32(byte >> 4) + m


@jit.kernel
def _k_scale_min(src, sc, g):
    """Q4_K/Q5_K group g's 6-bit scale and min from the 12 scale bytes at `sc`."""
    if g < 4:
        return np.int32(src[sc + g]) & 63, np.int32(src[sc + g + 4]) & 63
    s = (np.int32(src[sc + g + 4]) & 15) | ((np.int32(src[sc + g - 4]) >> 6) << 4)
    m = (np.int32(src[sc + g + 4]) >> 4) | ((np.int32(src[sc + g]) >> 6) << 4)
    return s, m


@jit.kernel
def _k45_codes(src, o, qo, i, j, q5):
    """Values i and i + 32 of run j of the Q4_K / Q5_K block at o, its nibbles at qo: the low and the
    high nibble, with their fifth bits for Q5_K."""
    byte = np.int32(src[qo + i])
    lo, hi = byte & 15, byte >> 4
    if q5:
        h = np.int32(src[o + 16 + i])
        lo |= ((h >> (2 * j)) & 1) << 4
        hi |= ((h >> (2 * j + 1)) & 1) << 4
    return lo, hi


@jit.kernel
def _k45(src, table, dst, q5, run):
    """Q4_K (144 bytes: d, dmin, 12 scale bytes, 4 runs of 32 bytes of nibbles) or, with q5, Q5_K
    (176 bytes: the same with 32 bytes of fifth bits before the nibbles); run = 32."""
    ts = 176 if q5 else 144
    for b in range(src.size // ts):
        o = b * ts
        d = table[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]
        dmin = table[np.int64(src[o + 2]) | (np.int64(src[o + 3]) << 8)]
        for j in range(4):
            s0, m0 = _k_scale_min(src, o + 4, 2 * j)
            s1, m1 = _k_scale_min(src, o + 4, 2 * j + 1)
            dl0, ml0 = d * np.float32(s0), dmin * np.float32(m0)
            dl1, ml1 = d * np.float32(s1), dmin * np.float32(m1)
            q = o + (48 if q5 else 16) + 32 * j
            out = b * 256 + 64 * j
            for i in range(run):
                lo, hi = _k45_codes(src, o, q, i, j, q5)
                dst[out + i] = dl0 * np.float32(lo) - ml0
                dst[out + 32 + i] = dl1 * np.float32(hi) - ml1


@jit.kernel
def _q4_k(src, table, dst, run):
    _k45(src, table, dst, False, run)


@jit.kernel
def _q5_k(src, table, dst, run):
    _k45(src, table, dst, True, run)


@jit.kernel
def _q6_k_scales(src, o, table, scale):
    """A Q6_K block's 16 group scales, d times each int8 scale, into `scale`."""
    d = table[np.int64(src[o + 208]) | (np.int64(src[o + 209]) << 8)]
    for k in range(16):
        s = np.int32(src[o + 192 + k])
        scale[k] = d * np.float32(s - 256 if s >= 128 else s)


@jit.kernel
def _q6_k(src, table, dst, run):  # 210 bytes: 128 of low nibbles, 64 of 2-bit highs, 16 int8 scales, d
    scale = np.empty(16, np.float32)
    for b in range(src.size // 210):
        o = b * 210
        _q6_k_scales(src, o, table, scale)
        for h in range(2):
            for half in range(2):  # run = 16: values of one group in each of the four quarters
                i0 = 16 * half
                ql, qh, out = o + 64 * h + i0, o + 128 + 32 * h + i0, b * 256 + 128 * h + i0
                g = 8 * h + half
                s0, s2, s4, s6 = scale[g], scale[g + 2], scale[g + 4], scale[g + 6]
                for i in range(run):
                    a = np.int32(src[ql + i])
                    c = np.int32(src[ql + i + 32])
                    hb = np.int32(src[qh + i])
                    dst[out + i] = s0 * np.float32(((a & 15) | ((hb & 3) << 4)) - 32)
                    dst[out + 32 + i] = s2 * np.float32(((c & 15) | (((hb >> 2) & 3) << 4)) - 32)
                    dst[out + 64 + i] = s4 * np.float32(((a >> 4) | (((hb >> 4) & 3) << 4)) - 32)
                    dst[out + 96 + i] = s6 * np.float32(((c >> 4) | (((hb >> 6) & 3) << 4)) - 32)


# -- codes: the integer stage alone ----------------------------------------------------------------
# engine.io.quants.int_codes's (q, s, m) of a type, value = q s - m per group (engine.kernels.blockq),
# written in one pass over the blocks: q int8 (n,), s and m float32 (n // g,). Bit for bit what
# int_codes's NumPy path gives (tests/kernels/test_cpu_twins.py): the scales rounded as the
# dequantizer rounds them, an added offset negated, a missing one +0.0.


@jit.kernel
def _codes_q8_0(src, table, q, s, m, run):  # s = d, m = 0; run = 32
    for b in range(src.size // 34):
        o = b * 34
        s[b] = table[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]
        m[b] = np.float32(0.0)
        for i in range(run):
            v = np.int32(src[o + 2 + i])
            q[b * 32 + i] = v - ((v >> 7) << 8)


@jit.kernel
def _codes_q4_0(src, table, q, s, m, run):  # q = nibble - 8, s = d, m = 0; run = 16
    for b in range(src.size // 18):
        o = b * 18
        s[b] = table[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]
        m[b] = np.float32(0.0)
        for i in range(run):
            byte = np.int32(src[o + 2 + i])
            q[b * 32 + i] = (byte & 15) - 8
            q[b * 32 + 16 + i] = (byte >> 4) - 8


@jit.kernel
def _codes_q4_1(src, table, q, s, m, run):  # s = d, m = -min (added in the file's d q + min); run = 16
    for b in range(src.size // 20):
        o = b * 20
        s[b] = table[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]
        m[b] = -table[np.int64(src[o + 2]) | (np.int64(src[o + 3]) << 8)]
        for i in range(run):
            byte = np.int32(src[o + 4 + i])
            q[b * 32 + i] = byte & 15
            q[b * 32 + 16 + i] = byte >> 4


@jit.kernel
def _codes_k45(src, table, q, s, m, q5, run):  # s = d sc, m = dmin min, per group of 32; run = 32
    ts = 176 if q5 else 144
    for b in range(src.size // ts):
        o = b * ts
        d = table[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]
        dmin = table[np.int64(src[o + 2]) | (np.int64(src[o + 3]) << 8)]
        for g in range(8):
            sc, mn = _k_scale_min(src, o + 4, g)
            s[b * 8 + g] = d * np.float32(sc)
            m[b * 8 + g] = dmin * np.float32(mn)
        for j in range(4):
            qo = o + (48 if q5 else 16) + 32 * j
            out = b * 256 + 64 * j
            for i in range(run):
                lo, hi = _k45_codes(src, o, qo, i, j, q5)
                q[out + i] = lo
                q[out + 32 + i] = hi


@jit.kernel
def _codes_q4_k(src, table, q, s, m, run):
    _codes_k45(src, table, q, s, m, False, run)


@jit.kernel
def _codes_q5_k(src, table, q, s, m, run):
    _codes_k45(src, table, q, s, m, True, run)


@jit.kernel
def _codes_q6_k(src, table, q, s, m, run):  # q = 6-bit value - 32, s = d sc per group of 16, m = 0; run = 32
    for b in range(src.size // 210):
        o = b * 210
        _q6_k_scales(src, o, table, s[b * 16 : b * 16 + 16])
        for k in range(16):
            m[b * 16 + k] = np.float32(0.0)
        for h in range(2):
            ql, qh, out = o + 64 * h, o + 128 + 32 * h, b * 256 + 128 * h
            for i in range(run):
                a = np.int32(src[ql + i])
                c = np.int32(src[ql + i + 32])
                hb = np.int32(src[qh + i])
                q[out + i] = ((a & 15) | ((hb & 3) << 4)) - 32
                q[out + 32 + i] = ((c & 15) | (((hb >> 2) & 3) << 4)) - 32
                q[out + 64 + i] = ((a >> 4) | (((hb >> 4) & 3) << 4)) - 32
                q[out + 96 + i] = ((c >> 4) | (((hb >> 6) & 3) << 4)) - 32


# type -> (kernel, its `run`)
KERNELS: dict[str, tuple[jit.Kernel, int]] = {
    "Q8_0": (_q8_0, 32),
    "Q4_0": (_q4_0, 16),
    "Q4_1": (_q4_1, 16),
    "Q4_K": (_q4_k, 32),
    "Q5_K": (_q5_k, 32),
    "Q6_K": (_q6_k, 16),
}
COMPILED_TYPES = tuple(KERNELS)
CODES_KERNELS: dict[str, tuple[jit.Kernel, int]] = {
    "Q8_0": (_codes_q8_0, 32),
    "Q4_0": (_codes_q4_0, 16),
    "Q4_1": (_codes_q4_1, 16),
    "Q4_K": (_codes_q4_k, 32),
    "Q5_K": (_codes_q5_k, 32),
    "Q6_K": (_codes_q6_k, 32),
}


def blocks_kernel(qtype: str) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """`run(src, dst)` for raw blocks src (flat uint8, C-contiguous, whole blocks) into dst (flat
    float32, C-contiguous, every value of those blocks), or None where `qtype` has no compiled kernel
    or compiled kernels are off."""
    entry = KERNELS.get(qtype)
    if entry is None or not jit.enabled():
        return None
    kernel, run = entry
    return lambda src, dst: kernel(src, F16_TO_F32, dst, run)


def codes_kernel(qtype: str) -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None] | None:
    """`run(src, q, s, m)` for raw blocks src (flat uint8, C-contiguous, whole blocks) into their codes
    q (flat int8) and each group's scale s and offset m (flat float32), or None where `qtype` has no
    compiled codes or compiled kernels are off."""
    entry = CODES_KERNELS.get(qtype)
    if entry is None or not jit.enabled():
        return None
    kernel, run = entry
    return lambda src, q, s, m: kernel(src, F16_TO_F32, q, s, m, run)


def dequant_cpu(raw: np.ndarray, qtype: str, rows=None, out: np.ndarray | None = None) -> np.ndarray:
    """CPU twin of `dequant_ref` (same arguments and result); `out`: a C-contiguous float32 array of
    the result's shape to write into."""
    run = blocks_kernel(qtype)
    data = np.asarray(raw)
    if run is None or data.dtype != np.uint8 or data.ndim == 0:
        ref = dequant_ref(raw, qtype, rows)
        if out is None:
            return ref
        out[...] = ref
        return out
    if rows is not None:
        data = data[np.asarray(rows, dtype=np.intp)]
    qk, ts = block_geometry(qtype)
    if data.shape[-1] % ts:
        raise ValueError(
            f"{qtype} data of shape {data.shape} does not hold whole blocks of {ts} bytes per row"
        )
    shape = (*data.shape[:-1], data.shape[-1] // ts * qk)
    if out is None:
        out = np.empty(shape, np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous float32 array of shape {shape}, got {out.dtype} {out.shape}"
        )
    run(np.ascontiguousarray(data).reshape(-1), out.reshape(-1))
    return out
