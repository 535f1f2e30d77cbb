"""The output projection fused with masked, weighted cross-entropy (+ KL to a reference model), never
storing the logits of every row, and the projection alone for inference.

NumPy reference (the specification).
"""

from __future__ import annotations

import numpy as np

from .embedding import row_chunks
from .linear import LoraTerm


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def project(h: np.ndarray, w) -> np.ndarray:
    """Logits h W^T for h (..., C) and an output weight (V, C) given as an array or in row blocks."""
    V = w.shape[0]
    out = np.empty((*h.shape[:-1], V), dtype=h.dtype)
    for lo, hi, wc in row_chunks(w):
        out[..., lo:hi] = h @ wc.T
    return out


def _log_softmax_rows(z: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in place."""
    z -= z.max(axis=-1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return z


def _softmax_inplace_pair(z: np.ndarray) -> np.ndarray:
    """Turn logits z (n, V) into log-probabilities in place; return the probabilities (one new array)."""
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    s = p.sum(axis=-1, keepdims=True)
    z -= np.log(s)
    p /= s
    return p


def _is_one_block(w) -> bool:
    """Whether the output weight is in memory as one array (else it is read in row blocks)."""
    if isinstance(w, np.ndarray):
        return True
    fits = getattr(w, "fits_in_memory", None)
    return bool(fits()) if fits is not None else False


def lm_head_loss_ref(
    h: np.ndarray,
    w,
    targets: np.ndarray,
    weights: np.ndarray,
    *,
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
    """Output projection fused with cross-entropy; full logits of all rows are never stored.

    forward: z = h W^T (+ s (h A^T) B^T; + s (h B) A^T for a tied token_embd adapter);
    loss = sum_t weights_t * (-log softmax(z_t)[targets_t])  (+ kl_coef * sum_t |w_t| KL(p_t || q_t)).
    Only rows with targets >= 0 are computed. For the KL term, q = softmax(h_ref W_ref^T) is the
    reference model's distribution (its own hidden states and output weight, without adapters).
    W (V, C) is an array or a lazy view: when it is in memory as one array, logits are computed
    for blocks of label rows (`max_logits_bytes` of logits, but at least `min_rows` rows: fewer
    rows per matmul read the whole head once per block and run at half speed, measured on a
    152k vocabulary); when it is read in blocks of
    vocabulary rows (`row_chunks`, a large quantized head), the loss streams over the vocabulary
    twice (online log-sum-exp, then the gradients), so the head is never dequantized whole.
    With backward=False only the loss is computed. Returns (loss, stats, dh, grads) where grads
    holds "W" (when need_dw), "lora" (dA, dB) and "tied_lora" (dA, dB); stats = (sum of ce,
    label tokens).
    """
    if not _is_one_block(w) and not need_dw:
        return _lm_head_loss_streamed_ref(
            h, w, targets, weights, lora, tied_lora, max_logits_bytes, h_ref, w_ref, kl_coef, backward
        )
    N, C = h.shape
    V = w.shape[0]
    kl = bool(kl_coef) and h_ref is not None
    rows_all = np.flatnonzero(targets >= 0)
    chunk = max(1, min_rows, int(max_logits_bytes // (V * h.itemsize)))
    dh = np.zeros_like(h)
    dW = np.zeros(w.shape, h.dtype) if need_dw else None
    dl = (np.zeros_like(lora.A), np.zeros_like(lora.B)) if lora is not None else None
    dt = (np.zeros_like(tied_lora.A), np.zeros_like(tied_lora.B)) if tied_lora is not None else None
    loss = 0.0
    ce_sum = 0.0
    for start in range(0, rows_all.size, chunk):
        rows = rows_all[start : start + chunk]
        n = rows.size
        hc = h[rows]  # (n, C)
        logp = project(hc, w)  # (n, V) logits, then log-probabilities in place
        ha = hb = None
        if lora is not None:
            ha = hc @ lora.A.T  # (n, r)
            logp += (lora.s * ha) @ lora.B.T
        if tied_lora is not None:
            hb = hc @ tied_lora.B  # (n, r)
            logp += (tied_lora.s * hb) @ tied_lora.A.T
        p = _softmax_inplace_pair(logp)  # logp becomes log-probabilities, p the probabilities
        tgt = targets[rows]
        wt = weights[rows].astype(h.dtype)
        ce = -logp[np.arange(n), tgt]
        loss += float((wt * ce).sum())
        ce_sum += float(ce.sum())
        if kl:
            logq = _log_softmax_rows(project(h_ref[rows], w_ref))
            klv = (p * (logp - logq)).sum(axis=-1)  # (n,)
            aw = np.abs(wt)
            loss += kl_coef * float((aw * klv).sum())
        if not backward:
            continue
        dz = p
        if kl:
            # d KL(p||q) / dz = p * (log p - log q - KL)
            logp -= logq
            logp -= klv[:, None]
            logp *= p
            logp *= (kl_coef * aw)[:, None]
        dz *= wt[:, None]
        dz[np.arange(n), tgt] -= wt
        if kl:
            dz += logp
        dhc = np.zeros((n, C), h.dtype)
        for lo, hi, wc in row_chunks(w):
            dhc += dz[:, lo:hi] @ wc
            if need_dw:
                dW[lo:hi] += dz[:, lo:hi].T @ hc
        if lora is not None:
            dzB = dz @ lora.B  # (n, r)
            dhc += lora.s * (dzB @ lora.A)
            dl[0][...] += lora.s * (dzB.T @ hc)
            dl[1][...] += lora.s * (dz.T @ ha)
        if tied_lora is not None:
            dzA = dz @ tied_lora.A  # (n, r)
            dhc += tied_lora.s * (dzA @ tied_lora.B.T)
            dt[0][...] += tied_lora.s * (dz.T @ hb)  # dA (V, r)
            dt[1][...] += tied_lora.s * (hc.T @ dzA)  # dB (C, r)
        dh[rows] = dhc
    grads = {"W": dW, "lora": dl, "tied_lora": dt}
    return loss, (ce_sum, int(rows_all.size)), dh, grads


def _lm_head_loss_streamed_ref(h, w, targets, weights, lora, tied_lora, max_logits_bytes, h_ref, w_ref,
                           kl_coef, backward):  # fmt: skip
    """`lm_head_loss` for an output weight read in blocks of vocabulary rows (see there).

    Pass 1 walks the vocabulary once: per label row the running maximum m and sum
    s = sum_v exp(z_v - m) (online log-sum-exp), the target's logit, and for the KL term the same
    for the reference logits plus E_p[z] and E_p[z_ref] (rescaled like s), which give
    KL(p||q) = E_p[z] - lse(z) - E_p[z_ref] + lse(z_ref). Pass 2 walks it again to form each
    block's dz = w_t (p - onehot) + kl_coef |w_t| p (log p - log q - KL) and push it back.
    """
    N, C = h.shape
    dtype = h.dtype
    kl = bool(kl_coef) and h_ref is not None
    rows = np.flatnonzero(targets >= 0)
    n = rows.size
    hc = h[rows]  # (n, C)
    tgt = targets[rows]
    wt = weights[rows].astype(dtype)
    ha = hc @ lora.A.T if lora is not None else None  # (n, r)
    hb = hc @ tied_lora.B if tied_lora is not None else None  # (n, r)
    hr = h_ref[rows] if kl else None

    def block_logits(lo, hi, wc):
        z = hc @ wc.T  # (n, hi - lo)
        if lora is not None:
            z += lora.s * (ha @ lora.B[lo:hi].T)
        if tied_lora is not None:
            z += tied_lora.s * (hb @ tied_lora.A[lo:hi].T)
        return z

    # a streamed head is a frozen base tensor, so the reference model's head is the same tensor
    assert not kl or getattr(w_ref, "name", None) == getattr(w, "name", ""), "reference head differs"
    # pass 1: log-sum-exp of the policy (and reference) logits, target logits, KL moments
    m = np.full(n, -np.inf, dtype)
    s = np.zeros(n, dtype)
    z_t = np.zeros(n, dtype)
    if kl:
        mr = np.full(n, -np.inf, dtype)
        sr = np.zeros(n, dtype)
        ez = np.zeros(n, dtype)  # sum exp(z - m) z
        ezr = np.zeros(n, dtype)  # sum exp(z - m) z_ref
    for lo, hi, wc in row_chunks(w):
        z = block_logits(lo, hi, wc)
        inside = (tgt >= lo) & (tgt < hi)
        z_t[inside] = z[inside, tgt[inside] - lo]
        m_new = np.maximum(m, z.max(axis=1))
        rescale = np.exp(m - m_new)
        e = np.exp(z - m_new[:, None])
        s = s * rescale + e.sum(axis=1)
        if kl:
            zr = hr @ wc.T
            ez = ez * rescale + (e * z).sum(axis=1)
            ezr = ezr * rescale + (e * zr).sum(axis=1)
            mr_new = np.maximum(mr, zr.max(axis=1))
            sr = sr * np.exp(mr - mr_new) + np.exp(zr - mr_new[:, None]).sum(axis=1)
            mr = mr_new
        m = m_new
    lse = m + np.log(s)
    ce = lse - z_t
    loss = float((wt * ce).sum())
    ce_sum = float(ce.sum())
    if kl:
        lse_r = mr + np.log(sr)
        klv = ez / s - lse - ezr / s + lse_r  # (n,)
        aw = np.abs(wt)
        loss += kl_coef * float((aw * klv).sum())
    dh = np.zeros_like(h)
    dl = (np.zeros_like(lora.A), np.zeros_like(lora.B)) if lora is not None else None
    dt = (np.zeros_like(tied_lora.A), np.zeros_like(tied_lora.B)) if tied_lora is not None else None
    if backward and n:
        # pass 2: dz block by block, pushed back into dh and the LoRA factors
        dhc = np.zeros((n, C), dtype)
        dzB = np.zeros((n, lora.B.shape[1]), dtype) if lora is not None else None
        dzA = np.zeros((n, tied_lora.A.shape[1]), dtype) if tied_lora is not None else None
        for lo, hi, wc in row_chunks(w):
            logp = block_logits(lo, hi, wc)
            logp -= lse[:, None]
            p = np.exp(logp)
            dz = p * wt[:, None]
            inside = np.flatnonzero((tgt >= lo) & (tgt < hi))
            dz[inside, tgt[inside] - lo] -= wt[inside]
            if kl:
                logq = hr @ wc.T
                logq -= lse_r[:, None]
                # d KL(p||q) / dz = p * (log p - log q - KL)
                dz += (kl_coef * aw)[:, None] * p * (logp - logq - klv[:, None])
            dhc += dz @ wc
            if lora is not None:
                dzB += dz @ lora.B[lo:hi]
                dl[1][lo:hi] += lora.s * (dz.T @ ha)
            if tied_lora is not None:
                dzA += dz @ tied_lora.A[lo:hi]
                dt[0][lo:hi] += tied_lora.s * (dz.T @ hb)
        if lora is not None:
            dhc += lora.s * (dzB @ lora.A)
            dl[0][...] += lora.s * (dzB.T @ hc)
        if tied_lora is not None:
            dhc += tied_lora.s * (dzA @ tied_lora.B.T)
            dt[1][...] += tied_lora.s * (hc.T @ dzA)
        dh[rows] = dhc
    grads = {"W": None, "lora": dl, "tied_lora": dt}
    return loss, (ce_sum, int(n)), dh, grads
