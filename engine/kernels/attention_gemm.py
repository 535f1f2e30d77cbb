"""Causal grouped-query attention on the tensor cores: the scores materialised a block of heads at a
time by bf16 cuBLAS GEMMs, the softmax and its backward by elementwise kernels.

The CUDA twin of `attention.attention_forward_ref` / `attention_backward_ref` (same arguments, same
results within bf16 rounding) that `attention.attention_forward_on` picks for training and prefill
(T >= GEMM_MIN_T queries); the flash kernels of `attention.py` (exact fp32, SIMT) keep decoding and
short rows. Measured on an H100 the flash kernels ran at 10-14 TFLOP/s, 50-70x their floor
(bench/GPU_NOTES.md); here every product runs on the tensor cores and the rest is a few passes over
the scores.

Layout. With G = NH / NKV query heads per key/value head, the G heads' queries of one (batch, KV
head) entry are one (G*T, HS) matrix once q is transposed head-major, so each product is one
strided-batched GEMM over the B*NKV entries (no per-head loop, and dK, dV sum over the G heads
inside the GEMM's contraction):

    Qh (B*NKV, G*T, HS), Kh (B*NKV, S, HS), Vh (B*NKV, S, HSV): bf16 copies, head-major (`attg_pack`)
    forward:  Z = scale Qh Kh^T (fp32)      P = softmax(mask(Z)) (bf16), lse   O = P Vh (fp32)
    backward: Z again, dP = dOh Vh^T (fp32) P, dS = P (dP - D) scale (bf16)
              dVh = P^T dOh   dKh = dS^T Qh   dQh = dS Kh                      (fp32 outputs)

D = rowsum(dO * O) (fp32, `attg_rowdot`). Sinks (gpt-oss: one more logit per head, whose value is
zero) join each row's max and sum in `attg_softmax`, so lse counts them and the backward's P =
exp(Z - lse) is unchanged; their gradient, -sum_rows exp(sink - lse) D, is `attn_sink_grad`. A value
head size of its own (HSV, multi-head latent attention) changes only the shapes of Vh, O and dO.

Z and dP are float32 and P, dS bf16: 12 bytes per score in the backward, so entries go through in
chunks of at most CHUNK_BYTES of scores (an entry is G*T*S scores). Every product has bf16 operands
and fp32 accumulation (cuBLAS CUBLAS_COMPUTE_32F): q, k, v, dO, P and dS are rounded to bf16
(nearest-even), so results carry bf16's ~3e-3 relative rounding, like the frozen-weight GEMMs of
`linear.py`; the softmax, lse and D are fp32.

Work: the forward's two products are 4*B*NH*T*S*HS FLOPs and the backward's five (Z again, dP, dV,
dK, dQ) 10*B*NH*T*S*HS, over the whole square of scores (masked ones included: twice a causal
mask's useful work, but at the tensor cores' rate, ~700 TFLOP/s on an H100, instead of the CUDA
cores' ~50); the scores cost 4 + 2 bytes written and read once each forward, 12 + 12 backward.
Measured on an H100 at B 2, T 2048, 32 heads of 128 (bench/gpu.py, bench/GPU_NOTES.md): forward
2.0-2.8 ms and backward 4.0-5.7 ms, against the flash kernels' 5.8-6.0 and 17.4-17.5 ms.

Cache: `GemmAttentionCache`, the reference's AttentionCache fields holding qg = Qh, kt = Kh,
vt = Vh (bf16, packed as above), p = GemmState(o, lse, mask), scale, p_sink = the sinks (NH,) or None.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .nvrtc import KernelSource
from .runtime import Runtime, f32_input

GEMM_MIN_T = 32  # queries per row from which `attention_forward_on` takes this path
CHUNK_BYTES = 512 << 20  # scores of one chunk of entries: 12 bytes each in the backward
THREADS = 256


class GemmState(NamedTuple):
    """What the tensor-core attention keeps for its backward."""

    o: Any  # (B, T, NH, HSV) float32: the output (the memory of y)
    lse: Any  # (B, NH, T) float32: log-sum-exp of each query row's scaled, masked scores (-inf: none)
    mask: Any  # (B, T, S) uint8 on the device


class GemmAttentionCache(NamedTuple):
    """The tensor-core path's cache: the fields of the reference's AttentionCache in this path's
    layouts (its own type, as attention.py, which picks this path, imports this module)."""

    qg: Any  # Qh (B*NKV, G*T, HS) bf16 bits (uint16)
    kt: Any  # Kh (B*NKV, S, HS) bf16 bits
    vt: Any  # Vh (B*NKV, S, HSV) bf16 bits
    p: GemmState
    scale: float
    p_sink: Any = None  # the sinks (NH,) float32, or None (their gradient comes from lse and D)


SOURCE = KernelSource.from_file(
    "attention_gemm.cu",
    kernels=("attg_pack", "attg_softmax", "attg_softmax_back", "attg_rowdot", "attn_sink_grad"),
)
SOURCES = (SOURCE,)


def _grid(n: int) -> int:
    return max(1, min(65535 * 4, -(-n // THREADS)))


def _pack(rt: Runtime, x: Any, bs: int) -> Any:
    """float32 (B, L, H, HS) with batch stride `bs` (elements) -> bf16 bits (B, H, L, HS)."""
    B, L, H, HS = x.shape
    y = rt.xp.empty((B, H, L, HS), dtype=rt.xp.uint16)
    n = y.size
    if n:
        args = (x, y, np.int64(bs), np.int32(L), np.int32(H), np.int32(HS), np.int64(n))
        rt.launch(SOURCE, "attg_pack", (_grid(n),), (THREADS,), args)
    return y


def _chunks(entries: int, per_entry: int) -> list[tuple[int, int]]:
    """[e0, e1) ranges of entries whose scores (per_entry each, 12 bytes a score) fit CHUNK_BYTES."""
    n = max(1, CHUNK_BYTES // max(1, 12 * per_entry))
    return [(e0, min(entries, e0 + n)) for e0 in range(0, entries, n)]


def sink_grad_on(rt: Runtime, sinks: Any, lse: Any, D: Any) -> Any:
    """dsinks (NH,) = -sum over (b, t) of exp(sinks - lse) D, from lse and D (B, NH, T); None without
    sinks."""
    if sinks is None:
        return None
    B, NH, T = lse.shape
    dsinks = rt.xp.empty((NH,), dtype=rt.xp.float32)
    args = (sinks, lse, D, np.int32(B), np.int32(NH), np.int32(T), dsinks)
    rt.launch(SOURCE, "attn_sink_grad", (NH,), (THREADS,), args)
    return dsinks


def forward_on(rt: Runtime, q: Any, k: Any, v: Any, mask_u8: Any, scale: float, bs: tuple[int, int, int],
               sinks: Any = None):  # fmt: skip
    """The forward on checked inputs (attention.attention_forward_on's): q (B, T, NH, HS), k
    (B, S, NKV, HS), v (B, S, NKV, HSV) float32 with batch strides `bs`, mask_u8 (B, T, S) uint8
    contiguous, sinks (NH,) float32 or None. Returns (y (B, T, NH*HSV), GemmAttentionCache)."""
    xp = rt.xp
    B, T, NH, HS = q.shape
    S, NKV, HSV = k.shape[1], k.shape[2], v.shape[3]
    G = NH // NKV
    E = B * NKV
    Qh = _pack(rt, q, bs[0]).reshape(E, G * T, HS)
    Kh = _pack(rt, k, bs[1]).reshape(E, S, HS)
    Vh = _pack(rt, v, bs[2]).reshape(E, S, HSV)
    lse = xp.empty((B, NH, T), dtype=xp.float32)
    Oh = xp.empty((E, G * T, HSV), dtype=xp.float32)
    per = G * T * S
    for e0, e1 in _chunks(E, per):
        n = e1 - e0
        z = xp.empty((n, G * T, S), dtype=xp.float32)
        p = xp.empty((n, G * T, S), dtype=xp.uint16)
        rt.gemm_batched(Qh[e0:e1], Kh[e0:e1], z, trans_b=True, alpha=scale)
        args = (z, mask_u8, sinks, p, lse, np.int64(e0 * G * T), np.int32(T), np.int32(S), np.int32(NH))
        rt.launch(SOURCE, "attg_softmax", (n * G * T,), (THREADS,), args)
        rt.gemm_batched(p, Vh[e0:e1], Oh[e0:e1])
        del z, p
    o = xp.ascontiguousarray(Oh.reshape(B, NH, T, HSV).transpose(0, 2, 1, 3))
    cache = GemmAttentionCache(Qh, Kh, Vh, GemmState(o, lse, mask_u8), float(scale), sinks)
    return o.reshape(B, T, NH * HSV), cache


def backward_on(rt: Runtime, dy: Any, cache: GemmAttentionCache):
    """(dq (B, T, NH, HS), dk (B, S, NKV, HS), dv (B, S, NKV, HSV), dsinks (NH,) or None) float32 for
    the forward that made `cache`."""
    xp = rt.xp
    Qh, Kh, Vh, state, scale, sinks = cache
    B, NH, T = state.lse.shape
    E, S, HS = Kh.shape
    HSV = Vh.shape[2]
    NKV = E // B
    G = NH // NKV
    dout = f32_input(rt, dy, "attention gradient dy")
    if dout.size != B * T * NH * HSV:
        raise ValueError(
            f"attention gradient has shape {tuple(dy.shape)}, the output is ({B}, {T}, {NH * HSV})"
        )
    dout = dout.reshape(B, T, NH, HSV)
    dOh = _pack(rt, dout, T * NH * HSV).reshape(E, G * T, HSV)
    Drow = xp.empty((B, NH, T), dtype=xp.float32)
    rows = B * T * NH
    args = (dout, state.o, Drow, np.int64(rows), np.int32(T), np.int32(NH), np.int32(HSV))
    rt.launch(SOURCE, "attg_rowdot", (max(1, -(-rows * 32 // THREADS)),), (THREADS,), args)
    dQh = xp.empty((E, G * T, HS), dtype=xp.float32)
    dKh = xp.empty((E, S, HS), dtype=xp.float32)
    dVh = xp.empty((E, S, HSV), dtype=xp.float32)
    for e0, e1 in _chunks(E, G * T * S):
        n = e1 - e0
        z = xp.empty((n, G * T, S), dtype=xp.float32)
        dp = xp.empty((n, G * T, S), dtype=xp.float32)
        p = xp.empty((n, G * T, S), dtype=xp.uint16)
        ds = xp.empty((n, G * T, S), dtype=xp.uint16)
        rt.gemm_batched(Qh[e0:e1], Kh[e0:e1], z, trans_b=True, alpha=scale)
        rt.gemm_batched(dOh[e0:e1], Vh[e0:e1], dp, trans_b=True)
        cnt = z.size
        args = (z, dp, state.mask, state.lse, Drow, p, ds, np.int64(e0 * G * T), np.int64(cnt),
                np.int32(T), np.int32(S), np.int32(NH), np.float32(scale))  # fmt: skip
        rt.launch(SOURCE, "attg_softmax_back", (_grid(cnt),), (THREADS,), args)
        rt.gemm_batched(p, dOh[e0:e1], dVh[e0:e1], trans_a=True)
        rt.gemm_batched(ds, Qh[e0:e1], dKh[e0:e1], trans_a=True)
        rt.gemm_batched(ds, Kh[e0:e1], dQh[e0:e1])
        del z, dp, p, ds
    dq = xp.ascontiguousarray(dQh.reshape(B, NH, T, HS).transpose(0, 2, 1, 3))
    dk = xp.ascontiguousarray(dKh.reshape(B, NKV, S, HS).transpose(0, 2, 1, 3))
    dv = xp.ascontiguousarray(dVh.reshape(B, NKV, S, HSV).transpose(0, 2, 1, 3))
    return dq, dk, dv, sink_grad_on(rt, sinks, state.lse, Drow)
