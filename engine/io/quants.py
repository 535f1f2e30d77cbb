"""Fast CPU dequantization of GGUF tensor data to float32, bit-exact with gguf-py.

`dequantize(raw, qtype, out=None, threads=None)` turns the raw bytes that `GGUFFile.raw` gives
(uint8 `(..., row_bytes)`, or the float16/float32 values of an F16/F32 tensor) into float32
`(..., values_per_row)`. The weight store calls it on the hot path: base weights stay quantized in
memory and are dequantized layer by layer on every forward and backward.

Every value is bit-for-bit what `gguf.quants.dequantize` returns: the same float32 multiplications
and additions happen in the same order on the same operands (small integer codes are exact in
float32, so how they are produced does not matter). NaN and Inf from garbage scales come out with
the same bit patterns. Types with a fast path are `fast_types()`; any other type gguf-py can
dequantize goes through `gguf.quants.dequantize` (slow, and it allocates its own result).

How it is fast, in NumPy alone: each type first turns a span of blocks into one small-integer code
per value (uint8 work on whole arrays, the blocks' fields copied out through structured dtypes
instead of being sliced row by row) and per-group scales; then a chunk of values at a time, small
enough to stay in cache, is cast to float32, multiplied by its group scale and shifted by its group
minimum, in place in the output. Temporaries live in per-thread buffers that are reused from call
to call (fresh memory costs a page fault per 4 KiB, more than the arithmetic), a few MiB per thread.
Spans are split between the calling thread and a module-level pool; NumPy releases the GIL inside
each ufunc.

Not here: reading files (`engine.io.gguf_file`), GPU kernels (`engine.kernels.dequant`), deciding
what to dequantize when (the weight store).
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from ..errors import ModelError
from ..kernels.dequant_cpu import blocks_kernel, codes_kernel

QK_K = 256

# Values per span: the unit of the integer stage, and of the split between threads.
SPAN_VALUES = 1 << 19
# Values per chunk of the float stage: its output, codes and scales stay in L2.
CHUNK_VALUES = 1 << 16
# Below this many values a tensor is dequantized on the calling thread alone.
MIN_SPLIT_VALUES = 1 << 16


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


# float16 bits -> float32 through NumPy's own conversion (the one gguf-py uses), as a table:
# a lookup is 2x faster than NumPy's software float16 cast
_F16_TO_F32 = _readonly(
    np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
)
# the IQ4_NL / IQ4_XS codebook as float32 (gguf-py: an int8 table, then .astype(float32))
_IQ4_KVALUES = _readonly(
    np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
)
_IQ4_KVALUES_I8 = _readonly(_IQ4_KVALUES.astype(np.int8))  # the same codebook as int8 (`int_codes`)


class _Workspace:
    """Named scratch buffers of one thread, grown on demand and reused from call to call."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def __call__(self, name: str, shape: tuple[int, ...], dtype: type | np.dtype = np.uint8) -> np.ndarray:
        dtype = np.dtype(dtype)
        n_bytes = math.prod(shape) * dtype.itemsize
        buf = self._buffers.get(name)
        if buf is None or buf.size < n_bytes:
            buf = self._buffers[name] = np.empty(max(n_bytes, 64), np.uint8)
        return buf[:n_bytes].view(dtype).reshape(shape)


_thread_state = threading.local()


def _workspace() -> _Workspace:
    ws = getattr(_thread_state, "workspace", None)
    if ws is None:
        ws = _thread_state.workspace = _Workspace()
    return ws


def _layout(size: int, **fields: tuple[int, str]) -> np.dtype:
    """A structured dtype of one block: name=(byte offset, format)."""
    return np.dtype(
        {
            "names": list(fields),
            "offsets": [off for off, _ in fields.values()],
            "formats": [fmt for _, fmt in fields.values()],
            "itemsize": size,
        }
    )


