"""A linear map with an optional bias and LoRA term: y = x W^T + b + s (x A^T) B^T, never forming B A.

`linear_forward_ref` / `linear_backward_ref` are the NumPy reference (the specification).
`linear_forward` / `linear_backward` are the CUDA twins: cuBLAS GEMMs (the frozen weight in bf16
with fp32 accumulation when it is given as bf16, else fp32), LoRA factors in fp32, and
`to_bf16`, the fp32 -> bf16 cast kernel the other twins use before a bf16 GEMM. Not here: where
the weights come from (the weight store dequantizes them, bf16 on the GPU).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .nvrtc import KernelSource
from .runtime import Runtime, aligned16, f32_input, runtime_for


class LoraTerm(NamedTuple):
    """One LoRA factor pair applied to a weight: y += s * (x A^T) B^T."""

    A: np.ndarray  # (r, n_in), or (E, r, n_in) for expert stacks, or (V, r) for token_embd
    B: np.ndarray  # (n_out, r), or (E, n_out, r), or (C, r) for token_embd
    s: float  # effective scale: user scale * alpha / r


class LinearCache(NamedTuple):
    x: np.ndarray  # (..., n_in) input
    has_bias: bool
    lora: LoraTerm | None
    xa: np.ndarray | None  # (..., r) x A^T when there is a LoRA term


def linear_forward_ref(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, lora: LoraTerm | None = None
):
    """y = x W^T (+ b) (+ s (x A^T) B^T); W (n_out, n_in), never forming B A."""
    y = x @ w.T  # (..., n_out)
    if b is not None:
        y = y + b
    xa = None
    if lora is not None:
        xa = x @ lora.A.T  # (..., r)
        y = y + lora.s * (xa @ lora.B.T)
    return y, LinearCache(x, b is not None, lora, xa)


def linear_backward_ref(dy: np.ndarray, cache: LinearCache, w: np.ndarray, need_dw: bool = False):
    """forward was: y = x W^T + b + s (x A^T) B^T.  Returns (dx, dW, db, dA, dB), None where not needed."""
    x, has_bias, lora, xa = cache
    n_out, n_in = w.shape
    dy2 = dy.reshape(-1, n_out)
    x2 = x.reshape(-1, n_in)
    dx = dy @ w  # (..., n_in)
    dW = dy2.T @ x2 if need_dw else None
    db = dy2.sum(axis=0) if has_bias else None
    dA = dB = None
    if lora is not None:
        r = lora.A.shape[0]
        dyB = dy2 @ lora.B  # (N, r)
        dB = lora.s * (dy2.T @ xa.reshape(-1, r))  # (n_out, r)
        dA = lora.s * (dyB.T @ x2)  # (r, n_in)
        dx = dx + lora.s * (dyB @ lora.A).reshape(dx.shape)
    return dx, dW, db, dA, dB


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Dtype contract of the twins (CuPy arrays):
# - x, dy: float32 (..., n_in) / (..., n_out). Outputs and gradients are float32.
# - w (n_out, n_in): float32, or bfloat16 bit patterns as uint16 (CuPy has no bfloat16; the weight
#   store's `dequant(..., dtype="bfloat16")` writes this). A bf16 w runs y = x W^T and dx = dy W as
#   bf16 x bf16 products with fp32 accumulation (cuBLAS CUBLAS_COMPUTE_32F, tensor cores): x and dy
#   are rounded to bf16 (nearest-even) by `to_bf16` first, so those products carry bf16's ~3e-3
#   relative rounding. A float32 w runs in true fp32 (CUBLAS_COMPUTE_32F_PEDANTIC: no TF32), for
#   tensors trained in full and for parity with the reference.
# - b (n_out,) float32 or None; LoRA A (r, n_in) and B (n_out, r) float32: every LoRA product
#   (x A^T, (xA^T) B^T, and all of their gradients) is fp32. dW (need_dw) is fp32: dy^T x.
# The cache is the reference's LinearCache(x, has_bias, lora, xa), on the device.
#
# f32_to_bf16: elementwise, 8 values per thread and step (two 16-byte loads, one 16-byte store),
#   grid-stride over at most 65535 blocks of 256 threads. Floor: 6 bytes per value (read 4, write 2).
# GEMMs are cuBLAS's: y = x W^T costs 2 N n_in n_out FLOPs, at bf16 tensor-core rate (~800
# TFLOP/s measured on an H100 here) or fp32 (~50). The bias is written into y before the GEMM,
# which then adds (beta = 1), so y is written once more instead of read and written.


SOURCE = KernelSource.from_file("linear.cu", kernels=("f32_to_bf16",))
SOURCES = (SOURCE,)

THREADS = 256


def to_bf16(rt: Runtime, x: Any) -> Any:
    """float32 x as bf16 bit patterns (uint16, nearest-even), same shape; on the device."""
    x = f32_input(rt, x, "bf16 cast input")
    y = rt.xp.empty(x.shape, dtype=rt.xp.uint16)
    vec = np.int32(aligned16(rt, x, y))
    grid = max(1, min(65535, -(-x.size // (THREADS * 8))))
    rt.launch(SOURCE, "f32_to_bf16", (grid,), (THREADS,), (x, y, np.int64(x.size), vec))
    return y


def weight_operand(rt: Runtime, w: Any, what: str = "weight") -> Any:
    """A 2-D weight as a GEMM operand: float32 or bf16 bits (uint16), unit inner stride; else ValueError."""
    w = rt.xp.asarray(w)
    if w.dtype.name not in ("float32", "uint16"):
        raise ValueError(
            f"{what} must be float32 or bfloat16 bits (uint16) on the GPU path, got {w.dtype} "
            f"(shape {tuple(w.shape)})"
        )
    if w.ndim != 2 or w.strides[1] != w.itemsize:
        w = rt.xp.ascontiguousarray(w)
    return w


def matmul_into(rt: Runtime, x2: Any, w: Any, out: Any, *, trans_w: bool, x_bf16: Any = None, **kw) -> Any:
    """out = x2 op(w) (+ beta out) with w float32 or bf16: a bf16 w takes x2 rounded to bf16 (`x_bf16`
    when the caller has it already). Returns the bf16 copy of x2 it used (None for a float32 w)."""
    if w.dtype.name == "uint16":
        xb = to_bf16(rt, x2) if x_bf16 is None else x_bf16
        rt.gemm(xb, w, out, trans_b=trans_w, **kw)
        return xb
    rt.gemm(x2, w, out, trans_b=trans_w, **kw)
    return None


def _lora_operands(rt: Runtime, lora: LoraTerm) -> LoraTerm:
    return LoraTerm(f32_input(rt, lora.A, "LoRA A"), f32_input(rt, lora.B, "LoRA B"), float(lora.s))


def linear_forward_on(rt: Runtime, x: Any, w: Any, b: Any = None, lora: LoraTerm | None = None):
    """`linear_forward` on a runtime."""
    xp = rt.xp
    x = f32_input(rt, x, "linear input x")
    w = weight_operand(rt, w)
    n_out, n_in = w.shape
    if x.shape[-1] != n_in:
        raise ValueError(f"linear input has {x.shape[-1]} features, the weight {tuple(w.shape)} takes {n_in}")
    x2 = x.reshape(-1, n_in)  # (N, n_in)
    y2 = xp.empty((x2.shape[0], n_out), dtype=xp.float32)
    if b is not None:
        y2[...] = f32_input(rt, b, "linear bias b")
    matmul_into(rt, x2, w, y2, trans_w=True, beta=1.0 if b is not None else 0.0)
    xa = None
    if lora is not None:
        lora = _lora_operands(rt, lora)
        r = lora.A.shape[0]
        xa2 = xp.empty((x2.shape[0], r), dtype=xp.float32)
        rt.gemm(x2, lora.A, xa2, trans_b=True)  # (N, r)
        rt.gemm(xa2, lora.B, y2, trans_b=True, alpha=lora.s, beta=1.0)
        xa = xa2.reshape(*x.shape[:-1], r)
    return y2.reshape(*x.shape[:-1], n_out), LinearCache(x, b is not None, lora, xa)


def linear_backward_on(rt: Runtime, dy: Any, cache: LinearCache, w: Any, need_dw: bool = False):
    """`linear_backward` on a runtime."""
    xp = rt.xp
    x, has_bias, lora, xa = cache
    w = weight_operand(rt, w)
    n_out, n_in = w.shape
    dy = f32_input(rt, dy, "linear gradient dy")
    dy2 = dy.reshape(-1, n_out)
    x2 = x.reshape(-1, n_in)
    N = dy2.shape[0]
    dx2 = xp.empty((N, n_in), dtype=xp.float32)
    matmul_into(rt, dy2, w, dx2, trans_w=False)  # dx = dy W
    dW = None
    if need_dw:
        dW = xp.empty((n_out, n_in), dtype=xp.float32)
        rt.gemm(dy2, x2, dW, trans_a=True)  # dW = dy^T x
    db = dy2.sum(axis=0) if has_bias else None
    dA = dB = None
    if lora is not None:
        r = lora.A.shape[0]
        dyB = xp.empty((N, r), dtype=xp.float32)
        rt.gemm(dy2, lora.B, dyB)  # (N, r)
        dB = xp.empty((n_out, r), dtype=xp.float32)
        rt.gemm(dy2, xa.reshape(-1, r), dB, trans_a=True, alpha=lora.s)  # s dy^T (x A^T)
        dA = xp.empty((r, n_in), dtype=xp.float32)
        rt.gemm(dyB, x2, dA, trans_a=True, alpha=lora.s)  # s (dy B)^T x
        rt.gemm(dyB, lora.A, dx2, alpha=lora.s, beta=1.0)  # dx += s (dy B) A
    return dx2.reshape(*dy.shape[:-1], n_in), dW, db, dA, dB


def linear_forward(x: Any, w: Any, b: Any = None, lora: LoraTerm | None = None):
    """CUDA twin of `linear_forward_ref`: y = x W^T (+ b) (+ s (x A^T) B^T), W float32 or bf16 (uint16)."""
    return linear_forward_on(runtime_for(x, "linear_forward"), x, w, b, lora)


def linear_backward(dy: Any, cache: LinearCache, w: Any, need_dw: bool = False):
    """CUDA twin of `linear_backward_ref`: (dx, dW, db, dA, dB), None where not needed."""
    return linear_backward_on(runtime_for(dy, "linear_backward"), dy, cache, w, need_dw)


# ----------------------------------------------------------------------------------------------
# Groups: linear maps of one input (q, k, v; gate and up), as one op so that a twin can take them as
# one product of the concatenated weights (the CPU twin, engine.kernels.linear_cpu; the fused GPU
# step, engine.train.dense_step, does the same on its own buffers).


def linear_group_forward_ref(x: np.ndarray, ws, bs, loras):
    """[linear_forward_ref(x, w, b, lora) for each member]: returns (ys, caches), tuples of each
    member's output (..., n_out_i) and LinearCache. ws, bs, loras: one entry per member (bias or LoRA
    None where a member has none)."""
    outs = [linear_forward_ref(x, w, b, lora) for w, b, lora in zip(ws, bs, loras, strict=True)]
    return tuple(y for y, _ in outs), tuple(c for _, c in outs)


def linear_group_backward_ref(dys, caches, ws, need_dw):
    """forward was: y_i = linear(x, W_i, b_i, lora_i) for each member i. Returns (dx, grads): dx the sum
    of the members' input gradients, grads a tuple of (dW, db, dA, dB) per member (None where not
    needed); need_dw: one flag per member."""
    dx = None
    grads = []
    for dy, cache, w, need in zip(dys, caches, ws, need_dw, strict=True):
        dxi, dW, db, dA, dB = linear_backward_ref(dy, cache, w, need_dw=need)
        dx = dxi if dx is None else dx + dxi
        grads.append((dW, db, dA, dB))
    return dx, tuple(grads)


def linear_group_forward_on(rt: Runtime, x: Any, ws, bs, loras):
    """`linear_group_forward` on a runtime: each member's `linear_forward_on`."""
    outs = [linear_forward_on(rt, x, w, b, lora) for w, b, lora in zip(ws, bs, loras, strict=True)]
    return tuple(y for y, _ in outs), tuple(c for _, c in outs)


def linear_group_backward_on(rt: Runtime, dys, caches, ws, need_dw):
    """`linear_group_backward` on a runtime: each member's `linear_backward_on`, dx summed."""
    dx = None
    grads = []
    for dy, cache, w, need in zip(dys, caches, ws, need_dw, strict=True):
        dxi, dW, db, dA, dB = linear_backward_on(rt, dy, cache, w, need_dw=need)
        dx = dxi if dx is None else dx + dxi
        grads.append((dW, db, dA, dB))
    return dx, tuple(grads)
