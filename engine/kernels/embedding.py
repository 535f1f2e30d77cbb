"""Token embedding (get_rows) with llama.cpp's token_embd LoRA layout, and the row-access helpers that
let a lazy weight (the weight store's views) be read a block of rows at a time.

NumPy reference (the specification).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .linear import LoraTerm


def take_rows(w, idx: np.ndarray) -> np.ndarray:
    """w[idx] for an array, or only those rows dequantized for a lazy view (get_rows)."""
    take = getattr(w, "take_rows", None)
    return take(idx) if take is not None else w[idx]


def row_chunks(w):
    """(lo, hi, rows lo..hi) blocks covering a (V, C) weight: one block for an array."""
    chunks = getattr(w, "row_chunks", None)
    return chunks() if chunks is not None else ((0, w.shape[0], w),)


class EmbeddingCache(NamedTuple):
    tokens: np.ndarray  # (B, T) ids
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