def _bytes(ws: _Workspace, name: str, field: np.ndarray) -> np.ndarray:
    """A (nb, k) uint8 copy of a structured field of nb blocks (one strided copy, not nb rows)."""
    nb = field.shape[0]
    out = ws(name, (nb, field.size // nb * field.dtype.itemsize))
    out.view(field.dtype).reshape(field.shape)[...] = field
    return out


def _half(ws: _Workspace, name: str, field: np.ndarray) -> np.ndarray:
    """float16 scales, given as their uint16 bits, as float32 (nb,), looked up in a table."""
    idx = ws("half_index", field.shape, np.intp)
    np.copyto(idx, field)
    out = ws(name, field.shape, np.float32)
    np.take(_F16_TO_F32, idx, out=out, mode="wrap")
    return out


def _nibbles(ws: _Workspace, src: np.ndarray, layout: np.dtype, groups: int, width: int) -> np.ndarray:
    """Codes (nb, groups * 2 * width) uint8 of field "qs" of `groups` runs of `width` bytes: each
    run gives `width` low nibbles, then `width` high nibbles (the ggml order of every 4-bit type)."""
    nb = src.size // layout.itemsize
    planes = ws("nibble_planes", (2, src.size))
    np.bitwise_and(src, 0x0F, out=planes[0])
    np.right_shift(src, 4, out=planes[1])
    q = ws("q", (nb, groups, 2, width))
    # (2, nb, groups) runs -> (nb, groups, 2): one copy of width-byte items
    q.view(f"V{width}")[..., 0] = planes.view(layout)["qs"].reshape(2, nb, groups).transpose(1, 2, 0)
    return q.reshape(nb, -1)


@dataclass
class _Codes:
    """A span after the integer stage: value = scale[g] * code (+/- offset[g]) for group g."""

    q: np.ndarray  # (n,) int8/uint8 codes, or indices into `table`
    scale: np.ndarray  # (n // group,) float32
    group: int  # values per scale
    offset: np.ndarray | None = None  # (n // group,) float32, added (or subtracted) after scaling
    subtract: bool = False  # value = scale * q - offset instead of + offset
    table: np.ndarray | None = None  # float32 codebook that q indexes
    code_first: bool = False  # multiply as q * scale (Q8_0's operand order in gguf-py)


# -- 32-value blocks ----------------------------------------------------------------------------

_Q8_0 = _layout(34, d=(0, "<u2"), qs=(2, "V32"))
_Q4_0 = _layout(18, d=(0, "<u2"), qs=(2, "V16"))
_Q4_1 = _layout(20, d=(0, "<u2"), m=(2, "<u2"), qs=(4, "V16"))
_Q5_0 = _layout(22, d=(0, "<u2"), qh=(2, "V4"), qs=(6, "V16"))
_Q5_1 = _layout(24, d=(0, "<u2"), m=(2, "<u2"), qh=(4, "V4"), qs=(8, "V16"))
_IQ4_NL = _layout(18, d=(0, "<u2"), qs=(2, "V16"))
_MXFP4 = _layout(17, e=(0, "u1"), qs=(1, "V16"))


def _q8_0(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: x * d, x the int8 codes
    rec = src.view(_Q8_0)
    q = _bytes(ws, "q", rec["qs"]).view(np.int8).reshape(-1)
    return _Codes(q, _half(ws, "scale", rec["d"]), 32, code_first=True)


def _q4_0(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: d * (q - 8), q the nibbles (16 low, then 16 high)
    q = _nibbles(ws, src, _Q4_0, 1, 16).reshape(-1)
    np.subtract(q, 8, out=q)  # wraps: int8 q - 8
    return _Codes(q.view(np.int8), _half(ws, "scale", src.view(_Q4_0)["d"]), 32)


def _q4_1(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: d * q + m
    rec = src.view(_Q4_1)
    q = _nibbles(ws, src, _Q4_1, 1, 16).reshape(-1)
    return _Codes(q, _half(ws, "scale", rec["d"]), 32, offset=_half(ws, "offset", rec["m"]))


def _add_fifth_bits(ws: _Workspace, q: np.ndarray, rec: np.ndarray) -> None:
    """Q5_0/Q5_1: q |= (bit j of the block's little-endian uint32 qh) << 4, for value j."""
    qh = _bytes(ws, "qh", rec["qh"]).reshape(-1)  # byte k holds the bits of values 8k..8k+7
    x = ws("spread", qh.shape, np.uint64)
    np.copyto(x, qh)
    # each byte of x becomes 0x10 or 0, by its bit: copy the byte to all 8 lanes, keep bit i in
    # lane i, carry it into the lane's top bit (no lane overflows), move that to bit 4
    np.multiply(x, np.uint64(0x0101010101010101), out=x)
    np.bitwise_and(x, np.uint64(0x8040201008040201), out=x)
    np.add(x, np.uint64(0x7F7F7F7F7F7F7F7F), out=x)
    np.bitwise_and(x, np.uint64(0x8080808080808080), out=x)
    np.right_shift(x, np.uint64(3), out=x)
    np.bitwise_or(q, x.view(np.uint8), out=q)


def _q5_0(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: d * ((q | h << 4) - 16)
    rec = src.view(_Q5_0)
    q = _nibbles(ws, src, _Q5_0, 1, 16).reshape(-1)
    _add_fifth_bits(ws, q, rec)
    np.subtract(q, 16, out=q)
    return _Codes(q.view(np.int8), _half(ws, "scale", rec["d"]), 32)


def _q5_1(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: d * (q | h << 4) + m
    rec = src.view(_Q5_1)
    q = _nibbles(ws, src, _Q5_1, 1, 16).reshape(-1)
    _add_fifth_bits(ws, q, rec)
    return _Codes(q, _half(ws, "scale", rec["d"]), 32, offset=_half(ws, "offset", rec["m"]))


def _iq4_nl(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: d * kvalues[q]
    q = _nibbles(ws, src, _IQ4_NL, 1, 16).reshape(-1)
    return _Codes(q, _half(ws, "scale", src.view(_IQ4_NL)["d"]), 32, table=_IQ4_KVALUES)


def _e2m1_doubled(ws: _Workspace, q: np.ndarray) -> np.ndarray:
    """MXFP4 codes (sign, 2-bit exponent, 1-bit mantissa) -> int8 twice their value, in place.

    Magnitude m = 0..7 -> 0, 1, 2, 3, 4, 6, 8, 12 = (m - 2a - 2c) * (1 + a + 2c) with a = [m >= 4],
    c = [m >= 6]: products and sums only (uint8 shifts left, min and max take slow loops)."""
    sign = ws("sign", q.shape)
    a = ws("a", q.shape)
    c = ws("c", q.shape)
    np.right_shift(q, 3, out=sign)  # 0/1
    np.bitwise_and(q, 7, out=q)  # m
    np.right_shift(q, 2, out=a)
    np.add(q, 2, out=c)
    np.right_shift(c, 3, out=c)
    np.subtract(q, a, out=q)
    np.subtract(q, a, out=q)
    np.subtract(q, c, out=q)
    np.subtract(q, c, out=q)  # base 0..3
    np.add(a, 1, out=a)
    np.add(a, c, out=a)
    np.add(a, c, out=a)  # factor 1, 2, 4
    np.multiply(q, a, out=q)
    np.multiply(sign, 254, out=sign)
    np.add(sign, 1, out=sign)  # 1, or -1 as uint8
    np.multiply(q, sign, out=q)
    return q.view(np.int8)


def _mxfp4(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: e8m0_to_fp32_half(e) * kvalues[q]; e8m0_to_fp32_half(e) has the bits
    # (e - 1) << 23, or 0x00200000 << e for the subnormal halves of e = 0, 1
    e = src.view(_MXFP4)["e"]
    bits = ws("scale", e.shape, np.uint32)
    np.copyto(bits, e)
    np.subtract(bits, 1, out=bits)
    np.left_shift(bits, 23, out=bits)
    low = e < 2
    if low.any():
        bits[low] = np.uint32(0x00200000) << e[low].astype(np.uint32)
    q = _nibbles(ws, src, _MXFP4, 1, 16).reshape(-1)
    return _Codes(_e2m1_doubled(ws, q), bits.view(np.float32), 32)


# -- 256-value super-blocks (K-quants, IQ4_XS) --------------------------------------------------

_Q2_K = _layout(84, scales=(0, "V16"), qs=(16, "(2,)V32"), d=(80, "<u2"), dmin=(82, "<u2"))
_Q3_K = _layout(110, hmask=(0, "V32"), qs=(32, "(2,)V32"), scales=(96, "V12"), d=(108, "<u2"))
_Q4_K = _layout(144, d=(0, "<u2"), dmin=(2, "<u2"), scales=(4, "V12"), qs=(16, "(4,)V32"))
_Q5_K = _layout(176, d=(0, "<u2"), dmin=(2, "<u2"), scales=(4, "V12"), qh=(16, "V32"), qs=(48, "(4,)V32"))
_Q6_K = _layout(210, qs=(0, "(2,)V64"), qh=(128, "V64"), scales=(192, "V16"), d=(208, "<u2"))
_IQ4_XS = _layout(136, d=(0, "<u2"), scales_h=(2, "<u2"), scales_l=(4, "V4"), qs=(8, "(8,)V16"))


def _crumbs(ws: _Workspace, src: np.ndarray, layout: np.dtype) -> np.ndarray:
    """Q2_K/Q3_K 2-bit codes (nb, 256) uint8 of field "qs" (2 runs of 32 bytes): value (h, s, j)
    is bits 2s, 2s+1 of byte j of run h."""
    nb = src.size // layout.itemsize
    planes = ws("crumb_planes", (4, src.size))
    for s in range(4):  # (a broadcast shift would take a slow path)
        np.right_shift(src, 2 * s, out=planes[s])
    np.bitwise_and(planes, 3, out=planes)
    q = ws("q", (nb, 2, 4, 32))
    q.view("V32")[..., 0] = planes.view(layout)["qs"].transpose(1, 2, 0)  # (s, nb, h) -> (nb, h, s)
    return q.reshape(nb, QK_K)


def _bit_planes(ws: _Workspace, field: np.ndarray) -> np.ndarray:
    """(nb, 8, 32) uint8 bits of a 32-byte field: [b, i, j] = bit i of byte j (Q3_K/Q5_K high bits)."""
    nb = field.shape[0]
    qh = _bytes(ws, "qh", field).reshape(1, -1)
    planes = ws("bit_planes", (8, qh.size))
    for i in range(8):
        np.right_shift(qh, i, out=planes[i : i + 1])
    np.bitwise_and(planes, 1, out=planes)
    h = ws("h", (nb, 8, 32))
    h.view("V32")[..., 0] = planes.view("V32").reshape(8, nb).T
    return h


def _k_scale_min(ws: _Workspace, field: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 6-bit scales and mins (nb, 8) uint8 from the 12-byte field, four per uint32 lane:
    bytes 0-3 D = EEaaaaaa, 4-7 M = FFbbbbbb, 8-11 X = ffffeeee; sc = a.. | (e.. | EE << 4),
    min = b.. | (f.. | FF << 4) (gguf-py's Q4_K.get_scale_min)."""
    nb = field.shape[0]
    s = _bytes(ws, "scales", field).view(np.uint32)  # (nb, 3): D, M, X lanes
    d, m, x = s[:, 0], s[:, 1], s[:, 2]
    sc = ws("sc", (nb, 2), np.uint32)
    mn = ws("mn", (nb, 2), np.uint32)
    t = ws("t", (nb,), np.uint32)
    np.bitwise_and(d, 0x3F3F3F3F, out=sc[:, 0])
    np.bitwise_and(m, 0x3F3F3F3F, out=mn[:, 0])
    np.right_shift(d, 2, out=t)
    np.bitwise_and(t, 0x30303030, out=t)
    np.bitwise_and(x, 0x0F0F0F0F, out=sc[:, 1])
    np.bitwise_or(sc[:, 1], t, out=sc[:, 1])
    np.right_shift(m, 2, out=t)
    np.bitwise_and(t, 0x30303030, out=t)
    np.right_shift(x, 4, out=mn[:, 1])
    np.bitwise_and(mn[:, 1], 0x0F0F0F0F, out=mn[:, 1])
    np.bitwise_or(mn[:, 1], t, out=mn[:, 1])
    return sc.view(np.uint8), mn.view(np.uint8)


def _scaled(ws: _Workspace, name: str, d: np.ndarray, small: np.ndarray) -> np.ndarray:
    """gguf's d * small.astype(float32) for (nb,) d and (nb, k) small integers, as (nb * k,)."""
    out = ws(name, small.shape, np.float32)
    np.copyto(out, small, casting="unsafe")
    np.multiply(d[:, None], out, out=out)
    return out.reshape(-1)


def _q2_k(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: (d * (sc & 15)) * q - (dmin * (sc >> 4)), 16 groups of 16
    rec = src.view(_Q2_K)
    sc = _bytes(ws, "scales", rec["scales"])
    dl = _scaled(ws, "scale", _half(ws, "d", rec["d"]), sc & 0x0F)
    ml = _scaled(ws, "offset", _half(ws, "dmin", rec["dmin"]), sc >> 4)
    return _Codes(_crumbs(ws, src, _Q2_K).reshape(-1), dl, 16, offset=ml, subtract=True)


def _q3_k(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: (d * (scale - 32)) * (q - 4 * (1 - h)), 16 groups of 16
    rec = src.view(_Q3_K)
    nb = src.size // _Q3_K.itemsize
    # 6-bit scales, four per uint32 lane: low nibbles of scales 0-7 in L0, L1 (scales 8-15 in their
    # high nibbles), 2-bit highs in H: scale 4s + j takes bits 2s, 2s+1 of byte j of H
    s = _bytes(ws, "scales", rec["scales"]).view(np.uint32)  # (nb, 3): L0, L1, H
    scale = ws("scale_bytes", (nb, 4), np.uint32)
    t = ws("t", (nb,), np.uint32)
    for lane, (low, nibble_shift, h_shift) in enumerate(((0, 0, 4), (1, 0, 2), (0, 4, 0), (1, 4, -2))):
        np.right_shift(s[:, low], nibble_shift, out=scale[:, lane])
        np.bitwise_and(scale[:, lane], 0x0F0F0F0F, out=scale[:, lane])
        if h_shift >= 0:
            np.left_shift(s[:, 2], h_shift, out=t)
        else:
            np.right_shift(s[:, 2], -h_shift, out=t)
        np.bitwise_and(t, 0x30303030, out=t)
        np.bitwise_or(scale[:, lane], t, out=scale[:, lane])
    scale8 = scale.view(np.uint8)  # (nb, 16)
    np.subtract(scale8, 32, out=scale8)
    dl = _scaled(ws, "scale", _half(ws, "d", rec["d"]), scale8.view(np.int8))
    q = _crumbs(ws, src, _Q3_K)
    h = _bit_planes(ws, rec["hmask"]).reshape(nb, QK_K)
    # q - 4 where the high bit is 0: q | 0xFC as int8 (q <= 3)
    np.subtract(h, 1, out=h)
    np.bitwise_and(h, 0xFC, out=h)
    np.bitwise_or(q, h, out=q)
    return _Codes(q.view(np.int8).reshape(-1), dl, 16)


def _q4_k(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: (d * sc) * q - (dmin * m), 8 groups of 32
    rec = src.view(_Q4_K)
    sc, mn = _k_scale_min(ws, rec["scales"])
    dl = _scaled(ws, "scale", _half(ws, "d", rec["d"]), sc)
    ml = _scaled(ws, "offset", _half(ws, "dmin", rec["dmin"]), mn)
    q = _nibbles(ws, src, _Q4_K, 4, 32)
    return _Codes(q.reshape(-1), dl, 32, offset=ml, subtract=True)


def _q5_k(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: (d * sc) * (q | h << 4) - (dmin * m), 8 groups of 32
    rec = src.view(_Q5_K)
    nb = src.size // _Q5_K.itemsize
    sc, mn = _k_scale_min(ws, rec["scales"])
    dl = _scaled(ws, "scale", _half(ws, "d", rec["d"]), sc)
    ml = _scaled(ws, "offset", _half(ws, "dmin", rec["dmin"]), mn)
    q = _nibbles(ws, src, _Q5_K, 4, 32)
    h = _bit_planes(ws, rec["qh"]).reshape(nb, QK_K)
    np.multiply(h, 16, out=h)  # (uint8 left shifts take a slow loop)
    np.bitwise_or(q, h, out=q)
    return _Codes(q.reshape(-1), dl, 32, offset=ml, subtract=True)


def _q6_k(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: (d * scale) * ((ql | qh << 4) - 32), 16 groups of 16
    rec = src.view(_Q6_K)
    nb = src.size // _Q6_K.itemsize
    dl = _scaled(ws, "scale", _half(ws, "d", rec["d"]), _bytes(ws, "scales", rec["scales"]).view(np.int8))
    q = _nibbles(ws, src, _Q6_K, 2, 64)  # (nb, 256): half h, nibble n, byte k of 64
    # value (h, s, j) takes bits 2s, 2s+1 of qh byte 32h + j, as its bits 4, 5
    qh = _bytes(ws, "qh", rec["qh"]).reshape(1, -1)
    planes = ws("qh_planes", (4, qh.size))
    np.multiply(qh, 16, out=planes[0:1])  # (uint8 left shifts take a slow loop)
    np.multiply(qh, 4, out=planes[1:2])
    np.copyto(planes[2:3], qh)
    np.right_shift(qh, 2, out=planes[3:4])
    np.bitwise_and(planes, 0x30, out=planes)
    h = ws("h", (nb, 2, 4, 32))
    h.view("V32")[..., 0] = planes.view("V32").reshape(4, nb, 2).transpose(1, 2, 0)
    np.bitwise_or(q, h.reshape(nb, QK_K), out=q)
    np.subtract(q, 32, out=q)
    return _Codes(q.view(np.int8).reshape(-1), dl, 16)


_IQ4_XS_SHIFTS = _readonly(np.arange(0, 16, 2, dtype=np.uint16))


def _iq4_xs(ws: _Workspace, src: np.ndarray) -> _Codes:
    # gguf: (d * (scale - 32)) * kvalues[q], 8 groups of 32
    rec = src.view(_IQ4_XS)
    nb = src.size // _IQ4_XS.itemsize
    sl = _bytes(ws, "scales", rec["scales_l"])  # (nb, 4): scale 2i in the low nibble, 2i+1 in the high
    s = np.empty((nb, 4, 2), np.uint8)
    np.bitwise_and(sl, 0x0F, out=s[:, :, 0])
    np.right_shift(sl, 4, out=s[:, :, 1])
    sh = np.right_shift(rec["scales_h"][:, None], _IQ4_XS_SHIFTS)  # (nb, 8): 2 high bits of scale i
    np.bitwise_and(sh, 3, out=sh)
    np.multiply(sh, 16, out=sh)
    scale = s.reshape(nb, 8)
    np.bitwise_or(scale, sh, out=scale, casting="unsafe")
    np.subtract(scale, 32, out=scale)
    dl = _scaled(ws, "scale", _half(ws, "d", rec["d"]), scale.view(np.int8))
    q = _nibbles(ws, src, _IQ4_XS, 8, 16)
    return _Codes(q.reshape(-1), dl, 32, table=_IQ4_KVALUES)


# -- the float stage ----------------------------------------------------------------------------


def _floats(ws: _Workspace, codes: _Codes, dst: np.ndarray) -> None:
    """dst (n,) float32 = scale * code (+/- offset), CHUNK_VALUES at a time, in place.

    (np.repeat of the scales and contiguous products would be ~15% faster, but its fresh result
    arrays page-fault whenever malloc has just trimmed its heap: 2-3x slower at times.)"""
    g = codes.group
    n = dst.size
    for c0 in range(0, n, CHUNK_VALUES):
        c1 = min(n, c0 + CHUNK_VALUES)
        o = dst[c0:c1]
        if codes.table is not None:
            idx = ws("index", (c1 - c0,), np.intp)
            np.copyto(idx, codes.q[c0:c1])
            np.take(codes.table, idx, out=o, mode="wrap")
        else:
            np.copyto(o, codes.q[c0:c1], casting="unsafe")
        o2 = o.reshape(-1, g)
        s = codes.scale[c0 // g : c1 // g, None]
        if codes.code_first:
            np.multiply(o2, s, out=o2)
        else:
            np.multiply(s, o2, out=o2)
        if codes.offset is not None:
            m = codes.offset[c0 // g : c1 // g, None]
            (np.subtract if codes.subtract else np.add)(o2, m, out=o2)


# -- float types --------------------------------------------------------------------------------


def _f32(ws: _Workspace, src: np.ndarray, dst: np.ndarray) -> None:
    np.copyto(dst, src.view(np.float32))


_F16_EXP_SCALE = np.float32(2.0**112)  # float32 exponent bias 127 - float16 bias 15


def _f16(ws: _Workspace, src: np.ndarray, dst: np.ndarray) -> None:
    """float16 -> float32 by bits, bit-exact with NumPy's (software) cast that gguf-py uses, 3x faster:
    sign, exponent and mantissa moved to their float32 places are the value times 2^-112 for
    normals, subnormals and zeros alike; one exact multiply by 2^112 fixes that. Inf/NaN (exponent
    31) then only need their exponent filled with ones, payload kept, as NumPy does."""
    h = src.view(np.int16)
    for c0 in range(0, dst.size, CHUNK_VALUES):
        c1 = min(dst.size, c0 + CHUNK_VALUES)
        x = dst[c0:c1].view(np.int32)
        np.copyto(x, h[c0:c1])  # sign-extended: bit 31 is the sign
        np.left_shift(x, 13, out=x)
        np.bitwise_and(x, np.int32(-0x70002000), out=x)  # 0x8FFFE000: sign, exponent, mantissa
        np.multiply(dst[c0:c1], _F16_EXP_SCALE, out=dst[c0:c1])
        magnitude = ws("magnitude", (c1 - c0,), np.uint16)
        np.bitwise_and(h[c0:c1].view(np.uint16), 0x7FFF, out=magnitude)
        if magnitude.max() >= 0x7C00:
            np.bitwise_or(x, np.int32(0x7F800000), out=x, where=magnitude >= 0x7C00)


def _bf16(ws: _Workspace, src: np.ndarray, dst: np.ndarray) -> None:
    # gguf: int16 -> int32 << 16; the low 32 bits are those of uint16 -> uint32 << 16
    u = dst.view(np.uint32)
    np.copyto(u, src.view(np.uint16), casting="unsafe")
    np.left_shift(u, 16, out=u)


@dataclass(frozen=True)
class _Codec:
    block_size: int  # values per block
    type_size: int  # bytes per block
    codes: Callable[[_Workspace, np.ndarray], _Codes] | None  # integer stage of a quantized type
    direct: Callable[[_Workspace, np.ndarray, np.ndarray], None] | None = None  # a float type

    def run(self, ws: _Workspace, src: np.ndarray, dst: np.ndarray) -> None:
        """src (nb * type_size,) uint8, dst (nb * block_size,) float32, both contiguous."""
        if self.direct is not None:
            self.direct(ws, src, dst)
        else:
            assert self.codes is not None
            _floats(ws, self.codes(ws, src), dst)


_CODECS: dict[str, _Codec] = {
    "F32": _Codec(1, 4, None, _f32),
    "F16": _Codec(1, 2, None, _f16),
    "BF16": _Codec(1, 2, None, _bf16),
    "Q8_0": _Codec(32, 34, _q8_0),
    "Q4_0": _Codec(32, 18, _q4_0),
    "Q4_1": _Codec(32, 20, _q4_1),
    "Q5_0": _Codec(32, 22, _q5_0),
    "Q5_1": _Codec(32, 24, _q5_1),
    "Q2_K": _Codec(QK_K, 84, _q2_k),
    "Q3_K": _Codec(QK_K, 110, _q3_k),
    "Q4_K": _Codec(QK_K, 144, _q4_k),
    "Q5_K": _Codec(QK_K, 176, _q5_k),
    "Q6_K": _Codec(QK_K, 210, _q6_k),
    "IQ4_NL": _Codec(32, 18, _iq4_nl),
    "IQ4_XS": _Codec(QK_K, 136, _iq4_xs),
    "MXFP4": _Codec(32, 17, _mxfp4),
}


def fast_types() -> frozenset[str]:
    """Names of the ggml types this module dequantizes itself (the rest go through gguf-py)."""
    return frozenset(_CODECS)


@functools.lru_cache(maxsize=1)
def _fallback_types() -> frozenset[str]:
    """The other ggml types that gguf-py can dequantize to floats (probed once)."""
    ok = set()
    for qtype, (block_size, type_size) in GGML_QUANT_SIZES.items():
        if qtype.name in _CODECS:
            continue
        try:
            with np.errstate(all="ignore"):
                probe = gguf_quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
        except Exception:  # noqa: BLE001 - NotImplementedError, or a type with no float meaning
            continue
        if probe.dtype.kind == "f" and probe.size == block_size:
            ok.add(qtype.name)
    return frozenset(ok)


# -- threads ------------------------------------------------------------------------------------


def _usable_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return max(1, len(affinity(0)))
    return max(1, os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def _new_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=_usable_cores(), thread_name_prefix="dequantize")


_pool_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The module's worker threads, created once, on first use (the calling thread works too)."""
    with _pool_lock:
        return _new_pool()


Piece = tuple[np.ndarray, np.ndarray]  # (raw bytes, float32 output) of whole blocks


def _run_pieces(codec: _Codec, pieces: list[Piece], compiled: Callable | None = None) -> None:
    """Dequantize each piece: with `compiled` (engine.kernels.dequant_cpu.blocks_kernel's, the same
    bits) where the type has a compiled kernel, else the codec's NumPy passes."""
    ws = _workspace()
    with np.errstate(all="ignore"):  # garbage scales give NaN/Inf, as in gguf-py and ggml
        for src, dst in pieces:
            if not src.flags.c_contiguous:
                buf = ws("src", src.shape)
                np.copyto(buf, src)
                src = buf
            if compiled is not None:
                compiled(src.reshape(-1), dst.reshape(-1))
            else:
                codec.run(ws, src.reshape(-1), dst.reshape(-1))


def _pieces(src: np.ndarray, dst: np.ndarray, codec: _Codec, span: int) -> list[Piece]:
    """Split the job into pieces of `span` blocks: block ranges of contiguous data, row ranges
    otherwise (each copied to contiguous memory when it is worked on)."""
    ts, bs = codec.type_size, codec.block_size
    if src.flags.c_contiguous:
        flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
        nb = flat_src.size // ts
        return [
            (flat_src[b0 * ts : min(nb, b0 + span) * ts], flat_dst[b0 * bs : min(nb, b0 + span) * bs])
            for b0 in range(0, nb, span)
        ]
    if src.ndim > 2:
        return [p for i in range(src.shape[0]) for p in _pieces(src[i], dst[i], codec, span)]
    src2, dst2 = src.reshape(-1, src.shape[-1]), dst.reshape(-1, dst.shape[-1])
    rows = max(1, span // max(1, src2.shape[1] // ts))
    return [(src2[r0 : r0 + rows], dst2[r0 : r0 + rows]) for r0 in range(0, src2.shape[0], rows)]


# -- the entry point ----------------------------------------------------------------------------


def dequantize(
    raw: np.ndarray, qtype: str, out: np.ndarray | None = None, *, threads: int | None = None
) -> np.ndarray:
    """Dequantize GGUF tensor data to float32, bit-exact with `gguf.quants.dequantize`.

    raw: as `GGUFFile.raw` gives it: uint8 (..., row_bytes) of whole blocks, or float16 / float32
        values (..., n) for F16 / F32. Any strides; contiguous data is not copied.
    qtype: the ggml type name ("Q4_K", "F16", ...).
    out: optional float32 C-contiguous array of exactly the result's shape, written and returned
        (a reusable buffer: the fast path allocates nothing of its size).
    threads: worker threads; None = every core this process may use, 1 = the calling thread only.
    Returns float32 (..., values_per_row). Raises ModelError for a type that cannot be dequantized.
    """
    codec = _CODECS.get(qtype)
    if codec is None:
        return _dequantize_fallback(raw, qtype, out)
    src = np.asarray(raw)  # a plain ndarray view of a memmap: slicing it stays cheap
    if src.dtype != np.uint8:
        if src.ndim == 0 or src.strides[-1] != src.itemsize:
            src = np.ascontiguousarray(src)
        src = src.view(np.uint8)
    if src.ndim == 0 or src.shape[-1] % codec.type_size:
        raise ModelError(
            f"{qtype} data of shape {src.shape} does not hold whole blocks of {codec.type_size} bytes per row"
        )
    dst = _check_out(out, (*src.shape[:-1], src.shape[-1] // codec.type_size * codec.block_size))
    if dst.size == 0:
        return dst
    n_threads = _usable_cores() if threads is None else max(1, int(threads))
    if dst.size < MIN_SPLIT_VALUES:
        n_threads = 1
    # as many pieces per thread, each at most SPAN_VALUES values
    n_blocks = dst.size // codec.block_size
    per_thread = -(-dst.size // (n_threads * SPAN_VALUES))
    span = max(1, -(-n_blocks // (n_threads * per_thread)))
    pieces = _pieces(src, dst, codec, span)
    n_threads = min(n_threads, len(pieces))
    compiled = blocks_kernel(qtype) if src.dtype == np.uint8 else None
    if n_threads == 1:
        _run_pieces(codec, pieces, compiled)
        return dst
    # one run of pieces per thread: the calling thread takes the first, the pool the others
    runs = [pieces[t::n_threads] for t in range(n_threads)]
    futures = [_pool().submit(_run_pieces, codec, run, compiled) for run in runs[1:]]
    try:
        _run_pieces(codec, runs[0], compiled)
    finally:
        for f in futures:
            f.result()
    return dst


def _check_out(out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=np.float32)
    if out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(
            f"out must be a writeable C-contiguous float32 array of shape {shape}, "
            f"got {out.dtype} {out.shape} (C-contiguous: {out.flags.c_contiguous})"
        )
    return out


def _dequantize_fallback(raw: np.ndarray, qtype: str, out: np.ndarray | None) -> np.ndarray:
    if qtype not in _fallback_types():
        supported = sorted(fast_types() | _fallback_types())
        raise ModelError(f"cannot dequantize tensor type {qtype!r}; supported types: {', '.join(supported)}")
    with np.errstate(all="ignore"):
        values = gguf_quants.dequantize(np.asarray(raw), GGMLQuantizationType[qtype])
    values = values.astype(np.float32, copy=False)
    if out is None:
        return values
    dst = _check_out(out, values.shape)
    np.copyto(dst, values)
    return dst


# values per scale and offset of the types `int_codes` gives codes for
_INT_CODE_GROUPS = {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q4_K": 32, "Q5_K": 32,
                    "MXFP4": 32, "IQ4_NL": 32, "IQ4_XS": 32, "Q2_K": 16, "Q3_K": 16, "Q6_K": 16}  # fmt: skip
# codebooks of small integers: a code is the codebook's value itself (scale * value, no offset)
_INT8_CODEBOOKS = {"IQ4_NL": _IQ4_KVALUES_I8, "IQ4_XS": _IQ4_KVALUES_I8}


def int_code_group(qtype: str) -> int | None:
    """Values per scale and offset of the codes `int_codes` gives for this type (16 or 32), or None."""
    return _INT_CODE_GROUPS.get(qtype)


def int_codes(raw: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """The integer stage alone, for types whose values are scale * code (+/- offset) in groups along
    a row, with codes that fit int8 (`int_code_group`: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, MXFP4
    in groups of 32; Q2_K, Q3_K, Q6_K in groups of 16), and for the codebook types whose codebook is
    small integers (IQ4_NL, IQ4_XS: value = scale * kvalues[index], the code being kvalues[index]):
    (q, s, m, g) with value = q s - m per group, q int8 (..., n), s and m float32 (..., n // g), the
    layout of engine.kernels.blockq's BlockQ. Each value q s - m, rounded as two float32 operations,
    is the one `dequantize` gives (a negated offset, or a zero one, is exact). None for any other
    type (float types). raw: uint8 (..., row_bytes) of whole blocks. Compiled where
    engine.kernels.dequant_cpu has the type's codes kernel (`codes_kernel`), else NumPy.
    """
    group = int_code_group(qtype)
    if group is None:
        return None
    codec = _CODECS[qtype]
    src = np.ascontiguousarray(raw)
    if src.dtype != np.uint8 or src.ndim == 0 or src.shape[-1] % codec.type_size:
        raise ModelError(
            f"{qtype} data of shape {src.shape} does not hold whole blocks of {codec.type_size} bytes a row"
        )
    lead = src.shape[:-1]
    n = src.shape[-1] // codec.type_size * codec.block_size
    run = codes_kernel(qtype)
    if run is not None:  # one compiled pass over the blocks, the same values
        q, s = np.empty((*lead, n), np.int8), np.empty((*lead, n // group), np.float32)
        m = np.empty_like(s)
        run(src.reshape(-1), q.reshape(-1), s.reshape(-1), m.reshape(-1))
        return q, s, m, group
    codes = codec.codes(_workspace(), src.reshape(-1))
    assert codes.group == group and (codes.table is None) == (qtype not in _INT8_CODEBOOKS), qtype
    if codes.table is not None:  # the codebook's values are the codes (a fresh array: no copy to make)
        q = np.take(_INT8_CODEBOOKS[qtype], codes.q).reshape(*lead, n)
    else:
        q = codes.q.view(np.int8).reshape(*lead, n).copy()  # unsigned codes are < 64: the same as int8
    s = codes.scale.reshape(*lead, n // group).copy()
    if codes.offset is None:
        m = np.zeros_like(s)
    elif codes.subtract:
        m = codes.offset.reshape(*lead, n // group).copy()
    else:
        m = np.negative(codes.offset.reshape(*lead, n // group))
    return q, s, m, group
