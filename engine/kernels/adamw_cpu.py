"""The CPU twin of AdamW: `adamw_step_cpu`, the arguments and results of
`engine.kernels.adamw.adamw_step_ref`, equal to it bit for bit (params, moments and the reported
sums). engine.train.optim.AdamW's CPU step runs it.

How: each float32 C-contiguous parameter is cut into chunks of SUMSQ_CHUNK values (a chunk of every
operand stays in the L2 cache); chunks are independent pieces, so with more than one CPU worker
(engine.kernels.cpu_workers) they run side by side. A chunk is one compiled pass (engine.kernels.jit)
that reads p, m, v and g once and writes p, m, v and the update: the reference's dozen float32
operations per value in its order, each rounded once (no FMA contraction), hence the same bits.
Without compiled kernels a chunk is NumPy's dozen in-place passes over it (the earlier CPU path).
The update's and the parameter's sums of squares are float32 BLAS dots over the same chunks, added
in order in float64 (`sumsq_fast`'s chunks), as the reference reports them; the gradient norm, which
the global clip divides by, is a float64 sum (`sumsq`). Measured in bench/CPU_NOTES.md.

Other parameters (float64, strided) take the NumPy passes in line. The parity test is
tests/kernels/test_cpu_twins.py (and tests/kernels/test_adamw_parity.py holds the optimizer to the
reference bit for bit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from . import jit
from .adamw import SUMSQ_CHUNK, AdamWResult, _check_lists, clip_decision, sumsq, sumsq_fast
from .cpu_workers import run_each

# Fewer values than this are updated in line, not on CPU workers: the tiny models' optimizer steps
# (tens of thousands of values, chunks of a few microseconds) only pay the hand-off; 5.5M values
# took 12 ms on two workers against 18 ms in line (bench/CPU_NOTES.md).
PARALLEL_MIN_VALUES = 1 << 20


@jit.kernel
def _update(p, m, v, g, delta, gclip, scale, b1, one_b1, b2, one_b2, eps, bc2, step, decay):
    """One chunk (flat float32 arrays) in the reference's order of float32 operations; the constants
    are float32; gclip > 0: clip, scale != 1: scale, decay != 0: weight decay."""
    clip = gclip > 0
    scaled = scale != 1
    decayed = decay != 0
    for i in range(p.size):
        gi = g[i]
        if clip:
            gi = min(max(gi, -gclip), gclip)
        if scaled:
            gi = gi * scale
        mi = m[i] * b1 + gi * one_b1  # m = b1 m + (1 - b1) g
        m[i] = mi
        vi = v[i] * b2 + (gi * gi) * one_b2  # v = b2 v + (1 - b2) g^2
        v[i] = vi
        t = np.sqrt(vi) / bc2 + eps  # sqrt(v_hat) + eps
        t = (mi / t) * step  # lr m_hat / (sqrt(v_hat) + eps)
        if decayed:
            t = p[i] * decay + t
        delta[i] = t
        p[i] = p[i] - t


def numpy_update(p, m, v, g, gbuf, tmp, dbuf, gclip, scale, b1, b2, eps, bc2_sqrt, step_size, decay):
    """One AdamW update in place of `p`, `m`, `v` (views of one shape) from the gradient `g`, in the
    reference's order of float32 operations (NumPy passes); `gbuf`, `tmp`, `dbuf` are scratch of that
    shape. Returns the update (a view of `tmp` or `dbuf`)."""
    if gclip > 0.0:
        np.clip(g, -gclip, gclip, out=gbuf, casting="same_kind")
    else:
        np.copyto(gbuf, g, casting="same_kind")
    g = gbuf
    if scale != 1.0:
        g *= scale
    m *= b1  # m = b1 m + (1 - b1) g
    np.multiply(g, 1.0 - b1, out=tmp)
    m += tmp
    v *= b2  # v = b2 v + (1 - b2) g^2
    np.multiply(g, g, out=tmp)
    tmp *= 1.0 - b2
    v += tmp
    np.sqrt(v, out=tmp)  # tmp = sqrt(v_hat) + eps
    tmp /= bc2_sqrt
    tmp += eps
    np.divide(m, tmp, out=tmp)  # tmp = lr * m_hat / (sqrt(v_hat) + eps)
    tmp *= step_size
    if not decay:
        p -= tmp
        return tmp
    np.multiply(p, decay, out=dbuf)
    dbuf += tmp
    p -= dbuf
    return dbuf


def _update_chunk(piece: tuple) -> tuple[float, float]:
    """One chunk of a contiguous float32 param, with scratch of its own (chunks may run side by side):
    returns the float32 BLAS dots of its update and of its new values (`sumsq_fast`'s chunk sums)."""
    (p, m, v, g), args, compiled = piece
    delta = np.empty(p.size, np.float32)
    if compiled:
        gclip, scale, b1, b2, eps, bc2, step, decay = args
        f = np.float32
        _update(p, m, v, g, delta, f(gclip), f(scale), f(b1), f(1.0 - b1), f(b2), f(1.0 - b2), f(eps), f(bc2),
                f(step), f(decay))  # fmt: skip
    else:
        gbuf = np.empty(p.size, np.float32)
        dbuf = np.empty(p.size, np.float32) if args[-1] else None  # only weight decay writes it
        delta = numpy_update(p, m, v, g, gbuf, delta, dbuf, *args)
    return float(np.dot(delta, delta)), float(np.dot(p, p))


def adamw_step_cpu(
    params: Sequence[np.ndarray],
    grads: Sequence[np.ndarray],
    m: Sequence[np.ndarray],
    v: Sequence[np.ndarray],
    steps: Sequence[int],
    decay: Sequence[bool],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    gclip: float,
    max_grad_norm: float,
) -> AdamWResult:
    """CPU twin of `adamw_step_ref` (same arguments and results, the same bits)."""
    _check_lists(params, grads, m, v, steps, decay)
    n = len(params)
    small = sum(g.size for g in grads) < PARALLEL_MIN_VALUES  # in line, not on workers
    # pass 1: norms before and after the element-wise clip, for the global-norm clip
    grad_norm = math.sqrt(sum(run_each(sumsq, list(grads), in_line=small)))  # per param, in order
    if not math.isfinite(grad_norm):
        return AdamWResult(grad_norm, False, True, 0.0, sum(sumsq(p) for p in params))
    scale, clipped = clip_decision(grads, grad_norm, gclip, max_grad_norm)
    # pass 2: per param, clipped grad -> moments -> update, chunk by chunk (see the module docstring)
    b1, b2 = betas
    compiled = jit.enabled()
    owner: list[int] = []  # per piece, the index of its param
    sums: list[tuple[float, float] | None] = []  # per piece, (update, param) sums of squares
    chunks: list[tuple] = []  # what `_update_chunk` takes, for the pieces whose sums are None
    for k in range(n):
        p, mk, vk, g = params[k], m[k], v[k], grads[k]
        t = int(steps[k])
        dec = lr * weight_decay if weight_decay > 0.0 and decay[k] else 0.0
        args = (gclip, scale, b1, b2, eps, math.sqrt(1.0 - b2**t), lr / (1.0 - b1**t), dec)
        contiguous = all(a.flags.c_contiguous and a.dtype == np.float32 for a in (p, mk, vk))
        if contiguous and g.dtype == np.float32 and g.flags.c_contiguous:
            flat = tuple(a.reshape(-1) for a in (p, mk, vk, g))
            for lo in range(0, p.size, SUMSQ_CHUNK):
                owner.append(k)
                sums.append(None)
                chunks.append((tuple(a[lo : lo + SUMSQ_CHUNK] for a in flat), args, compiled))
        else:  # NumPy passes in line
            scratch = [np.empty(p.shape, p.dtype) for _ in range(3)]
            delta = numpy_update(p, mk, vk, g, *scratch, *args)
            owner.append(k)
            sums.append((sumsq_fast(delta), sumsq_fast(p)))
    done = iter(run_each(_update_chunk, chunks, in_line=small))
    sums = [s if s is not None else next(done) for s in sums]
    update_sumsq = param_sumsq = 0.0
    du = dp = 0.0
    for i, (k, (u2, p2)) in enumerate(zip(owner, sums, strict=True)):
        du += u2
        dp += p2
        if i + 1 == len(owner) or owner[i + 1] != k:  # the param's last piece
            update_sumsq += du
            param_sumsq += dp
            du = dp = 0.0
    return AdamWResult(grad_norm, clipped, False, update_sumsq, param_sumsq)
