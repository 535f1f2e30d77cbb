"""Causal grouped-query attention with a block-diagonal mask for packed samples.

`attention_mask` and `attention_forward_ref` / `attention_backward_ref` are the NumPy reference
(the specification: it stores the (B, NKV, G, T, S) probabilities). `attention_forward` /
`attention_backward` are the CUDA twins, two ways: flash-style tiled kernels (here: fp32 on the
CUDA cores, an online softmax that never stores the probabilities; their cache,
`FlashAttentionCache`, keeps the log-sum-exp of each query row instead) for decoding and short
rows, and from `attention_gemm.GEMM_MIN_T` queries up (training, prefill) bf16 tensor-core GEMMs
over materialised scores (engine/kernels/attention_gemm.py). Not here: RoPE, the projections, the KV
cache's bookkeeping.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import attention_gemm
from .nvrtc import KernelSource
from .runtime import Runtime, f32_input, runtime_for


def attention_mask(
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    q_seg: np.ndarray | None = None,
    k_seg: np.ndarray | None = None,
) -> np.ndarray:
    """Boolean (B, T, S): query t sees key s when k_pos <= q_pos (and both lie in the same packed sample)."""
    allowed = k_pos[:, None, :] <= q_pos[:, :, None]
    if q_seg is not None and k_seg is not None:
        allowed &= k_seg[:, None, :] == q_seg[:, :, None]
    return allowed


class AttentionCache(NamedTuple):
    qg: np.ndarray  # (B, NKV, G, T, HS) queries grouped by their key/value head
    kt: np.ndarray  # (B, NKV, 1, HS, S) keys, transposed
    vt: np.ndarray  # (B, NKV, 1, S, HSV) values
    p: np.ndarray  # (B, NKV, G, T, S) attention probabilities (0 where masked)
    scale: float
    p_sink: np.ndarray | None = None  # (B, NKV, G, T, 1) the probability mass each row gave its sink


def attention_forward_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
                          sinks: np.ndarray | None = None):  # fmt: skip
    """Grouped-query attention. q (B, T, NH, HS); k (B, S, NKV, HS); v (B, S, NKV, HSV), HSV the value
    head size (HS but for multi-head latent attention); mask (B, T, S) bool; sinks (NH,) or None.

    Query head h reads key/value head h // (NH / NKV). z = q k^T * scale where the mask shows the key
    (-inf elsewhere); with sinks, head h's softmax has one more logit, sinks[h] (not scaled), whose
    value is zero (gpt-oss): p = exp(z - m) / (sum exp(z - m) + exp(sink - m)). Returns
    (B, T, NH*HSV). Sliding windows are masks (engine.model.forward builds them).
    """
    B, T, NH, HS = q.shape
    NKV, HSV = k.shape[2], v.shape[3]
    G = NH // NKV
    qg = q.reshape(B, T, NKV, G, HS).transpose(0, 2, 3, 1, 4)  # (B, NKV, G, T, HS)
    kt = k.transpose(0, 2, 3, 1)[:, :, None]  # (B, NKV, 1, HS, S)
    att = (qg @ kt) * scale  # (B, NKV, G, T, S)
    m = mask[:, None, None]  # (B, 1, 1, T, S)
    att = np.where(m, att, -np.inf)
    mx = att.max(axis=-1, keepdims=True)  # (B, NKV, G, T, 1)
    if sinks is not None:
        s = sinks.astype(q.dtype).reshape(1, NKV, G, 1, 1)
        mx = np.maximum(mx, s)
    p = np.exp(att - mx)
    denom = p.sum(axis=-1, keepdims=True)
    p_sink = None
    if sinks is not None:
        e_sink = np.exp(s - mx)
        denom = denom + e_sink
        p_sink = e_sink / denom
    p /= denom  # (B, NKV, G, T, S)
    vt = v.transpose(0, 2, 1, 3)[:, :, None]  # (B, NKV, 1, S, HSV)
    out = p @ vt  # (B, NKV, G, T, HSV)
    y = out.transpose(0, 3, 1, 2, 4).reshape(B, T, NH * HSV)
    return y, AttentionCache(qg, kt, vt, p, scale, p_sink)


def attention_backward_ref(dy: np.ndarray, cache: AttentionCache):
    """forward was: y = softmax([z, sink]) [v, 0] per KV group, z = mask(q k^T * scale).

    Returns (dq (B, T, NH, HS), dk (B, S, NKV, HS), dv (B, S, NKV, HSV), dsinks (NH,) or None without
    sinks)."""
    qg, kt, vt, p, scale, p_sink = cache
    B, NKV, G, T, HS = qg.shape
    HSV = vt.shape[-1]
    do = dy.reshape(B, T, NKV, G, HSV).transpose(0, 2, 3, 1, 4)  # (B, NKV, G, T, HSV)
    dp = do @ vt.swapaxes(-1, -2)  # (B, NKV, G, T, S)
    dv = (p.swapaxes(-1, -2) @ do).sum(axis=2)  # (B, NKV, S, HSV)
    D = (dp * p).sum(axis=-1, keepdims=True)  # a sink's value is 0: it adds p_sink * 0
    datt = p * (dp - D)  # softmax backward; masked p = 0
    dsinks = None
    if p_sink is not None:
        dsinks = (-(p_sink * D)).sum(axis=(0, 3, 4)).reshape(NKV * G)  # (NH,)
    datt *= scale
    dqg = datt @ kt.swapaxes(-1, -2)  # (B, NKV, G, T, HS)
    dk = (datt.swapaxes(-1, -2) @ qg).sum(axis=2)  # (B, NKV, S, HS)
    dq = dqg.transpose(0, 3, 1, 2, 4).reshape(B, T, NKV * G, HS)
    return dq, dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3), dsinks


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract: q (B, T, NH, HS), k (B, S, NKV, HS), v (B, S, NKV, HSV) float32 CuPy arrays, each with its
# inner three axes contiguous (a batch stride is allowed: the KV cache's [:, :S] views run without a
# copy); HS and HSV multiples of 4, at most 256; NH % NKV == 0; mask (B, T, S) bool (host or
# device); sinks (NH,) float32 or None. fp32 math; y is (B, T, NH*HSV). A query row that sees no key
# gives 0 (the reference gives NaN there; with sinks both give 0).
#
# Sinks: each row's softmax has one more logit, its head's sink, whose value is zero. The forward
# folds it into the row's running max and sum after the keys (so lse counts it, and every backward
# formula that takes p = exp(s - lse) is unchanged); the sinks' gradient is
# dsinks[h] = -sum_rows exp(sink_h - lse) D, D = rowsum(dO * O) (the dq kernel's Dt), one fixed-order
# block reduction per head (`attn_sink_grad`, cuda/attention_gemm.cu, which both paths share).
#
# The cache is a FlashAttentionCache: the reference's AttentionCache fields, holding
#   qg = q as given (B, T, NH, HS); kt = k (B, S, NKV, HS); vt = v (B, S, NKV, HSV); scale;
#   p_sink = the sinks (NH,) float32, or None; and
#   p = FlashState(o, lse, mask, tiles) in place of the probabilities: o the output (y's memory),
#   lse (B, NH, T) the log-sum-exp of each row's scaled, masked scores, mask (B, T, S) as uint8 on
#   the device, tiles (B, nQt, nKt) the class of each 32 x 32 tile of the mask: 0 nothing visible
#   (skipped), 1 all visible (the mask is not read), 2 mixed (read). Causal and packed-sample masks
#   make most tiles 0 or 1, so about half the work of a causal mask is skipped outright.
#
# attn_tile_class: grid (nKt, nQt, B), 256 threads, one 32 x 32 tile each (__syncthreads_count).
#   Reads the mask once: B T S bytes.
# attn_fwd_d{D}: grid (nQt = ceil(T/32), NH, B), 256 threads: 32 query rows per block, 8 lanes per row,
#   each lane holding D/8 of the row's values (float4 chunks lane, lane + 8, ...: the 8 lanes of a row read
#   128 contiguous bytes). D (64, 128, 256) is the smallest >= max(HS, HSV) (real models: 64, 80, 96, 128,
#   192, 256; smaller test heads run padded to 64; the lanes past HS or HSV hold zeros). Per visible key
#   tile, K and V rows go to shared memory (SUB = min(32, 4096/D) rows at a time, 16-byte loads, 32 KB at
#   most); every row takes its scores 16 keys at a time (an 8-lane dot product, 3 shuffles), updates its
#   running max m and sum l (online softmax), rescales and accumulates o += p v. Writes o / l and lse = m +
#   log l. FLOPs 4 B NH T S_vis HS (S_vis: visible keys per query; T/2 causal); bytes q, o: 8 B T NH HS, k,
#   v: 8 B S NKV HS per query block (L2-resident across the blocks of a head). SIMT fp32 (FFMA), not tensor
#   cores: the ceiling is the fp32 rate (~60 TFLOP/s on an H100), so at T = 4096 attention costs about what
#   a layer's bf16 GEMMs do; a bf16 mma version is the next step once this one is verified on a GPU.
# attn_bwd_dq_d{D}: grid (nQt, NH, B), the forward's layout. Each row first forms
#   Dt = sum(dO * O) (written for the dK/dV kernel), then per visible key: s, p = exp(s - lse),
#   dp = dO . v, ds = p (dp - Dt), dq += ds k; dq *= scale. FLOPs 6 B NH T S_vis HS.
# attn_bwd_dkdv_d{D}: grid (nKt, NKV, B), 32 key rows per block, 8 lanes per row holding k, v and
#   the dk, dv accumulators; loops over the G query heads of its KV head and the visible query
#   tiles (Q and dO rows in shared memory): p, dp as above, dv += p dO, dk += ds q; dk *= scale.
#   FLOPs 8 B NH T S_vis HS. Splitting dQ from dK/dV recomputes q.k and dO.v once more (7 products
#   instead of FlashAttention-2's 5) but needs no atomics: every gradient is the same on every run.

ATTN_DIMS = (64, 128, 256)  # head-size instantiations (HS is padded up to the next one)
TILE = 32  # rows and columns of a mask tile; query rows per block of the forward and dq kernels
THREADS = 256


class FlashState(NamedTuple):
    """What the CUDA attention keeps for its backward instead of the probabilities."""

    o: Any  # (B, T, NH, HSV) the output (the memory of y)
    lse: Any  # (B, NH, T) log-sum-exp of each query row's scaled, masked scores and its sink (-inf: none)
    mask: Any  # (B, T, S) uint8: the bool mask's bytes, on the device
    tiles: Any  # (B, ceil(T/32), ceil(S/32)) uint8: 0 no key visible, 1 all visible, 2 mixed


class FlashAttentionCache(AttentionCache):
    """The CUDA twin's AttentionCache: the same fields, holding qg = q (B, T, NH, HS) as given,
    kt = k (B, S, NKV, HS), vt = v (B, S, NKV, HSV), p = FlashState (see there), scale, and
    p_sink = the sinks (NH,) or None."""

    __slots__ = ()


SOURCE = KernelSource.from_file(
    "attention.cu",
    kernels=("attn_tile_class",)
    + tuple(f"attn_{k}_d{d}" for d in ATTN_DIMS for k in ("fwd", "bwd_dq", "bwd_dkdv")),
)
SOURCES = (SOURCE,)


def _heads(rt: Runtime, a: Any, what: str) -> tuple[Any, int]:
    """(array, batch stride in elements) for a float32 (B, L, H, HS) array whose inner three axes
    are contiguous (a batch stride is kept: the KV cache's views); anything else is copied."""
    a = rt.xp.asarray(a)
    if a.dtype.name != "float32" or a.ndim != 4:
        raise ValueError(f"attention {what} must be float32 (B, L, H, HS), got {a.dtype} {tuple(a.shape)}")
    _, L, H, HS = a.shape
    inner = (L * H * HS * 4, H * HS * 4, HS * 4, 4)
    if tuple(a.strides[1:]) != inner[1:] or a.strides[0] < inner[0] or rt.address(a) % 16:
        a = rt.xp.ascontiguousarray(a)
    return a, int(a.strides[0] // 4)


def head_dim_kernel(HS: int) -> int:
    """The kernels' D for head size HS (ValueError when none fits)."""
    if HS % 4 or HS > ATTN_DIMS[-1] or HS <= 0:
        raise ValueError(f"head size {HS} is not supported by the CUDA attention (a multiple of 4, <= 256)")
    return next(d for d in ATTN_DIMS if d >= HS)


def _sinks(rt: Runtime, sinks: Any, NH: int) -> Any:
    if sinks is None:
        return None
    sinks = f32_input(rt, sinks, "attention sinks")
    if tuple(sinks.shape) != (NH,):
        raise ValueError(f"attention sinks must be ({NH},), one per query head; got {tuple(sinks.shape)}")
    return sinks


def attention_forward_on(
    rt: Runtime,
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    scale: float,
    sinks: Any = None,
    *,
    method: str | None = None,
):
    """`attention_forward` on a runtime. method: "flash" (these kernels: fp32, SIMT), "gemm" (bf16
    tensor cores, engine/kernels/attention_gemm.py), or None: "gemm" from GEMM_MIN_T queries up
    (training, prefill), else "flash" (decoding)."""
    xp = rt.xp
    q, qbs = _heads(rt, q, "queries q")
    k, kbs = _heads(rt, k, "keys k")
    v, vbs = _heads(rt, v, "values v")
    B, T, NH, HS = q.shape
    S, NKV, HSV = k.shape[1], k.shape[2], v.shape[3]
    if tuple(k.shape) != (B, S, NKV, HS) or tuple(v.shape[:3]) != (B, S, NKV) or NKV == 0 or NH % NKV:
        raise ValueError(
            f"attention shapes do not agree: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
            "(k (B, S, NKV, HS) and v (B, S, NKV, HSV) with NH a multiple of NKV)"
        )
    mask = xp.asarray(mask)
    if tuple(mask.shape) != (B, T, S) or mask.dtype.itemsize != 1:
        raise ValueError(f"attention mask must be bool ({B}, {T}, {S}), got {mask.dtype} {tuple(mask.shape)}")
    mask_u8 = xp.ascontiguousarray(mask).view(xp.uint8)
    sinks = _sinks(rt, sinks, NH)
    if method is None:
        method = "gemm" if T >= attention_gemm.GEMM_MIN_T and B and S else "flash"
    if method == "gemm":
        return attention_gemm.forward_on(rt, q, k, v, mask_u8, scale, (qbs, kbs, vbs), sinks)
    if method != "flash":
        raise ValueError(f"attention method must be 'flash', 'gemm' or None, got {method!r}")
    D = max(head_dim_kernel(HS), head_dim_kernel(HSV))
    nQt, nKt = -(-T // TILE), -(-S // TILE)
    tiles = xp.empty((B, nQt, nKt), dtype=xp.uint8)
    o = xp.empty((B, T, NH, HSV), dtype=xp.float32)
    lse = xp.empty((B, NH, T), dtype=xp.float32)
    if B and T and S:
        args = (mask_u8, np.int32(T), np.int32(S), np.int32(nQt), np.int32(nKt), tiles)
        rt.launch(SOURCE, "attn_tile_class", (nKt, nQt, B), (THREADS,), args)
        dims = (np.int32(T), np.int32(S), np.int32(NH), np.int32(NKV), np.int32(HS), np.int32(HSV))
        strides = (np.int64(qbs), np.int64(kbs), np.int64(vbs), np.float32(scale))
        args = (q, k, v, sinks, mask_u8, tiles, o, lse, *dims, *strides)
        rt.launch(SOURCE, f"attn_fwd_d{D}", (nQt, NH, B), (THREADS,), args)
    elif o.size:  # no key at all: every row gives 0 (its sink takes the whole mass)
        o.fill(0)
        lse[...] = -np.inf if sinks is None else sinks[None, :, None]
    cache = FlashAttentionCache(q, k, v, FlashState(o, lse, mask_u8, tiles), float(scale), sinks)
    return o.reshape(B, T, NH * HSV), cache


def attention_backward_on(rt: Runtime, dy: Any, cache: AttentionCache):
    """`attention_backward` on a runtime."""
    if isinstance(cache, attention_gemm.GemmAttentionCache):
        return attention_gemm.backward_on(rt, dy, cache)
    xp = rt.xp
    q, k, v, state, scale, sinks = cache
    if not isinstance(state, FlashState):
        raise TypeError(
            "attention_backward (CUDA) needs the cache of attention_forward (CUDA), a FlashAttentionCache; "
            f"got {type(cache).__name__} holding {type(state).__name__}"
        )
    B, T, NH, HS = q.shape
    S, NKV, HSV = k.shape[1], k.shape[2], v.shape[3]
    D = max(head_dim_kernel(HS), head_dim_kernel(HSV))
    qbs, kbs, vbs = (int(a.strides[0] // 4) for a in (q, k, v))
    dout = f32_input(rt, dy, "attention gradient dy")
    if dout.size != B * T * NH * HSV:
        raise ValueError(
            f"attention gradient has shape {tuple(dy.shape)}, the output is ({B}, {T}, {NH * HSV})"
        )
    dout = dout.reshape(B, T, NH, HSV)
    dq = xp.empty((B, T, NH, HS), dtype=xp.float32)
    dk = xp.empty((B, S, NKV, HS), dtype=xp.float32)
    dv = xp.empty((B, S, NKV, HSV), dtype=xp.float32)
    Dbuf = xp.empty((B, NH, T), dtype=xp.float32)
    if not (B and T and S):
        for a in (dq, dk, dv, Dbuf):
            a.fill(0)
        return dq, dk, dv, attention_gemm.sink_grad_on(rt, sinks, state.lse, Dbuf)
    nQt, nKt = -(-T // TILE), -(-S // TILE)
    dims = (np.int32(T), np.int32(S), np.int32(NH), np.int32(NKV), np.int32(HS), np.int32(HSV))
    strides = (np.int64(qbs), np.int64(kbs), np.int64(vbs), np.float32(scale))
    args = (q, k, v, state.o, dout, state.lse, state.mask, state.tiles, dq, Dbuf, *dims, *strides)
    rt.launch(SOURCE, f"attn_bwd_dq_d{D}", (nQt, NH, B), (THREADS,), args)
    args = (q, k, v, dout, state.lse, Dbuf, state.mask, state.tiles, dk, dv, *dims, *strides)
    rt.launch(SOURCE, f"attn_bwd_dkdv_d{D}", (nKt, NKV, B), (THREADS,), args)
    return dq, dk, dv, attention_gemm.sink_grad_on(rt, sinks, state.lse, Dbuf)


def attention_forward(q: Any, k: Any, v: Any, mask: Any, scale: float, sinks: Any = None):
    """CUDA twin of `attention_forward_ref`: y (B, T, NH*HSV) and a FlashAttentionCache or a
    GemmAttentionCache."""
    return attention_forward_on(runtime_for(q, "attention_forward"), q, k, v, mask, scale, sinks)


def attention_backward(dy: Any, cache: AttentionCache):
    """CUDA twin of `attention_backward_ref`: (dq (B, T, NH, HS), dk (B, S, NKV, HS), dv (B, S, NKV, HSV),
    dsinks (NH,) or None)."""
    return attention_backward_on(runtime_for(dy, "attention_backward"), dy, cache)
