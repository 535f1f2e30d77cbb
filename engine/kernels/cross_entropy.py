"""The output projection fused with masked, weighted cross-entropy (+ KL to a reference model), never
storing the logits of every row, and the projection alone for inference; with `cap`, the logits
soft-capped first (Gemma's final_logit_softcapping: z' = cap tanh(z / cap)), and the soft-cap alone
(`softcap_forward` / `softcap_backward`) for inference logits.

`lm_head_loss_ref` (with `_lm_head_loss_streamed_ref`), `project_ref` and `softcap_forward_ref` /
`softcap_backward_ref` are the NumPy reference (the specification).
`lm_head_loss` is the CUDA twin: it streams the vocabulary in chunks as the streamed reference
does (online log-sum-exp in a first pass, the gradients in a second), with the chunk's logits from
cuBLAS and the softmax statistics and gradients from row kernels, and returns the loss as device
scalars. Not here: the model's final norm, or choosing the output tensor (engine.model.forward).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .embedding import row_chunks
from .linear import LoraTerm, to_bf16, weight_operand
from .nvrtc import KernelSource
from .runtime import Runtime, aligned16, array_module, f32_input, runtime_for

# A head in memory as one array is multiplied by blocks of label rows: LOGITS_BYTES of logits, but at
# least MIN_ROWS rows. Fewer rows per product read the whole head once per block and run slower:
# on a 50k vocabulary (C 1024, 2-core AMD EPYC, OpenBLAS SkylakeX) 64 rows ran at 227-238 GFLOP/s,
# 128 at 300-312, 256 at 363-364 (bench/CPU_NOTES.md); the block of 256 rows of a 152k vocabulary
# is 155 MB.
LOGITS_BYTES = 16 << 20
MIN_ROWS = 256


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def project_ref(h: np.ndarray, w) -> np.ndarray:
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


class SoftcapCache(NamedTuple):
    t: np.ndarray | None  # tanh(z / cap) (None from the CUDA twin, whose backward recomputes it from z)
    cap: float
    z: Any = None  # the CUDA twin's: the input z


def softcap_forward_ref(z: np.ndarray, cap: float):
    """z' = cap * tanh(z / cap)."""
    t = np.tanh(z / cap)
    return cap * t, SoftcapCache(t, cap)


def softcap_backward_ref(dy: np.ndarray, cache: SoftcapCache) -> np.ndarray:
    """forward was: z' = cap * tanh(z / cap); dz = dz' (1 - tanh^2)."""
    return dy * (1.0 - cache.t * cache.t)


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
    max_logits_bytes: int = LOGITS_BYTES,
    min_rows: int = MIN_ROWS,
    h_ref: np.ndarray | None = None,
    w_ref=None,
    kl_coef: float = 0.0,
    backward: bool = True,
    cap: float = 0.0,
):
    """Output projection fused with cross-entropy; full logits of all rows are never stored.

    forward: z = h W^T (+ s (h A^T) B^T; + s (h B) A^T for a tied token_embd adapter);
    with `cap` (> 0) z = cap tanh(z / cap) (Gemma 3's final soft-cap, the reference's logits too);
    loss = sum_t weights_t * (-log softmax(z_t)[targets_t])  (+ kl_coef * sum_t |w_t| KL(p_t || q_t)).
    Only rows with targets >= 0 are computed. For the KL term, q = softmax(h_ref W_ref^T) is the
    reference model's distribution (its own hidden states and output weight, without adapters).
    W (V, C) is an array or a lazy view: when it is in memory as one array, logits are computed
    for blocks of label rows (`max_logits_bytes` of logits, but at least `min_rows` rows: see
    MIN_ROWS); when it is read in blocks of
    vocabulary rows (`row_chunks`, a large quantized head), the loss streams over the vocabulary
    twice (online log-sum-exp, then the gradients), so the head is never dequantized whole.
    With backward=False only the loss is computed. Returns (loss, stats, dh, grads) where grads
    holds "W" (when need_dw), "lora" (dA, dB) and "tied_lora" (dA, dB); stats = (sum of ce,
    label tokens).
    """
    if not _is_one_block(w) and not need_dw:
        return _lm_head_loss_streamed_ref(
            h, w, targets, weights, lora, tied_lora, max_logits_bytes, h_ref, w_ref, kl_coef, backward, cap
        )
    return lm_head_loss_blocks(h, w, targets, weights, lora, tied_lora, need_dw, max_logits_bytes, min_rows,
                               h_ref, w_ref, kl_coef, backward, cap)  # fmt: skip


