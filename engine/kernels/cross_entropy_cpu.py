"""The CPU twin of the output head's loss: `lm_head_loss_cpu`, the arguments and results of
`engine.kernels.cross_entropy.lm_head_loss_ref`, whose softmax / cross-entropy rows run compiled
(`ce_rows_cpu`, the twin of `ce_rows_ref`): per logit row, the max, the sum of exponentials and
the gradient dz = w (softmax - onehot) written over the logits, in three passes of a row that stays
in the L2 cache (the reference makes seven or eight passes over a block of rows of 50-600 MB and
allocates a second block for the probabilities). The products around them are the reference's.

Sums in float64, in 16 lanes (so that the compiler vectorises them; a fixed order, the same result
on every run); exp is `jit.exp32`. Within float32 rounding of the reference. Runs the reference
where it does not apply: float64 inputs, a KL term, a head read in blocks (the streamed path), and
while compiled kernels are off (engine.kernels.jit). The parity test is tests/kernels/test_cpu_twins.py.
"""

from __future__ import annotations

import numpy as np

from . import jit
from .cross_entropy import (
    LOGITS_BYTES,
    MIN_ROWS,
    _is_one_block,
    ce_rows_ref,
    lm_head_loss_blocks,
    lm_head_loss_ref,
)


@jit.kernel
def _ce_rows(z, tgt, wt, backward, ce):  # z (n, V) float32, C-contiguous; ce (n,) float64
    n, V = z.shape
    x = z.reshape(-1)
    lanes = np.empty(16, np.float32)
    acc = np.empty(16, np.float64)
    for i in range(n):
        off = np.uint64(i * V)
        m = jit.row_max(x, off, V, lanes)
        zt = x[off + np.uint64(tgt[i])]
        total = jit.row_exp_sum(x, off, V, m, acc)  # the row becomes exp(z - m)
        ce[i] = np.float64(m) + np.log(total) - np.float64(zt)
        if backward:
            s = np.float32(total)
            w = wt[i]
            for v in range(np.uint64(V)):
                x[off + v] = (x[off + v] / s) * w
            x[off + np.uint64(tgt[i])] -= w


def ce_rows_cpu(z: np.ndarray, tgt: np.ndarray, wt: np.ndarray, backward: bool = True):
    """CPU twin of `ce_rows_ref` (same arguments and results; dz is z itself, overwritten)."""
    if not (jit.f32_rows(z, wt) and z.ndim == 2 and jit.enabled()):
        return ce_rows_ref(z, tgt, wt, backward)
    ce = np.empty(z.shape[0], np.float64)
    _ce_rows(z, np.ascontiguousarray(tgt, dtype=np.int64), wt, bool(backward), ce)
    return ce, (z if backward else None)


def lm_head_loss_cpu(h, w, targets, weights, *, lora=None, tied_lora=None, need_dw=False,
                     max_logits_bytes=LOGITS_BYTES, min_rows=MIN_ROWS, h_ref=None, w_ref=None, kl_coef=0.0,
                     backward=True, cap=0.0):  # fmt: skip
    """CPU twin of `lm_head_loss_ref` (same arguments and results)."""
    kl = bool(kl_coef) and h_ref is not None
    blocks = _is_one_block(w) or need_dw
    if kl or not blocks or not (jit.f32_rows(h) and jit.enabled()):
        return lm_head_loss_ref(h, w, targets, weights, lora=lora, tied_lora=tied_lora, need_dw=need_dw,
                                max_logits_bytes=max_logits_bytes, min_rows=min_rows, h_ref=h_ref,
                                w_ref=w_ref, kl_coef=kl_coef, backward=backward, cap=cap)  # fmt: skip
    return lm_head_loss_blocks(h, w, targets, weights, lora, tied_lora, need_dw, max_logits_bytes, min_rows,
                               h_ref, w_ref, kl_coef, backward, cap, ce_rows_cpu)  # fmt: skip
