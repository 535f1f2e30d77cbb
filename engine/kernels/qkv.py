"""The attention input of the fused training step: q, k and v from the output of one concatenated
projection [Wq; Wk; Wv], with the bias (qwen2), the per-head q/k RMSNorm (qwen3) and RoPE in one
kernel, and its backward in another.

`qkv_rope_forward_ref` / `qkv_rope_backward_ref` are the NumPy reference (the specification), built
from the references of the ops they fuse (`rmsnorm_forward_ref`, `rope_forward_ref`).
`qkv_rope_forward_on` / `qkv_rope_backward_on` are the CUDA twins on a runtime: the projection's
output comes in as bf16 bits (the GEMM writes it so), q, k, v leave as float32 (B, T, H, HS) for the
tensor-core attention, and the backward writes dz as bf16 bits beside the LoRA columns of the
buffer the input-gradient GEMM reads. Not here: the projection itself (engine.train.dense_step) or
the attention.
"""

from __future__ import annotations

import numpy as np

from .norm import rmsnorm_backward_ref, rmsnorm_forward_ref
from .nvrtc import KernelSource
from .rope import rope_backward_ref, rope_forward_ref
from .runtime import Runtime


def _split(z: np.ndarray, NH: int, NKV: int, HS: int):
    B, T = z.shape[:2]
    nq, nk = NH * HS, NKV * HS
    q = z[..., :nq].reshape(B, T, NH, HS)
    k = z[..., nq : nq + nk].reshape(B, T, NKV, HS)
    v = z[..., nq + nk : nq + 2 * nk].reshape(B, T, NKV, HS)
    return q, k, v


def qkv_rope_forward_ref(qkv, bias, q_norm, k_norm, eps, cos, sin, style, NH, NKV, HS):
    """(q, k, v) float (B, T, H, HS) from qkv (B, T, >= (NH + 2 NKV) HS), the projection's output
    ([q | k | v | anything after]): z = qkv + bias; q, k = rope(rmsnorm_per_head(z) * norm weight)
    (no norm when q_norm / k_norm are None); v = z's v columns. cos, sin (B, T, n_rot/2)."""
    n = (NH + 2 * NKV) * HS
    z = qkv[..., :n] + (bias if bias is not None else 0.0)
    q, k, v = _split(z, NH, NKV, HS)
    if q_norm is not None:
        q, _ = rmsnorm_forward_ref(q, q_norm, eps)
        k, _ = rmsnorm_forward_ref(k, k_norm, eps)
    q, _ = rope_forward_ref(q, cos, sin, style)
    k, _ = rope_forward_ref(k, cos, sin, style)
    return q, k, v


def qkv_rope_backward_ref(dq, dk, dv, qkv, bias, q_norm, k_norm, eps, cos, sin, style, NH, NKV, HS):
    """forward was: z = qkv + bias, q, k = rope(rmsnorm_head(z) w), v = z.  Returns dz (B, T, (NH +
    2 NKV) HS), the gradient of the projection's q, k, v columns (also that of the bias)."""
    from .norm import NormCache
    from .rope import RopeCache

    B, T = dq.shape[:2]
    n = (NH + 2 * NKV) * HS
    z = qkv[..., :n] + (bias if bias is not None else 0.0)
    zq, zk, _ = _split(z, NH, NKV, HS)
    gq = rope_backward_ref(dq, RopeCache(cos, sin, style))
    gk = rope_backward_ref(dk, RopeCache(cos, sin, style))
    if q_norm is not None:
        for name, zz, w in (("q", zq, q_norm), ("k", zk, k_norm)):
            rstd = 1.0 / np.sqrt(np.mean(zz * zz, axis=-1, keepdims=True) + eps)
            g, _ = rmsnorm_backward_ref(gq if name == "q" else gk, NormCache(zz * rstd, rstd), w)
            if name == "q":
                gq = g
            else:
                gk = g
    return np.concatenate([gq.reshape(B, T, -1), gk.reshape(B, T, -1), dv.reshape(B, T, -1)], axis=-1)


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract: qkv (N, ld) bf16 bits (uint16; the first (NH + 2 NKV) HS columns are q | k | v), bias
# ((NH + 2 NKV) HS,) float32 or None, q_norm / k_norm (HS,) float32 or None, cos / sin (N, n_rot/2)
# float32, HS <= 256 and even. Forward writes q (N, NH, HS), k, v (N, NKV, HS) float32 (the
# attention's (B, T, H, HS) layout); backward reads dq, dk, dv in that layout and writes dz as bf16
# bits into the first (NH + 2 NKV) HS columns of `out` (N, >= that, rows may be strided). fp32 math.
#
# qkv_rope_fwd / qkv_rope_bwd: one warp per (token, head) row, 8 rows per 256-thread block; a row
#   goes through shared memory so that a lane reads its rotation partner; the per-head norm is a
#   warp reduction. Floor: forward 2 + 4 bytes per value (read bf16, write fp32), backward 4 + 2
#   (+ 2 to recompute the norm): a 4096-token qwen2.5-1.5B layer moves about 25 MB, ~8 us.

ROWS = 8  # rows (one warp each) per block
SOURCE = KernelSource.from_file("qkv.cu", kernels=("qkv_rope_fwd", "qkv_rope_bwd"))
SOURCES = (SOURCE,)


def _grid(N: int, NH: int, NKV: int) -> int:
    return -(-(N * (NH + 2 * NKV)) // ROWS)


def _check(HS: int, half: int) -> None:
    if HS > 256 or HS % 2 or 2 * half > HS:
        raise ValueError(
            f"qkv_rope takes heads of at most 256 even dims with n_rot <= HS, got HS {HS}, n_rot {2 * half}"
        )


def qkv_rope_forward_on(rt: Runtime, qkv, bias, q_norm, k_norm, eps, cos, sin, style, NH, NKV, HS, out=None):
    """`qkv_rope_forward_ref` on a runtime; `out` = (q, k, v) float32 buffers to write (else new)."""
    xp = rt.xp
    N = qkv.shape[0]
    half = cos.shape[-1]
    _check(HS, half)
    if out is None:
        out = tuple(xp.empty((N, H, HS), xp.float32) for H in (NH, NKV, NKV))
    q, k, v = out
    ld = np.int64(qkv.strides[0] // 2)
    args = (qkv, ld, bias, q_norm, k_norm, cos, sin, q, k, v, np.int64(N), np.int32(NH), np.int32(NKV))
    args += (np.int32(HS), np.int32(half), np.int32(style == "neox"), np.float32(eps))
    rt.launch(SOURCE, "qkv_rope_fwd", (_grid(N, NH, NKV),), (32 * ROWS,), args)
    return q, k, v


def qkv_rope_backward_on(
    rt: Runtime, dq, dk, dv, qkv, bias, q_norm, k_norm, eps, cos, sin, style, NH, NKV, HS, out
):
    """`qkv_rope_backward_ref` on a runtime, dz written as bf16 bits into `out`'s first columns."""
    N = qkv.shape[0]
    half = cos.shape[-1]
    _check(HS, half)
    ld, ld_out = np.int64(qkv.strides[0] // 2), np.int64(out.strides[0] // 2)
    args = (dq, dk, dv, qkv, ld, bias, q_norm, k_norm, cos, sin, out, ld_out, np.int64(N), np.int32(NH))
    args += (np.int32(NKV), np.int32(HS), np.int32(half), np.int32(style == "neox"), np.float32(eps))
    rt.launch(SOURCE, "qkv_rope_bwd", (_grid(N, NH, NKV),), (32 * ROWS,), args)
    return out
