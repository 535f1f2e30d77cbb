"""Final logit soft-capping (Gemma): z' = cap * tanh(z / cap), alone and fused with the output head
and the masked, weighted cross-entropy (+ KL to a reference model) that training needs.

`softcap_forward_ref` / `softcap_backward_ref` and `softcap_head_loss_ref` are the NumPy reference
(the specification). No CUDA twins yet: on a GPU backend the dispatcher (engine.model.ops) says so.
`softcap_head_loss_ref` computes the logits of a block of label rows over the whole vocabulary at a
time (the output weight read in its row blocks), as engine.kernels.cross_entropy does for a head
held in memory; it does not stream the vocabulary. Not here: the final norm, choosing the output
tensor (engine.model.forward).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .cross_entropy import head_backward
from .embedding import row_chunks
from .linear import LoraTerm


class SoftcapCache(NamedTuple):
    t: np.ndarray  # tanh(z / cap)
    cap: float


def softcap_forward_ref(z: np.ndarray, cap: float):
    """z' = cap * tanh(z / cap)."""
    t = np.tanh(z / cap)
    return cap * t, SoftcapCache(t, cap)


def softcap_backward_ref(dy: np.ndarray, cache: SoftcapCache) -> np.ndarray:
    """forward was: z' = cap * tanh(z / cap); dz = dz' (1 - tanh^2)."""
    return dy * (1.0 - cache.t * cache.t)


def _head_logits(hc, w, lora, tied_lora):
    """Raw logits (n, V) of rows hc with the output LoRA terms, and the LoRA intermediates."""
    z = np.empty((hc.shape[0], w.shape[0]), hc.dtype)
    for lo, hi, wc in row_chunks(w):
        z[:, lo:hi] = hc @ wc.T
    ha = hb = None
    if lora is not None:
        ha = hc @ lora.A.T  # (n, r)
        z += (lora.s * ha) @ lora.B.T
    if tied_lora is not None:
        hb = hc @ tied_lora.B  # (n, r)
        z += (tied_lora.s * hb) @ tied_lora.A.T
    return z, ha, hb


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def softcap_head_loss_ref(
    h: np.ndarray,
    w,
    targets: np.ndarray,
    weights: np.ndarray,
    *,
    cap: float,
    lora: LoraTerm | None = None,
    tied_lora: LoraTerm | None = None,
    need_dw: bool = False,
    max_logits_bytes: int = 16 << 20,
    min_rows: int = 128,
    h_ref: np.ndarray | None = None,
    w_ref=None,
    kl_coef: float = 0.0,
    backward: bool = True,
):
    """engine.kernels.cross_entropy.lm_head_loss_ref with the logits soft-capped before the softmax.

    forward: z = cap tanh((h W^T + LoRA terms) / cap); loss = sum_t weights_t (-log softmax(z_t)[targets_t])
    (+ kl_coef sum_t |w_t| KL(p_t || q_t), q from the reference's capped logits). Same arguments and
    results: (loss, (ce_sum, label tokens), dh, {"W", "lora", "tied_lora"}).
    """
    N, C = h.shape
    V = w.shape[0]
    kl = bool(kl_coef) and h_ref is not None
    rows_all = np.flatnonzero(targets >= 0)
    chunk = max(1, min_rows, int(max_logits_bytes // (V * h.itemsize)))
    dh = np.zeros_like(h)
    dW = np.zeros(w.shape, h.dtype) if need_dw else None
    dl = (np.zeros_like(lora.A), np.zeros_like(lora.B)) if lora is not None else None
    dt = (np.zeros_like(tied_lora.A), np.zeros_like(tied_lora.B)) if tied_lora is not None else None
    loss = ce_sum = 0.0
    for start in range(0, rows_all.size, chunk):
        rows = rows_all[start : start + chunk]
        n = rows.size
        hc = h[rows]  # (n, C)
        raw, ha, hb = _head_logits(hc, w, lora, tied_lora)
        z, c_cap = softcap_forward_ref(raw, cap)
        del raw
        logp = _log_softmax(z)
        del z
        tgt = targets[rows]
        wt = weights[rows].astype(h.dtype)
        ce = -logp[np.arange(n), tgt]
        loss += float((wt * ce).sum())
        ce_sum += float(ce.sum())
        p = np.exp(logp)
        if kl:
            zr, _ = softcap_forward_ref(_head_logits(h_ref[rows], w_ref, None, None)[0], cap)
            logq = _log_softmax(zr)
            klv = (p * (logp - logq)).sum(axis=-1)  # (n,)
            aw = np.abs(wt)
            loss += kl_coef * float((aw * klv).sum())
        if not backward:
            continue
        dz = p * wt[:, None]
        dz[np.arange(n), tgt] -= wt
        if kl:
            # d KL(p||q) / dz = p * (log p - log q - KL)
            dz += (kl_coef * aw)[:, None] * p * (logp - logq - klv[:, None])
        dz = softcap_backward_ref(dz, c_cap)  # through the cap to the raw logits
        dh[rows] = head_backward(dz, hc, w, lora, tied_lora, ha, hb, dW, dl, dt)
    return loss, (ce_sum, int(rows_all.size)), dh, {"W": dW, "lora": dl, "tied_lora": dt}
