"""The SwiGLU feed-forward activation h = silu(g) * u, and silu / sigmoid.

`swiglu_forward_ref` / `swiglu_backward_ref` are the NumPy reference (the specification).
`swiglu_forward` / `swiglu_backward` are the CUDA twins: one fused elementwise kernel each, fp32.
Not here: the projections around the activation (engine.kernels.linear).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .nvrtc import KernelSource
from .runtime import Runtime, aligned16, f32_input, runtime_for


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class SwigluCache(NamedTuple):
    g: np.ndarray  # (..., F) gate pre-activation
    u: np.ndarray  # (..., F) up projection
    sg: np.ndarray | None  # (..., F) silu(g); None from the CUDA twin, whose backward recomputes it


def swiglu_forward_ref(g: np.ndarray, u: np.ndarray):
    """h = silu(g) * u."""
    sg = silu(g)
    return sg * u, SwigluCache(g, u, sg)


def swiglu_backward_ref(dh: np.ndarray, cache: SwigluCache):
    """forward was: h = silu(g) * u.  Returns (dg, du)."""
    g, u, sg = cache
    sig = sigmoid(g)
    dg = dh * u * (sig * (1.0 + g * (1.0 - sig)))
    du = dh * sg
    return dg, du


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract: g, u float32 (..., F) on the device; fp32 math. The CUDA forward's cache is
# SwigluCache(g, u, None): silu(g) is recomputed in the backward from g (one expf per element)
# instead of being stored, which saves a (..., F) float32 array per FFN layer, the widest
# activation of the block, and its write. The CUDA backward ignores cache.sg.
#
# swiglu_fwd / swiglu_bwd: elementwise over n values, each thread 4 consecutive values per step
#   (16-byte loads and stores; the tail and 16-byte-misaligned inputs go one value at a time),
#   a grid-stride loop over at most 65535 blocks of 256 threads. Floors (bytes, memory-bound):
#   forward 12 per value (read g, u; write h), backward 20 (read dh, g, u; write dg, du): a
#   16384 x 14336 FFN moves 2.8 / 4.7 GB, ~0.94 / 1.6 ms at 3 TB/s.
#   silu(g) = g / (1 + expf(-g)), as the reference: for g < -88, expf overflows to inf and silu is
#   -0, as NumPy's float32; expf is IEEE-faithful (within 2 ulp), no fast-math.


SOURCE = KernelSource.from_file(
    "swiglu.cu", kernels=("swiglu_fwd", "swiglu_bwd", "swiglu_fwd_bf16", "swiglu_bwd_bf16")
)
SOURCES = (SOURCE,)

THREADS = 256


def elementwise_grid(n: int, per_thread: int = 4) -> int:
    """Blocks of THREADS for n values, per_thread each, capped at 65535 (grid-stride loops do the rest)."""
    return max(1, min(65535, -(-n // (THREADS * per_thread))))


def swiglu_forward_on(rt: Runtime, g: Any, u: Any) -> tuple[Any, SwigluCache]:
    """`swiglu_forward` on a runtime."""
    g = f32_input(rt, g, "swiglu gate g")
    u = f32_input(rt, u, "swiglu up u")
    if g.shape != u.shape:
        raise ValueError(f"swiglu gate {tuple(g.shape)} and up {tuple(u.shape)} differ in shape")
    h = rt.xp.empty(g.shape, dtype=rt.xp.float32)
    vec = np.int32(aligned16(rt, g, u, h))
    rt.launch(SOURCE, "swiglu_fwd", (elementwise_grid(g.size),), (THREADS,), (g, u, h, np.int64(g.size), vec))
    return h, SwigluCache(g, u, None)


def swiglu_backward_on(rt: Runtime, dh: Any, cache: SwigluCache) -> tuple[Any, Any]:
    """`swiglu_backward` on a runtime."""
    g, u = cache.g, cache.u
    dh = f32_input(rt, dh, "swiglu gradient dh")
    if dh.shape != g.shape:
        raise ValueError(f"swiglu gradient has shape {tuple(dh.shape)}, the forward {tuple(g.shape)}")
    dg = rt.xp.empty(g.shape, dtype=rt.xp.float32)
    du = rt.xp.empty(g.shape, dtype=rt.xp.float32)
    vec = np.int32(aligned16(rt, dh, g, u, dg, du))
    args = (dh, g, u, dg, du, np.int64(g.size), vec)
    rt.launch(SOURCE, "swiglu_bwd", (elementwise_grid(g.size),), (THREADS,), args)
    return dg, du


def swiglu_forward(g: Any, u: Any) -> tuple[Any, SwigluCache]:
    """CUDA twin of `swiglu_forward_ref`: h = silu(g) * u; the cache is SwigluCache(g, u, None)."""
    return swiglu_forward_on(runtime_for(g, "swiglu_forward"), g, u)


def swiglu_backward(dh: Any, cache: SwigluCache) -> tuple[Any, Any]:
    """CUDA twin of `swiglu_backward_ref`: (dg, du); silu(g) is recomputed from cache.g."""
    return swiglu_backward_on(runtime_for(dh, "swiglu_backward"), dh, cache)


# ----------------------------------------------------------------------------------------------
# The fused training step's SwiGLU (engine.train.dense_step): the same forward and backward as the
# reference above (`swiglu_forward_ref`, `swiglu_backward_ref`), on bf16 bits where the GEMMs write
# and read them. g and u are columns [0, F) and [F, 2F) of the gate/up projection's output `gu`
# (N, >= 2F, rows may be strided); h leaves as bf16 bits (N, F) for the down projection; dh comes in
# as float32 (N, F) and dg, du leave as bf16 bits in columns [0, F) and [F, 2F) of `dgu`. fp32 math
# in between. Floors: forward 6 bytes per value, backward 12.


def swiglu_fwd_bf16_on(rt: Runtime, gu: Any, F: int, h: Any) -> Any:
    """h = silu(g) u (bf16 bits into `h` (N, F)) from bf16 bits g = gu[:, :F], u = gu[:, F:2F]."""
    N = gu.shape[0]
    args = (gu, np.int64(gu.strides[0] // 2), h, np.int64(N), np.int32(F))
    rt.launch(SOURCE, "swiglu_fwd_bf16", (elementwise_grid(N * F, 1),), (THREADS,), args)
    return h


def swiglu_bwd_bf16_on(rt: Runtime, dh: Any, gu: Any, F: int, dgu: Any) -> Any:
    """forward was h = silu(g) u: dg, du as bf16 bits into dgu[:, :F], dgu[:, F:2F]."""
    N = gu.shape[0]
    args = (
        dh,
        gu,
        np.int64(gu.strides[0] // 2),
        dgu,
        np.int64(dgu.strides[0] // 2),
        np.int64(N),
        np.int32(F),
    )
    rt.launch(SOURCE, "swiglu_bwd_bf16", (elementwise_grid(N * F, 1),), (THREADS,), args)
    return dgu
