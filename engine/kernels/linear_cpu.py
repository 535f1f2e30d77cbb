"""The CPU twin of a group of linear maps of one input (q, k, v; gate and up):
`linear_group_forward_cpu` / `linear_group_backward_cpu`, the arguments, results and caches of
`engine.kernels.linear.linear_group_forward_ref` / `linear_group_backward_ref`, with fewer, larger
products (as the fused GPU step, engine.train.dense_step, does on its own buffers):

- forward: y_all = x [W_1; W_2; ...]^T, one GEMM; every member's x A_i^T in one GEMM of the stacked
  A factors; each member's output is a column block of y_all (a view: no copy);
- backward: dx = [dY_1 | dY_2 | ...] [W_1; W_2; ...] + [s dY_1 B_1 | ...] [A_1; A_2; ...], two GEMMs;
  the members' dA in one GEMM ([s dY B]^T x, cut into row blocks); dW (tensors trained in full) in
  one GEMM where every member needs it.

The stacked weights cost nothing when the members are consecutive row blocks of one array (the
weight store's `rows_of`, engine.io.weights, dequantizes them so); otherwise they are copied (tensors
trained in full: their copies are separate arrays). Likewise the output gradients when they are
consecutive column blocks of one array (the gated activation's CPU twin writes dg and du so).
Measured on the Qwen2.5-0.5B shape (bench/CPU_NOTES.md). float32 NumPy arrays only; anything else
runs the reference. The parity test is tests/kernels/test_cpu_twins.py.
"""

from __future__ import annotations

import numpy as np

from .linear import LinearCache, linear_group_backward_ref, linear_group_forward_ref


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def joined_rows(parts) -> np.ndarray | None:
    """The (sum n_i, n) array whose consecutive row blocks `parts` ((n_i, n) each) are, or None."""
    root = _root(parts[0])
    n_rows = sum(p.shape[0] for p in parts)
    if not root.flags.c_contiguous or root.dtype != parts[0].dtype or root.size != n_rows * parts[0].shape[1]:
        return None
    whole = root.reshape(n_rows, parts[0].shape[1])
    lo = 0
    for p in parts:
        block = whole[lo : lo + p.shape[0]]
        if p.shape != block.shape or p.strides != block.strides or _address(p) != _address(block):
            return None
        lo += p.shape[0]
    return whole


def joined_columns(parts) -> np.ndarray | None:
    """The (N, sum w_i) array whose consecutive column blocks `parts` ((..., w_i) each, N rows in all)
    are, or None."""
    root = _root(parts[0])
    width = sum(p.shape[-1] for p in parts)
    if not root.flags.c_contiguous or root.dtype != parts[0].dtype or root.size % width:
        return None
    whole = root.reshape(-1, width)
    lo = 0
    for p in parts:
        block = whole[:, lo : lo + p.shape[-1]]
        flat = p.reshape(-1, p.shape[-1])  # a view of a column block (else a copy: another address)
        if flat.shape != block.shape or flat.strides != block.strides or _address(flat) != _address(block):
            return None
        lo += p.shape[-1]
    return whole


def _f32(*arrays) -> bool:
    return all(a is None or (type(a) is np.ndarray and a.dtype == np.float32) for a in arrays)


def _fits(x, ws, bs, loras) -> bool:
    n_in = x.shape[-1]
    return (
        _f32(x, *ws, *bs)
        and all(lo is None or _f32(lo.A, lo.B) for lo in loras)
        and all(w.ndim == 2 and w.shape[1] == n_in for w in ws)
    )


def linear_group_forward_cpu(x: np.ndarray, ws, bs, loras):
    """CPU twin of `linear_group_forward_ref` (same arguments, results and caches)."""
    if not _fits(x, ws, bs, loras):
        return linear_group_forward_ref(x, ws, bs, loras)
    n_in = x.shape[-1]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, n_in)
    W = joined_rows(ws)
    if W is None:
        W = np.concatenate(ws)
    y = x2 @ W.T  # (N, n_total)
    ranks = [0 if lo is None else lo.A.shape[0] for lo in loras]
    xa = None
    if any(ranks):
        A = np.concatenate([lo.A for lo in loras if lo is not None])  # (sum r, n_in)
        xa = x2 @ A.T  # (N, sum r)
    ys, caches = [], []
    col = r0 = 0
    for w, b, lora, r in zip(ws, bs, loras, ranks, strict=True):
        yi = y[:, col : col + w.shape[0]]
        col += w.shape[0]
        if b is not None:
            yi += b
        xai = None
        if lora is not None:
            xai = xa[:, r0 : r0 + r]
            r0 += r
            yi += (lora.s * xai) @ lora.B.T
            xai = xai.reshape(*lead, r)
        ys.append(yi.reshape(*lead, w.shape[0]))
        caches.append(LinearCache(x, b is not None, lora, xai))
    return tuple(ys), tuple(caches)


def linear_group_backward_cpu(dys, caches, ws, need_dw):
    """CPU twin of `linear_group_backward_ref` (same arguments and results)."""
    x = caches[0].x
    same_x = all(c.x is x for c in caches)
    loras = [c.lora for c in caches]
    if not (same_x and _fits(x, ws, [None] * len(ws), loras) and _f32(*dys)):
        return linear_group_backward_ref(dys, caches, ws, need_dw)
    n_in = x.shape[-1]
    x2 = x.reshape(-1, n_in)
    N = x2.shape[0]
    W = joined_rows(ws)
    if W is None:
        W = np.concatenate(ws)
    dY = joined_columns(dys)
    if dY is None:
        dY = np.concatenate([d.reshape(N, -1) for d in dys], axis=1)
    dx = dY @ W  # (N, n_in)
    grads = []
    col = 0
    dyb_parts = []
    for w, cache in zip(ws, caches, strict=True):
        dyi = dY[:, col : col + w.shape[0]]
        col += w.shape[0]
        db = dyi.sum(axis=0) if cache.has_bias else None
        dB = None
        if cache.lora is not None:
            lora = cache.lora
            r = lora.A.shape[0]
            dyb_parts.append(lora.s * (dyi @ lora.B))  # (N, r), scaled once for dx and dA
            dB = lora.s * (dyi.T @ cache.xa.reshape(N, r))
        grads.append([None, db, None, dB])
    if all(need_dw):
        dW = dY.T @ x2  # (n_total, n_in): the members' row blocks
        lo = 0
        for k, w in enumerate(ws):
            grads[k][0] = dW[lo : lo + w.shape[0]]
            lo += w.shape[0]
    else:
        lo = 0
        for k, (w, need) in enumerate(zip(ws, need_dw, strict=True)):
            if need:
                grads[k][0] = dY[:, lo : lo + w.shape[0]].T @ x2
            lo += w.shape[0]
    if dyb_parts:
        dYB = np.concatenate(dyb_parts, axis=1)  # (N, sum r)
        A = np.concatenate([lo.A for lo in loras if lo is not None])
        dx += dYB @ A
        dA = dYB.T @ x2  # (sum r, n_in)
        r0 = 0
        for g, lora in zip(grads, loras, strict=True):
            if lora is not None:
                g[2] = dA[r0 : r0 + lora.A.shape[0]]
                r0 += lora.A.shape[0]
    return dx.reshape(*dys[0].shape[:-1], n_in), tuple(tuple(g) for g in grads)
