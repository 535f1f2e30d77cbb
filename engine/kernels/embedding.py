"""Token embedding (get_rows) with llama.cpp's token_embd LoRA layout, and the row-access helpers that
let a lazy weight (the weight store's views) be read a block of rows at a time.

`embedding_forward_ref` / `embedding_backward_ref` are the NumPy reference (the specification).
`embedding_forward` / `embedding_backward` are the CUDA twins: a get_rows kernel (float32 or bf16
rows to float32), the LoRA term through cuBLAS, and a deterministic scatter-add (rows sorted by
token once, one owner block per distinct token, no atomics) for the gradients. `scatter_add_rows_on`
is that scatter-add for other twins. Not here: dequantizing a quantized embedding's rows (the
weight store's `take_rows`, which the twin calls when the weight has it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .linear import LoraTerm
from .nvrtc import KernelSource
from .runtime import Runtime, aligned16, cuda_runtime, f32_input, runtime_for


def take_rows(w, idx: np.ndarray) -> np.ndarray:
    """w[idx] for an array, or only those rows dequantized for a lazy view (get_rows)."""
    take = getattr(w, "take_rows", None)
    return take(idx) if take is not None else w[idx]


def row_chunks(w):
    """(lo, hi, rows lo..hi) blocks covering a (V, C) weight: one block for an array."""
    chunks = getattr(w, "row_chunks", None)
    return chunks() if chunks is not None else ((0, w.shape[0], w),)


class EmbeddingCache(NamedTuple):
    tokens: np.ndarray  # (B, T) ids (int32 on the device from the CUDA twin)
    shape: tuple[int, int]  # (V, C) of the embedding
    lora: LoraTerm | None


def embedding_forward_ref(wte, tokens: np.ndarray, lora: LoraTerm | None = None):
    """x = wte[tokens] (+ s * A[tokens] B^T, llama.cpp's layout for token_embd LoRA)."""
    x = take_rows(wte, tokens)  # (B, T, C)
    if lora is not None:
        x = x + lora.s * (lora.A[tokens] @ lora.B.T)
    return x, EmbeddingCache(tokens, tuple(wte.shape), lora)


def scatter_add_rows(dst: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> None:
    """dst[idx[i]] += rows[i] for repeated indices, without np.add.at's slowness (sort + reduceat)."""
    idx = idx.reshape(-1)
    rows = rows.reshape(idx.size, -1)
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    uniq, starts = np.unique(sorted_idx, return_index=True)
    dst[uniq] += np.add.reduceat(rows[order], starts, axis=0).reshape(len(uniq), *dst.shape[1:])


def embedding_backward_ref(dx: np.ndarray, cache: EmbeddingCache, need_dw: bool = False):
    """forward was: x = W[t] + s A[t] B^T.  Returns (dW or None, dA or None, dB or None)."""
    tokens, shape, lora = cache
    C = shape[1]
    dx2 = dx.reshape(-1, C)
    dW = None
    if need_dw:
        dW = np.zeros(shape, dtype=dx.dtype)
        scatter_add_rows(dW, tokens, dx2)
    dA = dB = None
    if lora is not None:
        At = lora.A[tokens.reshape(-1)]  # (N, r)
        dB = lora.s * (dx2.T @ At)  # (C, r)
        dA = np.zeros_like(lora.A)
        scatter_add_rows(dA, tokens, lora.s * (dx2 @ lora.B))
    return dW, dA, dB


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract (CuPy arrays): tokens (B, T) integer ids (host or device; kept as int32 on the device);
# wte (V, C) float32, or bf16 bits (uint16), or a lazy view with `take_rows(ids)` (the weight
# store: it returns the rows as a float32 device array); LoRA A (V, r), B (C, r) float32. x and
# every gradient are float32. The cache is EmbeddingCache(tokens int32 (B, T), (V, C), lora).
#
# get_rows_{f32,bf16}_v{4,1}: one block per token row (grid N, 128 threads striding over C), the
#   row copied (and widened from bf16) with 16-byte accesses when C allows (f32: C % 4; bf16: C % 8)
#   and every array is aligned. An id outside [0, V) writes a NaN row instead of reading out of
#   bounds (no host sync). Floor: N C (4 + 4 or 2) bytes.
# scatter_add_sorted_v{4,1}: dst[tok] += scale * sum of the rows of that token. The host sorts the
#   keys tok * N + position (unique, so any sort gives one order), then one block per sorted
#   position (grid N, 128 threads over the D columns): the first position of each token owns it,
#   adds its run of rows in position order into registers and writes dst[tok] once; the others
#   return at once. No atomics, so the same sums on every run; a token repeated k times costs its
#   owner block k row reads in sequence. Floor: N D 4 bytes read + (distinct tokens) D 8 bytes.


SOURCE = KernelSource.from_file(
    "embedding.cu",
    kernels=(
        "get_rows_f32_v4",
        "get_rows_f32_v1",
        "get_rows_bf16_v8",
        "get_rows_bf16_v1",
        "scatter_add_sorted_v4",
        "scatter_add_sorted_v1",
    ),
)
SOURCES = (SOURCE,)

THREADS = 128


def device_ids(rt: Runtime, ids: Any) -> Any:
    """Integer ids (host or device, any shape) as a contiguous int32 device array of the same shape."""
    xp = rt.xp
    a = xp.asarray(ids)
    if a.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, got {a.dtype} of shape {tuple(a.shape)}")
    return xp.ascontiguousarray(a, dtype=xp.int32)


def get_rows_on(rt: Runtime, w: Any, ids: Any) -> Any:
    """float32 rows w[ids] (shape (*ids.shape, C)) of a (V, C) float32 or bf16 (uint16) device matrix."""
    xp = rt.xp
    w = xp.asarray(w)
    if w.ndim != 2 or w.dtype.name not in ("float32", "uint16"):
        raise ValueError(f"get_rows takes a (V, C) float32 or bf16 (uint16) matrix, got {w.dtype} {w.shape}")
    w = xp.ascontiguousarray(w)
    ids = device_ids(rt, ids)
    V, C = w.shape
    out = xp.empty((*ids.shape, C), dtype=xp.float32)
    if w.dtype.name == "float32":
        name = "get_rows_f32_v4" if C % 4 == 0 and aligned16(rt, w, out) else "get_rows_f32_v1"
    else:
        name = "get_rows_bf16_v8" if C % 8 == 0 and aligned16(rt, w, out) else "get_rows_bf16_v1"
    if ids.size and C:
        rt.launch(SOURCE, name, (ids.size,), (THREADS,), (w, ids, out, np.int32(V), np.int32(C)))
    return out


def scatter_add_rows_on(rt: Runtime, dst: Any, ids: Any, rows: Any, scale: float = 1.0) -> None:
    """dst[ids[i]] += scale * rows[i] for repeated ids, deterministically (see the kernel's comment).

    dst (V, D) float32 C-contiguous device array, updated in place; ids (N,) integers in [0, V)
    (host or device; ids outside that range are the caller's bug and are not checked on the device);
    rows (N, D) float32.
    """
    xp = rt.xp
    ids = device_ids(rt, ids).reshape(-1)
    n = ids.size
    D = dst.shape[1]
    rows = f32_input(rt, rows, "scatter-add rows").reshape(n, D)
    if n == 0 or D == 0:
        return
    keys = xp.sort(ids.astype(xp.int64) * n + xp.arange(n, dtype=xp.int64))  # unique keys
    tok = xp.ascontiguousarray((keys // n).astype(xp.int32))
    order = xp.ascontiguousarray((keys % n).astype(xp.int32))
    name = "scatter_add_sorted_v4" if D % 4 == 0 and aligned16(rt, dst, rows) else "scatter_add_sorted_v1"
    args = (dst, tok, order, rows, np.int32(n), np.int32(D), np.float32(scale))
    rt.launch(SOURCE, name, (n,), (THREADS,), args)


def embedding_forward_on(rt: Runtime, wte: Any, tokens: Any, lora: LoraTerm | None = None):
    """`embedding_forward` on a runtime."""
    ids = device_ids(rt, tokens)
    take = getattr(wte, "take_rows", None)
    if take is not None:
        x = f32_input(rt, take(ids), "embedding rows")
    else:
        x = get_rows_on(rt, wte, ids)  # (B, T, C)
    V, C = wte.shape
    if lora is not None:
        lora = LoraTerm(f32_input(rt, lora.A, "LoRA A"), f32_input(rt, lora.B, "LoRA B"), float(lora.s))
        At = get_rows_on(rt, lora.A, ids).reshape(-1, lora.A.shape[1])  # (N, r)
        rt.gemm(At, lora.B, x.reshape(-1, C), trans_b=True, alpha=lora.s, beta=1.0)  # x += s A[t] B^T
    return x, EmbeddingCache(ids, (int(V), int(C)), lora)


def embedding_backward_on(rt: Runtime, dx: Any, cache: EmbeddingCache, need_dw: bool = False):
    """`embedding_backward` on a runtime."""
    xp = rt.xp
    ids, shape, lora = cache
    V, C = shape
    dx2 = f32_input(rt, dx, "embedding gradient dx").reshape(-1, C)
    flat = ids.reshape(-1)
    dW = None
    if need_dw:
        dW = xp.zeros(shape, dtype=xp.float32)
        scatter_add_rows_on(rt, dW, flat, dx2)
    dA = dB = None
    if lora is not None:
        r = lora.A.shape[1]
        At = get_rows_on(rt, lora.A, flat)  # (N, r)
        dB = xp.empty((C, r), dtype=xp.float32)
        rt.gemm(dx2, At, dB, trans_a=True, alpha=lora.s)  # s dx^T A[t]
        dxB = xp.empty((flat.size, r), dtype=xp.float32)
        rt.gemm(dx2, lora.B, dxB)  # (N, r)
        dA = xp.zeros(lora.A.shape, dtype=xp.float32)
        scatter_add_rows_on(rt, dA, flat, dxB, scale=lora.s)
    return dW, dA, dB


def embedding_forward(wte: Any, tokens: Any, lora: LoraTerm | None = None):
    """CUDA twin of `embedding_forward_ref`: x = wte[tokens] (+ s A[tokens] B^T), float32 (B, T, C).

    wte: a (V, C) float32 or bf16 (uint16) CuPy array, or a lazy view with `take_rows`.
    """
    lazy = getattr(wte, "take_rows", None) is not None
    rt = cuda_runtime() if lazy else runtime_for(wte, "embedding_forward")
    return embedding_forward_on(rt, wte, tokens, lora)


def embedding_backward(dx: Any, cache: EmbeddingCache, need_dw: bool = False):
    """CUDA twin of `embedding_backward_ref`: (dW or None, dA or None, dB or None)."""
    return embedding_backward_on(runtime_for(dx, "embedding_backward"), dx, cache, need_dw)
