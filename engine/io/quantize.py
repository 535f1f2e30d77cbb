"""Quantizing float arrays into ggml block formats, for writing GGUF files.

gguf-py quantizes F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 but only
dequantizes the K-quants; this module adds Q4_K and Q6_K with simple
round-to-nearest scales (not llama-quantize's error-minimising search: fine
for test fixtures, benchmarks and adapter export, not a replacement for
`llama-quantize`). The layouts are the exact inverse of `gguf.quants`'
dequantizers, which the tests check. Outputs are uint8 arrays of shape
(*rows, bytes per row), as `GGUFWriter.add_tensor(..., raw_dtype=...)` takes.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from ..errors import ExportError

QK_K = 256


def _blocks(x: np.ndarray, block: int) -> np.ndarray:
    if x.shape[-1] % block:
        raise ExportError(f"rows of {x.shape[-1]} values cannot be split into blocks of {block}")
    return x.reshape(-1, block).astype(np.float32)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K: 16 sub-blocks of 16 with int8 scales and one fp16 scale per 256; q in [-32, 31]."""
    xb = _blocks(x, QK_K)  # (n, 256)
    n = xb.shape[0]
    sub = xb.reshape(n, 16, 16)
    amax = np.abs(sub).max(axis=-1)  # (n, 16)
    sub_scale = amax / 31.0
    d = sub_scale.max(axis=-1) / 127.0  # (n,)
    d16 = d.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d16[:, None] > 0, np.rint(sub_scale / d16[:, None]), 0).clip(-128, 127).astype(np.int8)
        step = d16[:, None] * sc.astype(np.float32)  # (n, 16)
        q = np.where(step[..., None] > 0, np.rint(sub / step[..., None]), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(n, 2, 128)  # halves of 128 values
    low, high = q & 0x0F, q >> 4
    # ql[h*64 + l] = low[h*128 + l] | low[h*128 + 64 + l] << 4
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(n, 128)
    # qh[h*32 + l] = sum_s high[h*128 + s*32 + l] << 2s
    hs = high.reshape(n, 2, 4, 32)
    qh = (hs[:, :, 0] | (hs[:, :, 1] << 2) | (hs[:, :, 2] << 4) | (hs[:, :, 3] << 6)).reshape(n, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d16)], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * 210)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins; value = d*sc*q - dmin*m, q in [0, 15]."""
    xb = _blocks(x, QK_K)
    n = xb.shape[0]
    sub = xb.reshape(n, 8, 32)
    lo = np.minimum(sub.min(axis=-1), 0.0)  # (n, 8), <= 0
    hi = sub.max(axis=-1)
    scale = (hi - lo) / 15.0  # (n, 8)
    mins = -lo  # >= 0
    d = (scale.max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)  # (n,)
    dmin = (mins.max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin[:, None] > 0, np.rint(mins / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = d[:, None] * sc.astype(np.float32)
        offset = dmin[:, None] * mn.astype(np.float32)
        q = np.where(step[..., None] > 0, np.rint((sub + offset[..., None]) / step[..., None]), 0)
    q = q.clip(0, 15).astype(np.uint8)  # (n, 8, 32)
    scales = np.empty((n, 12), np.uint8)
    scales[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    # qs chunk c (32 bytes) holds sub-block 2c in the low nibble and 2c+1 in the high nibble
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, 128)
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), scales, qs], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * 144)


_OWN = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}
_GGUF_PY = ("BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def quantizable_types() -> tuple[str, ...]:
    return ("F32", "F16", *_GGUF_PY, *_OWN)


def quantize(x: np.ndarray, qtype: str) -> np.ndarray:
    """Float array -> the bytes of `qtype` blocks, shape (*rows, bytes per row); F32/F16 stay float arrays."""
    if qtype == "F32":
        return np.ascontiguousarray(x, dtype=np.float32)
    if qtype == "F16":
        return np.ascontiguousarray(x, dtype=np.float16)
    if qtype in _OWN:
        return _OWN[qtype](np.asarray(x, np.float32))
    if qtype not in _GGUF_PY:
        raise ExportError(f"cannot quantize to {qtype}; supported: {', '.join(quantizable_types())}")
    qt = GGMLQuantizationType[qtype]
    block = GGML_QUANT_SIZES[qt][0]
    if x.shape[-1] % block:
        raise ExportError(f"{qtype} needs rows that are a multiple of {block} values, got {x.shape[-1]}")
    return gguf_quants.quantize(np.asarray(x, np.float32), qt)
