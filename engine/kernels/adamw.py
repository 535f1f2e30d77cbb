"""One AdamW step over many parameters: the NumPy reference and its multi-tensor CUDA twin.

`adamw_step_ref` is the specification: the update of `engine.train.optim.AdamW.step` (gradient norm,
element-wise clip, global-norm clip, bias-corrected moments, decoupled weight decay), written over
flat lists of arrays with the same NumPy operations in the same order, so its results equal the
optimizer's bit for bit (a test holds them together). `adamw_step` is the CUDA twin: every
parameter in one launch per stage (a flat table of pointers and sizes), the moments in fp32, and
exactly one read from the device per step, the gradient norms the clipping needs.

Not here: learning-rate schedules, per-parameter step counts, state dicts, accumulation
(engine.train.optim keeps those and passes this module the numbers of one step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .nvrtc import KernelSource
from .runtime import Runtime, runtime_for, to_host


class AdamWResult(NamedTuple):
    """What one step did. The sums are Python floats from the reference, 0-d float64 device arrays
    from the CUDA twin (read them only when they are needed: each read waits for the GPU)."""

    grad_norm: float  # L2 norm of all gradients before any clipping; non-finite: the step was skipped
    clipped: bool  # whether the element-wise or the global-norm clip changed the gradients
    skipped: bool  # non-finite gradients: nothing changed
    update_sumsq: Any  # sum of squares of the change applied to the params (0 when skipped)
    param_sumsq: Any  # sum of squares of the given params after the step


# Elements per chunk of the CPU AdamW loop and of the sums of squares: a chunk of each operand
# stays in the L2 cache across the update's element-wise passes.
SUMSQ_CHUNK = 1 << 16


def sumsq(a: np.ndarray) -> float:
    """sum(a^2) accumulated in float64 without a float64 copy of `a` (the gradient norm, which the
    global-norm clip divides by)."""
    flat = a.reshape(-1)
    return float(np.einsum("i,i->", flat, flat, dtype=np.float64))


def sumsq_fast(a: np.ndarray) -> float:
    """sum(a^2) as float32 BLAS dots over chunks of SUMSQ_CHUNK values, the chunk sums added in order
    in float64: within about 1e-8 (relative) of `sumsq` at a tenth of its time. For the norms that
    are only reported (the update's, the params'); engine.train.optim.AdamW takes the same chunks
    in the same order inside its update loop, so the two agree bit for bit."""
    flat = a.reshape(-1)
    total = 0.0
    for lo in range(0, flat.size, SUMSQ_CHUNK):
        chunk = flat[lo : lo + SUMSQ_CHUNK]
        total += float(np.dot(chunk, chunk))
    return total


_sumsq = sumsq


def _check_lists(params, grads, m, v, steps, decay) -> None:
    n = len(params)
    for name, seq in (("grads", grads), ("m", m), ("v", v), ("steps", steps), ("decay", decay)):
        if len(seq) != n:
            raise ValueError(f"adamw_step: {len(seq)} {name} for {n} params")
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        if g.shape != p.shape or m[i].shape != p.shape or v[i].shape != p.shape:
            raise ValueError(
                f"adamw_step: param {i} has shape {p.shape}, its grad {g.shape}, m {m[i].shape}, "
                f"v {v[i].shape}"
            )
        if int(steps[i]) < 1:
            raise ValueError(f"adamw_step: param {i} has step count {steps[i]}; counts start at 1")


def clip_scale(norm: float, max_grad_norm: float) -> float:
    """The global-norm clip factor: what brings a gradient of L2 norm `norm` down to exactly
    `max_grad_norm` (1.0 when within, or when max_grad_norm is 0)."""
    if max_grad_norm > 0.0 and norm > max_grad_norm:
        return max_grad_norm / norm
    return 1.0


def clip_decision(grads: Sequence[np.ndarray], grad_norm: float, gclip: float, max_grad_norm: float):
    """(scale, clipped) of a step with a finite `grad_norm`: the global-norm clip's factor, over the
    gradients clamped to [-gclip, gclip] when gclip > 0, and whether either clip changes them."""
    clipped = False
    norm = grad_norm
    if gclip > 0.0:
        total = 0.0
        for g in grads:
            clipped = clipped or (g.size > 0 and (float(g.max()) > gclip or float(g.min()) < -gclip))
            total += _sumsq(np.clip(g, -gclip, gclip))
        norm = math.sqrt(total)
    scale = clip_scale(norm, max_grad_norm)
    return scale, clipped or scale != 1.0


def adamw_step_ref(
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
    """One AdamW step, in place on params, m and v (float32 arrays, matched by position).

    steps[i]: param i's update count t including this step (>= 1), for its bias correction.
    decay[i]: whether weight decay applies to param i. Per step, as engine.train.optim:
    grad_norm = ||g||; non-finite: nothing changes. g = clamp(g, -gclip, gclip) when gclip > 0;
    g *= max_grad_norm / ||g|| when that norm exceeds max_grad_norm > 0; then per param
    m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + lr wd p (wd where decayed),
    each operation rounded to float32 in the optimizer's order.
    """
    _check_lists(params, grads, m, v, steps, decay)
    grad_norm = math.sqrt(sum(_sumsq(g) for g in grads))
    if not math.isfinite(grad_norm):
        return AdamWResult(grad_norm, False, True, 0.0, sum(_sumsq(p) for p in params))
    scale, clipped = clip_decision(grads, grad_norm, gclip, max_grad_norm)
    b1, b2 = betas
    update_sumsq = 0.0
    for p, g_in, mi, vi, t, dec in zip(params, grads, m, v, steps, decay, strict=True):
        g = np.clip(g_in, -gclip, gclip) if gclip > 0.0 else g_in.copy()
        if scale != 1.0:
            g *= scale
        t = int(t)
        mi *= b1  # m = b1 m + (1 - b1) g
        mi += np.multiply(g, 1.0 - b1)
        vi *= b2  # v = b2 v + (1 - b2) g^2
        tmp = np.multiply(g, g)
        tmp *= 1.0 - b2
        vi += tmp
        tmp = np.sqrt(vi)  # sqrt(v_hat) + eps
        tmp /= math.sqrt(1.0 - b2**t)
        tmp += eps
        tmp = np.divide(mi, tmp)  # lr m_hat / (sqrt(v_hat) + eps)
        tmp *= lr / (1.0 - b1**t)
        if weight_decay > 0.0 and dec:
            delta = np.multiply(p, lr * weight_decay)
            delta += tmp
        else:
            delta = tmp
        p -= delta
        update_sumsq += sumsq_fast(delta)
    return AdamWResult(grad_norm, clipped, False, update_sumsq, sum(sumsq_fast(p) for p in params))


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract: params, grads, m, v float32 CuPy arrays (any shapes, C-contiguous), matched by
# position; the moments stay fp32. The host builds a table once per call: per tensor the four
# pointers, its size, its float32 coefficients (sqrt(1 - b2^t), lr / (1 - b1^t), lr wd or 0) and
# whether it is 16-byte aligned; per CUDA block one chunk of CHUNK values of one tensor (tensor id,
# start). Three stages, each one launch over every parameter:
# adamw_norms: grid n_chunks, 256 threads; per block the float64 sums of g^2 and of clamp(g)^2
#   and the count of |g| > gclip, written as block partials (no atomics).
# adamw_reduce: one block of 256 threads adds partials column by column in a fixed order (the
#   same sums on every run). The host then reads those 3 doubles: the one device read of a step,
#   which the global-norm clip needs before any parameter moves.
# adamw_update: grid n_chunks, 256 threads; per value the optimizer's float32 operations in its
#   order, each rounded once (__fmul_rn, __fdiv_rn, __fsqrt_rn: no FMA contraction), so the
#   result equals the reference bit for bit; 16-byte loads and stores where the tensor allows;
#   block partials of the update's and the new params' squares, reduced by adamw_reduce on the
#   device (the caller reads them only if it wants them).
# Floor (bytes): norms 4 per value (read g); update 28 (read p, g, m, v; write p, m, v): 40M LoRA
# values move 1.3 GB, ~0.43 ms at 3 TB/s. FLOPs ~15 per value, negligible.

CHUNK = 4096  # values per CUDA block (256 threads x 4 values x 4 steps)
THREADS = 256


SOURCE = KernelSource.from_file(
    "adamw.cu",
    kernels=(
        "adamw_norms", "adamw_reduce", "adamw_update", "adamw_norms_dev", "adamw_decide", "adamw_update_dev",
        "adamw_finish",
    ),
    defines={"CHUNK": CHUNK},
)  # fmt: skip
SOURCES = (SOURCE,)


class AdamWTable(NamedTuple):
    """The launch table of one step, on the device (see the module's CUDA comment)."""

    ptrs: Any  # (4 T,) uint64: p, g, m, v of each tensor
    sizes: Any  # (T,) int64
    coef: Any  # (3 T,) float32: sqrt(1 - b2^t), lr / (1 - b1^t), lr wd (0 where not decayed)
    flags: Any  # (T,) int32: bit 0 decay, bit 1 16-byte aligned
    chunk_tensor: Any  # (n_chunks,) int32
    chunk_start: Any  # (n_chunks,) int64
    n_chunks: int


def adamw_table(rt: Runtime, params, grads, m, v, steps, decay, lr, betas, weight_decay) -> AdamWTable:
    """Build the per-tensor and per-chunk tables on the host and copy them to the device."""
    xp = rt.xp
    b1, b2 = betas
    T = len(params)
    ptrs = np.zeros(4 * T, np.uint64)
    sizes = np.zeros(T, np.int64)
    coef = np.zeros(3 * T, np.float32)
    flags = np.zeros(T, np.int32)
    chunk_tensor: list[np.ndarray] = []
    chunk_start: list[np.ndarray] = []
    for i, arrays in enumerate(zip(params, grads, m, v, strict=True)):
        for k, a in enumerate(arrays):
            if a.dtype.name != "float32" or not a.flags.c_contiguous:
                what = ("param", "grad", "m", "v")[k]
                raise ValueError(
                    f"adamw_step: {what} {i} must be a C-contiguous float32 array, got {a.dtype} "
                    f"strides {a.strides}"
                )
            ptrs[4 * i + k] = rt.address(a)
        size = int(params[i].size)
        sizes[i] = size
        t = int(steps[i])
        dec = bool(decay[i]) and weight_decay > 0.0
        coef[3 * i : 3 * i + 3] = (
            math.sqrt(1.0 - b2**t),
            lr / (1.0 - b1**t),
            lr * weight_decay if dec else 0.0,
        )
        aligned = size % 4 == 0 and all(int(ptrs[4 * i + k]) % 16 == 0 for k in range(4))
        flags[i] = int(dec) | (int(aligned) << 1)
        starts = np.arange(0, size, CHUNK, dtype=np.int64)
        chunk_tensor.append(np.full(starts.size, i, np.int32))
        chunk_start.append(starts)
    ct = np.concatenate(chunk_tensor) if chunk_tensor else np.zeros(0, np.int32)
    cs = np.concatenate(chunk_start) if chunk_start else np.zeros(0, np.int64)
    return AdamWTable(
        xp.asarray(ptrs),
        xp.asarray(sizes),
        xp.asarray(coef),
        xp.asarray(flags),
        xp.asarray(ct),
        xp.asarray(cs),
        int(ct.size),
    )


def _reduce(rt: Runtime, partials: Any, n_rows: int, k: int) -> Any:
    out = rt.xp.empty(k, dtype=rt.xp.float64)
    rt.launch(SOURCE, "adamw_reduce", (1,), (THREADS,), (partials, np.int32(n_rows), np.int32(k), out))
    return out


def adamw_step_on(
    rt: Runtime,
    params,
    grads,
    m,
    v,
    steps,
    decay,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    gclip: float,
    max_grad_norm: float,
) -> AdamWResult:
    """`adamw_step` on a runtime."""
    xp = rt.xp
    _check_lists(params, grads, m, v, steps, decay)
    tab = adamw_table(rt, params, grads, m, v, steps, decay, lr, betas, weight_decay)
    n = tab.n_chunks
    clip_on = gclip > 0.0
    if n:
        part = xp.empty((n, 3), dtype=xp.float64)
        args = (tab.ptrs, tab.sizes, tab.chunk_tensor, tab.chunk_start, np.float32(gclip), np.float64(gclip))
        rt.launch(SOURCE, "adamw_norms", (n,), (THREADS,), (*args, np.int32(clip_on), part))
        sums = to_host(_reduce(rt, part, n, 3))  # the one read from the device
    else:
        sums = np.zeros(3)
    grad_norm = math.sqrt(float(sums[0]))
    if not math.isfinite(grad_norm):
        psum = xp.zeros((), dtype=xp.float64)
        for p in params:
            psum += xp.sum(p.astype(xp.float64) ** 2)
        return AdamWResult(grad_norm, False, True, xp.zeros((), dtype=xp.float64), psum)
    norm = math.sqrt(float(sums[1])) if clip_on else grad_norm
    scale = clip_scale(norm, max_grad_norm)
    clipped = (clip_on and float(sums[2]) > 0) or scale != 1.0
    if n == 0:
        zero = xp.zeros((), dtype=xp.float64)
        return AdamWResult(grad_norm, clipped, False, zero, zero.copy())
    b1, b2 = betas
    part = xp.empty((n, 2), dtype=xp.float64)
    args = (tab.ptrs, tab.sizes, tab.coef, tab.flags, tab.chunk_tensor, tab.chunk_start)
    args += (np.float32(b1), np.float32(1.0 - b1), np.float32(b2), np.float32(1.0 - b2), np.float32(eps))
    args += (np.float32(gclip), np.int32(clip_on), np.float32(scale), np.int32(scale != 1.0), part)
    rt.launch(SOURCE, "adamw_update", (n,), (THREADS,), args)
    out = _reduce(rt, part, n, 2)
    return AdamWResult(grad_norm, clipped, False, out[0], out[1])


def adamw_step(params, grads, m, v, steps, decay, **hyper: Any) -> AdamWResult:
    """CUDA twin of `adamw_step_ref` (hyper: its keyword arguments), in place on CuPy arrays; one
    device read (the gradient norms).

    Returns grad_norm and clipped as host values, update_sumsq and param_sumsq as 0-d float64
    device arrays. A non-finite gradient norm changes nothing.
    """
    if not params:
        return adamw_step_ref([], [], [], [], [], [], **hyper)
    return adamw_step_on(runtime_for(params[0], "adamw_step"), params, grads, m, v, steps, decay, **hyper)


# ----------------------------------------------------------------------------------------------
# The fused training step's AdamW (engine.train.dense_step): the same update as `adamw_step_ref`,
# bit for bit, with every decision on the device so that a step reads the host once, at its end:
# adamw_norms_dev (the gradient norms' block partials; gradients may be row-strided views into the
# GEMMs' outputs), adamw_decide (one block: the norms added in adamw_reduce's order, the global-norm
# clip's scale, the skip of a step whose gradient norm or loss is not finite), adamw_update_dev (the
# update, skipped on the device when decided so; the bf16 bits of each new parameter written where
# the next step's GEMMs read them, its "shadow"; partials of the update's and params' squares, of
# max |p| and of non-finite params: the trainer's check of exploded weights, folded in), adamw_finish
# (one block: those into the stats). The tables are built once (`DeviceAdamW`), the per-step
# coefficients (learning rate, bias corrections) uploaded before each step.

STATS = ("loss", "ce_sum", "grad_sumsq", "clipped", "skipped", "update_sumsq", "param_sumsq", "max_abs_param",
         "nonfinite_params", "clip_scale")  # fmt: skip


class DeviceAdamW:
    """The static launch tables of the device-decided AdamW over a fixed set of tensors.

    tensors: per tensor (p, g, m, v, shadow): p, m, v C-contiguous float32; g float32 of p's shape
    as a 2-D view whose rows may be strided; shadow None or a 2-D bf16 (uint16) view of p's shape
    (rows may be strided). decay: per tensor, whether weight decay applies.
    """

    def __init__(self, rt: Runtime, tensors, decay) -> None:
        xp = rt.xp
        self.rt = rt
        T = len(tensors)
        ptrs = np.zeros(5 * T, np.uint64)
        dims = np.zeros(4 * T, np.int64)
        flags = np.zeros(T, np.int32)
        cts, css = [], []
        for i, (p, g, m, v, sh) in enumerate(tensors):
            rows, cols = (p.shape[0], int(np.prod(p.shape[1:]))) if p.ndim > 1 else (1, p.size)
            for k, a in enumerate((p, g, m, v, sh)):
                if a is None:
                    continue
                if k in (0, 2, 3) and (a.dtype.name != "float32" or not a.flags.c_contiguous):
                    raise ValueError(f"DeviceAdamW: tensor {i} part {k} must be C-contiguous float32")
                if a.size != p.size or (a.ndim == 2 and a.strides[1] != a.itemsize):
                    raise ValueError(
                        f"DeviceAdamW: tensor {i} part {k} has shape {a.shape}, strides {a.strides}"
                    )
                ptrs[5 * i + k] = rt.address(a)
            g_ld = g.strides[0] // 4 if g.ndim == 2 else cols
            s_ld = (sh.strides[0] // 2 if sh.ndim == 2 else cols) if sh is not None else cols
            dims[4 * i : 4 * i + 4] = (p.size, cols if g.ndim == 2 else p.size, g_ld, s_ld)
            if g.ndim != 2:
                dims[4 * i + 1] = p.size
                dims[4 * i + 2] = p.size
            flags[i] = int(bool(decay[i]))
            starts = np.arange(0, p.size, CHUNK, dtype=np.int64)
            cts.append(np.full(starts.size, i, np.int32))
            css.append(starts)
        ct = np.concatenate(cts) if cts else np.zeros(0, np.int32)
        self.n_chunks = int(ct.size)
        self.T = T
        self.ptrs, self.dims, self.flags = xp.asarray(ptrs), xp.asarray(dims), xp.asarray(flags)
        self.chunk_tensor = xp.asarray(ct)
        self.chunk_start = xp.asarray(np.concatenate(css) if css else np.zeros(0, np.int64))
        self.coef = xp.zeros(3 * T, dtype=xp.float32)
        self.decay = [bool(d) for d in decay]
        n = max(1, self.n_chunks)
        self.part3 = xp.empty((n, 3), dtype=xp.float64)
        self.part4 = xp.empty((n, 4), dtype=xp.float64)
        self._keep = tensors  # the arrays the table points into stay alive with it

    def coefficients(self, steps, lr: float, betas, weight_decay: float) -> np.ndarray:
        """The per-step float32 coefficients (host), as `adamw_table` computes them."""
        b1, b2 = betas
        coef = np.zeros(3 * self.T, np.float32)
        for i, t in enumerate(steps):
            dec = self.decay[i] and weight_decay > 0.0
            coef[3 * i : 3 * i + 3] = (
                math.sqrt(1.0 - b2**t),
                lr / (1.0 - b1**t),
                lr * weight_decay if dec else 0.0,
            )
        return coef

    def step(
        self, stats, *, betas, eps: float, gclip: float, max_grad_norm: float, shadow_only: bool = False
    ):
        """The step's launches (no host read): norms, decision, update, stats[2:10] (module STATS)."""
        rt, n = self.rt, self.n_chunks
        if n == 0:
            return
        clip_on = gclip > 0.0
        if not shadow_only:
            args = (
                self.ptrs,
                self.dims,
                self.chunk_tensor,
                self.chunk_start,
                np.float32(gclip),
                np.float64(gclip),
            )
            rt.launch(SOURCE, "adamw_norms_dev", (n,), (THREADS,), (*args, np.int32(clip_on), self.part3))
            args = (self.part3, np.int32(n), np.int32(clip_on), np.float64(max_grad_norm), stats)
            rt.launch(SOURCE, "adamw_decide", (1,), (THREADS,), args)
        b1, b2 = betas
        args = (self.ptrs, self.dims, self.coef, self.flags, self.chunk_tensor, self.chunk_start)
        args += (np.float32(b1), np.float32(1.0 - b1), np.float32(b2), np.float32(1.0 - b2), np.float32(eps))
        args += (np.float32(gclip), np.int32(clip_on), None if shadow_only else stats, np.int32(shadow_only))
        rt.launch(SOURCE, "adamw_update_dev", (n,), (THREADS,), (*args, self.part4))
        if not shadow_only:
            rt.launch(SOURCE, "adamw_finish", (1,), (THREADS,), (self.part4, np.int32(n), stats))