def ce_rows_ref(z: np.ndarray, tgt: np.ndarray, wt: np.ndarray, backward: bool = True):
    """Cross-entropy of logit rows z (n, V) against targets tgt (n,), the step between the head's
    two products: returns (ce (n,), dz), dz = wt (softmax(z) - onehot(tgt)) the weighted loss's
    gradient (wt (n,) the rows' weights; None without `backward`). z is overwritten (here with the
    log-probabilities; the CPU twin, engine.kernels.cross_entropy_cpu.ce_rows_cpu, writes dz there)."""
    n = z.shape[0]
    p = _softmax_inplace_pair(z)  # z becomes log-probabilities, p the probabilities
    ce = -z[np.arange(n), tgt]
    if not backward:
        return ce, None
    p *= wt[:, None]
    p[np.arange(n), tgt] -= wt
    return ce, p


def lm_head_loss_blocks(h, w, targets, weights, lora, tied_lora, need_dw, max_logits_bytes, min_rows, h_ref,
                        w_ref, kl_coef, backward, cap, ce_rows=ce_rows_ref):  # fmt: skip
    """`lm_head_loss_ref` for an output weight in memory as one array (see there), blocks of label
    rows at a time. `ce_rows`: the softmax and cross-entropy of each block's logits where there is no
    KL term, `ce_rows_ref` or a twin of it."""
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
        logp = project_ref(hc, w)  # (n, V) logits, then log-probabilities in place
        ha = hb = None
        if lora is not None:
            ha = hc @ lora.A.T  # (n, r)
            logp += (lora.s * ha) @ lora.B.T
        if tied_lora is not None:
            hb = hc @ tied_lora.B  # (n, r)
            logp += (tied_lora.s * hb) @ tied_lora.A.T
        c_cap = None
        if cap:
            logp, c_cap = softcap_forward_ref(logp, cap)
        tgt = targets[rows]
        wt = weights[rows].astype(h.dtype)
        if not kl:
            ce, dz = ce_rows(logp, tgt, wt, backward)
            loss += float((wt * ce).sum())
            ce_sum += float(ce.sum())
            if backward:
                if c_cap is not None:
                    dz = softcap_backward_ref(dz, c_cap)  # through the cap to the raw logits
                dh[rows] = head_backward(dz, hc, w, lora, tied_lora, ha, hb, dW, dl, dt)
            continue
        # with the KL term to the reference model
        p = _softmax_inplace_pair(logp)  # logp becomes log-probabilities, p the probabilities
        ce = -logp[np.arange(n), tgt]
        loss += float((wt * ce).sum())
        ce_sum += float(ce.sum())
        zr = project_ref(h_ref[rows], w_ref)
        logq = _log_softmax_rows(softcap_forward_ref(zr, cap)[0] if cap else zr)
        klv = (p * (logp - logq)).sum(axis=-1)  # (n,)
        aw = np.abs(wt)
        loss += kl_coef * float((aw * klv).sum())
        if not backward:
            continue
        dz = p
        # d KL(p||q) / dz = p * (log p - log q - KL)
        logp -= logq
        logp -= klv[:, None]
        logp *= p
        logp *= (kl_coef * aw)[:, None]
        dz *= wt[:, None]
        dz[np.arange(n), tgt] -= wt
        dz += logp
        if c_cap is not None:
            dz = softcap_backward_ref(dz, c_cap)  # through the cap to the raw logits
        dh[rows] = head_backward(dz, hc, w, lora, tied_lora, ha, hb, dW, dl, dt)
    grads = {"W": dW, "lora": dl, "tied_lora": dt}
    return loss, (ce_sum, int(rows_all.size)), dh, grads


def head_backward(dz, hc, w, lora, tied_lora, ha, hb, dW, dl, dt) -> np.ndarray:
    """The logits' gradient dz (n, V) of one block of label rows hc (n, C) pushed back through the
    head z = hc W^T (+ s (hc A^T) B^T; + s (hc B) A^T for a tied token_embd adapter): returns dhc
    (n, C) and adds into dW (when not None) and the LoRA factor gradients dl, dt (ha = hc A^T and
    hb = hc B from the forward)."""
    dhc = np.zeros(hc.shape, hc.dtype)
    for lo, hi, wc in row_chunks(w):
        dhc += dz[:, lo:hi] @ wc
        if dW is not None:
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
    return dhc


def _lm_head_loss_streamed_ref(h, w, targets, weights, lora, tied_lora, max_logits_bytes, h_ref, w_ref,
                           kl_coef, backward, cap=0.0):  # fmt: skip
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
        """The block's (capped) logits, and the cap's cache (None without a cap)."""
        z = hc @ wc.T  # (n, hi - lo)
        if lora is not None:
            z += lora.s * (ha @ lora.B[lo:hi].T)
        if tied_lora is not None:
            z += tied_lora.s * (hb @ tied_lora.A[lo:hi].T)
        return softcap_forward_ref(z, cap) if cap else (z, None)

    def ref_logits(wc):
        zr = hr @ wc.T
        return softcap_forward_ref(zr, cap)[0] if cap else zr

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
        z, _ = block_logits(lo, hi, wc)
        inside = (tgt >= lo) & (tgt < hi)
        z_t[inside] = z[inside, tgt[inside] - lo]
        m_new = np.maximum(m, z.max(axis=1))
        rescale = np.exp(m - m_new)
        e = np.exp(z - m_new[:, None])
        s = s * rescale + e.sum(axis=1)
        if kl:
            zr = ref_logits(wc)
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
            logp, c_cap = block_logits(lo, hi, wc)
            logp -= lse[:, None]
            p = np.exp(logp)
            dz = p * wt[:, None]
            inside = np.flatnonzero((tgt >= lo) & (tgt < hi))
            dz[inside, tgt[inside] - lo] -= wt[inside]
            if kl:
                logq = ref_logits(wc)
                logq -= lse_r[:, None]
                # d KL(p||q) / dz = p * (log p - log q - KL)
                dz += (kl_coef * aw)[:, None] * p * (logp - logq - klv[:, None])
            if c_cap is not None:
                dz = softcap_backward_ref(dz, c_cap)  # through the cap to the raw logits
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


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract (CuPy arrays): h (N, C) float32; w (V, C) float32 or bf16 bits (uint16), or a lazy view
# with `row_chunks()` giving device blocks (the weight store); targets (N,) integers (< 0: no label)
# and weights (N,) floats, on the host (no device sync) or the device (one sync: the number of
# label rows sizes the buffers); LoRA factors float32; h_ref (N, C) float32 and w_ref (w itself, a
# view of the same tensor, or an array) for the KL term. Returns (loss, (ce_sum, n_tokens), dh,
# grads): loss and ce_sum are 0-d float64 device arrays, n_tokens an int, dh (N, C) float32, grads
# as the reference ("W" when need_dw, "lora" (dA, dB), "tied_lora" (dA, dB)).
#
# Per vocabulary chunk of Vc columns (Vc: max_logits_bytes of logits for the n label rows, a
# multiple of 64, at least 256: on a GPU the chunk is a GEMM's width, and narrower ones waste it):
# pass 1: z = hc W_c^T (+ LoRA terms) by cuBLAS (bf16 operands when W is bf16, hc rounded to bf16
#   once), then ce_stats: one block per label row (256 threads, 16-byte loads when the chunk's
#   width allows), each thread an online max / sum over its columns, merged by block reductions
#   into the row's running (m, s) (and, for KL, the reference logits' (m_r, s_r) and the
#   exp-weighted sums of z and z_ref), and the target's logit when it falls in the chunk.
# ce_finish: one block over the rows (fixed order, float64 sums): lse, ce, the KL value per row;
#   loss = sum w ce + kl_coef sum |w| KL, ce_sum. No host read.
# pass 2 (backward): z again, ce_grad turns it into dz = w (p - onehot) (+ kl_coef |w| p (log p -
#   log q - KL)) in place, one block per row; then cuBLAS: dh_c += dz W_c (bf16 when W is), the
#   LoRA factor gradients, and dW_c = dz^T hc when need_dw.
# Soft-cap (cap > 0): the row kernels cap each logit as they read it (ce_stats: cap tanh(z / cap) of
#   the policy's and the reference's logits; ce_grad: dz through the cap, times 1 - tanh^2), so the
#   chunk buffer holds the raw logits and nothing more is stored. softcap_fwd / softcap_bwd are the
#   cap alone (inference logits), elementwise; their cache keeps z and the backward recomputes tanh.
# Cost: FLOPs 2 n C V per GEMM pass (forward: 1, with KL 2; backward: 2 more, +1 with need_dw), at
# the bf16 tensor-core rate for a bf16 head; bytes: the head read once per pass (V C 2 for bf16)
# plus the chunk logits written and read twice (n Vc 4 each); the row kernels are memory-bound at
# 8 bytes per logit.


SOURCE = KernelSource.from_file(
    "cross_entropy.cu", kernels=("ce_stats", "ce_finish", "ce_grad", "softcap_fwd", "softcap_bwd")
)
SOURCES = (SOURCE,)

THREADS = 256
MIN_CHUNK = 256  # vocabulary columns per chunk at least (a GEMM narrower than this wastes the GPU)


def _vocab_blocks(rt: Runtime, w: Any, cols: int):
    """(lo, hi, block) over the vocabulary rows of w, each at most `cols` rows: slices of an array,
    or of the blocks of a lazy view's `row_chunks()`."""
    for lo0, hi0, blk in row_chunks(w):
        blk = weight_operand(rt, blk, "output weight")
        for lo in range(lo0, hi0, cols):
            hi = min(hi0, lo + cols)
            yield lo, hi, blk[lo - lo0 : hi - lo0]


def _label_rows(rt: Runtime, targets: Any, weights: Any) -> tuple[Any, Any, Any, int]:
    """(rows, targets, weights) of the label rows on the device (int64, int32, float32) and their count."""
    xp = rt.xp
    if array_module(targets) is np:
        t = np.asarray(targets).reshape(-1)
        rows = np.flatnonzero(t >= 0)
        wt = np.asarray(weights, dtype=np.float32).reshape(-1)[rows]
        return xp.asarray(rows), xp.asarray(t[rows].astype(np.int32)), xp.asarray(wt), int(rows.size)
    t = targets.reshape(-1)
    rows = xp.flatnonzero(t >= 0)  # one device sync: the count sizes every buffer below
    wt = xp.asarray(weights).reshape(-1)[rows].astype(xp.float32)
    return rows, xp.ascontiguousarray(t[rows].astype(xp.int32)), xp.ascontiguousarray(wt), int(rows.size)


def lm_head_loss_on(
    rt: Runtime,
    h: Any,
    w: Any,
    targets: Any,
    weights: Any,
    *,
    lora: LoraTerm | None = None,
    tied_lora: LoraTerm | None = None,
    need_dw: bool = False,
    max_logits_bytes: int = LOGITS_BYTES,
    min_rows: int = MIN_ROWS,
    h_ref: Any = None,
    w_ref: Any = None,
    kl_coef: float = 0.0,
    backward: bool = True,
    padded: bool = False,
    out: Any = None,
    cap: float = 0.0,
):
    """`lm_head_loss` on a runtime (`min_rows` is the reference's row blocking; the twin streams
    the vocabulary over all label rows at once and ignores it).

    padded: fixed shapes for a captured step: every row is computed, targets (N,) int32 and weights
    (N,) float32 on the device as they are, rows with a target < 0 (weight 0) add nothing to the
    loss, ce_sum or gradients; n_tokens is then N (the caller counts its label rows itself). No
    device read, no upload. out: a float64 (2,) device array to write (loss, ce_sum) into."""
    xp = rt.xp
    h = f32_input(rt, h, "hidden states h")
    N, C = h.shape
    V = int(w.shape[0])
    kl = bool(kl_coef) and h_ref is not None
    if padded:
        if kl or targets.dtype.name != "int32" or weights.dtype.name != "float32":
            raise ValueError("padded rows take int32 targets and float32 weights on the device, without KL")
        rows, tgt, wt, n = None, targets, weights, N
    else:
        rows, tgt, wt, n = _label_rows(rt, targets, weights)
    if lora is not None:
        lora = LoraTerm(f32_input(rt, lora.A, "LoRA A"), f32_input(rt, lora.B, "LoRA B"), float(lora.s))
    if tied_lora is not None:
        A_t = f32_input(rt, tied_lora.A, "tied LoRA A")
        tied_lora = LoraTerm(A_t, f32_input(rt, tied_lora.B, "tied LoRA B"), float(tied_lora.s))
    dh = xp.zeros((N, C), dtype=xp.float32) if not padded else None
    grads: dict[str, Any] = {"W": None, "lora": None, "tied_lora": None}
    if need_dw:
        grads["W"] = xp.zeros((V, C), dtype=xp.float32)
    if lora is not None:
        grads["lora"] = (xp.zeros(lora.A.shape, dtype=xp.float32), xp.zeros(lora.B.shape, dtype=xp.float32))
    if tied_lora is not None:
        shapes = (tied_lora.A.shape, tied_lora.B.shape)
        grads["tied_lora"] = tuple(xp.zeros(s, dtype=xp.float32) for s in shapes)
    if out is None:
        out = xp.zeros(2, dtype=xp.float64)
    if n == 0:
        return out[0], (out[1], 0), dh, grads

    hc = h if rows is None else xp.ascontiguousarray(h[rows])  # (n, C)
    hr = xp.ascontiguousarray(f32_input(rt, h_ref, "reference hidden states h_ref")[rows]) if kl else None
    ha = hb = None
    if lora is not None:
        ha = xp.empty((n, lora.A.shape[0]), dtype=xp.float32)
        rt.gemm(hc, lora.A, ha, trans_b=True)  # (n, r)
    if tied_lora is not None:
        hb = xp.empty((n, tied_lora.B.shape[1]), dtype=xp.float32)
        rt.gemm(hc, tied_lora.B, hb)  # (n, r)
    cols = max(MIN_CHUNK, int(max_logits_bytes // (4 * n)) // 64 * 64)
    buf = xp.empty(n * min(cols, V), dtype=xp.float32)
    buf_r = xp.empty(n * min(cols, V), dtype=xp.float32) if kl else None
    bf16_cache: dict[str, Any] = {}

    def operand(x, key, block):  # x rounded to bf16 once, for a bf16 head
        if block.dtype.name != "uint16":
            return x
        if key not in bf16_cache:
            bf16_cache[key] = to_bf16(rt, x)
        return bf16_cache[key]

    same_head = w_ref is w or (getattr(w_ref, "name", None) or 0) == getattr(w, "name", None)

    def ref_block(lo, hi, blk):
        if same_head:
            return blk
        if hasattr(w_ref, "dtype"):
            return weight_operand(rt, w_ref, "reference output weight")[lo:hi]
        raise ValueError("the KL reference head must be the output weight itself or an array")

    def logits(lo, hi, blk):
        width = hi - lo
        z = buf[: n * width].reshape(n, width)
        rt.gemm(operand(hc, "h", blk), blk, z, trans_b=True)
        if lora is not None:
            rt.gemm(ha, lora.B[lo:hi], z, trans_b=True, alpha=lora.s, beta=1.0)
        if tied_lora is not None:
            rt.gemm(hb, tied_lora.A[lo:hi], z, trans_b=True, alpha=tied_lora.s, beta=1.0)
        zr = None
        if kl:
            rblk = ref_block(lo, hi, blk)
            zr = buf_r[: n * width].reshape(n, width)
            rt.gemm(operand(hr, "h_ref", rblk), rblk, zr, trans_b=True)
        return z, zr

    f32 = xp.float32
    m = xp.full(n, -np.inf, dtype=f32)
    s = xp.zeros(n, dtype=f32)
    zt = xp.zeros(n, dtype=f32)
    mr = xp.full(n, -np.inf, dtype=f32)
    sr, ez, ezr = (xp.zeros(n, dtype=f32) for _ in range(3))
    for lo, hi, blk in _vocab_blocks(rt, w, cols):
        z, zr = logits(lo, hi, blk)
        vec = np.int32((hi - lo) % 4 == 0 and aligned16(rt, z, zr))
        args = (z, z if zr is None else zr, tgt, np.int32(hi - lo), np.int32(lo), vec, np.int32(kl))
        rt.launch(SOURCE, "ce_stats", (n,), (THREADS,), (*args, np.float32(cap), m, s, zt, mr, sr, ez, ezr))
    lse, lse_r, klv = (xp.empty(n, dtype=f32) for _ in range(3))
    args = (m, s, zt, wt, mr, sr, ez, ezr, tgt, np.int32(n), np.int32(kl), np.float32(kl_coef))
    rt.launch(SOURCE, "ce_finish", (1,), (THREADS,), (*args, lse, lse_r, klv, out))
    if not backward:
        return out[0], (out[1], n), dh, grads

    dhc = xp.zeros((n, C), dtype=f32)
    dzB = xp.zeros((n, lora.B.shape[1]), dtype=f32) if lora is not None else None
    dzA = xp.zeros((n, tied_lora.A.shape[1]), dtype=f32) if tied_lora is not None else None
    for lo, hi, blk in _vocab_blocks(rt, w, cols):
        z, zr = logits(lo, hi, blk)
        width = hi - lo
        vec = np.int32(width % 4 == 0 and aligned16(rt, z, zr))
        args = (z, z if zr is None else zr, tgt, wt, lse, lse_r, klv, np.int32(width), np.int32(lo), vec)
        rt.launch(
            SOURCE, "ce_grad", (n,), (THREADS,), (*args, np.int32(kl), np.float32(kl_coef), np.float32(cap))
        )
        dz = z
        if blk.dtype.name == "uint16":
            rt.gemm(to_bf16(rt, dz), blk, dhc, beta=1.0)  # dh += dz W (bf16 x bf16, fp32 sums)
        else:
            rt.gemm(dz, blk, dhc, beta=1.0)
        if need_dw:
            rt.gemm(dz, hc, grads["W"][lo:hi], trans_a=True)  # dW = dz^T h
        if lora is not None:
            rt.gemm(dz, lora.B[lo:hi], dzB, beta=1.0)
            rt.gemm(dz, ha, grads["lora"][1][lo:hi], trans_a=True, alpha=lora.s)  # dB = s dz^T (h A^T)
        if tied_lora is not None:
            rt.gemm(dz, tied_lora.A[lo:hi], dzA, beta=1.0)
            dA_t = grads["tied_lora"][0][lo:hi]
            rt.gemm(dz, hb, dA_t, trans_a=True, alpha=tied_lora.s)  # dA = s dz^T (h B)
    if lora is not None:
        rt.gemm(dzB, lora.A, dhc, alpha=lora.s, beta=1.0)  # dh += s (dz B) A
        rt.gemm(dzB, hc, grads["lora"][0], trans_a=True, alpha=lora.s)  # dA = s (dz B)^T h
    if tied_lora is not None:
        rt.gemm(dzA, tied_lora.B, dhc, trans_b=True, alpha=tied_lora.s, beta=1.0)  # dh += s (dz A) B^T
        rt.gemm(hc, dzA, grads["tied_lora"][1], trans_a=True, alpha=tied_lora.s)  # dB = s h^T (dz A)
    if rows is None:
        return out[0], (out[1], n), dhc, grads
    dh[rows] = dhc
    return out[0], (out[1], n), dh, grads


def project_on(rt: Runtime, h: Any, w: Any) -> Any:
    """`project` on a runtime: float32 logits (..., V), the vocabulary in blocks of the weight (an
    array, float32 or bf16 bits, or a lazy view's `row_chunks()`); a bf16 head takes h rounded to
    bf16 once (fp32 accumulation)."""
    xp = rt.xp
    h = f32_input(rt, h, "hidden states h")
    C = h.shape[-1]
    h2 = h.reshape(-1, C)
    V = int(w.shape[0])
    out = xp.empty((h2.shape[0], V), dtype=xp.float32)
    hb = None
    for lo, hi, blk in _vocab_blocks(rt, w, V):
        if blk.dtype.name == "uint16" and hb is None:
            hb = to_bf16(rt, h2)
        whole = lo == 0 and hi == V
        z = out if whole else xp.empty((h2.shape[0], hi - lo), dtype=xp.float32)
        rt.gemm(hb if blk.dtype.name == "uint16" else h2, blk, z, trans_b=True)
        if not whole:
            out[:, lo:hi] = z
    return out.reshape(*h.shape[:-1], V)


def softcap_forward_on(rt: Runtime, z: Any, cap: float):
    """`softcap_forward` on a runtime: y = cap tanh(z / cap); the cache keeps z, not tanh."""
    z = f32_input(rt, z, "soft-cap input z")
    y = rt.xp.empty(z.shape, dtype=rt.xp.float32)
    grid = max(1, min(65535, -(-z.size // THREADS)))
    rt.launch(SOURCE, "softcap_fwd", (grid,), (THREADS,), (z, y, np.int64(z.size), np.float32(cap)))
    return y, SoftcapCache(None, float(cap), z)


def softcap_backward_on(rt: Runtime, dy: Any, cache: SoftcapCache) -> Any:
    """`softcap_backward` on a runtime (tanh recomputed from the cache's z)."""
    z = cache.z
    dy = f32_input(rt, dy, "soft-cap gradient dy")
    if z is None or dy.shape != z.shape:
        raise ValueError(
            "softcap_backward (CUDA) needs the cache of softcap_forward (CUDA) and dy of its shape"
        )
    dz = rt.xp.empty(z.shape, dtype=rt.xp.float32)
    grid = max(1, min(65535, -(-z.size // THREADS)))
    rt.launch(
        SOURCE, "softcap_bwd", (grid,), (THREADS,), (dy, z, dz, np.int64(z.size), np.float32(cache.cap))
    )
    return dz


def project(h: Any, w: Any) -> Any:
    """CUDA twin of `project_ref`: logits h W^T (float32 CuPy array) for a float32 or bf16 head."""
    return project_on(runtime_for(h, "project"), h, w)


def lm_head_loss(h: Any, w: Any, targets: Any, weights: Any, **options: Any):
    """CUDA twin of `lm_head_loss_ref` (options: its keyword arguments): (loss, (ce_sum, n_tokens), dh,
    grads), loss and ce_sum as 0-d float64 device arrays (read them when needed: a read waits for the
    GPU)."""
    return lm_head_loss_on(runtime_for(h, "lm_head_loss"), h, w, targets, weights, **options)
