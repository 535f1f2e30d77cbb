"""The gated activation of feed-forward layers and experts, h = act(g, u), elementwise; one op whose
kind is an argument:

- "silu": SwiGLU, h = silu(g) u (llama, qwen, deepseek, ...);
- "gelu": GEGLU, h = gelu(g) u (Gemma), GELU in its tanh form; for float32 inputs through ggml's fp16
  table, as llama.cpp computes it on the CPU (`gelu_ggml`), exactly for float64 (the precision the
  gradient checks differentiate in: the table is piecewise constant);
- "swiglu_oai": gpt-oss's clamped SwiGLU, g' = min(g, 7), u' = clamp(u, -7, 7),
  h = g' sigmoid(1.702 g') (u' + 1) (constants of llama.cpp, not GGUF keys).

One op rather than three: the kinds share their shapes, cache and backward's form, the dense FFN and
the experts pick theirs from the architecture (`ArchSpec.ffn_act`, `expert_act`), and the CUDA side
writes each kind's arithmetic once (cuda/glu.cuh) for this elementwise kernel and for the MoE
kernels' fused epilogues alike.

`glu_forward_ref` / `glu_backward_ref` are the NumPy reference (the specification). `glu_forward_on`
/ `glu_backward_on` (and `glu_forward` / `glu_backward` on CuPy arrays) are the CUDA twin: one fused
elementwise kernel each, fp32. Not here: the projections around the activation (engine.kernels.linear,
engine.kernels.moe).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from .nvrtc import KernelSource
from .runtime import Runtime, aligned16, f32_input, runtime_for

ACTS = ("silu", "gelu", "swiglu_oai")
GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = 0.7978845608028654
GELU_TABLE_LIMIT = 10.0  # ggml: gelu(x) = 0 for x <= -10, x for x >= 10, the fp16 table between
OAI_ALPHA = 1.702  # gpt-oss's clamped SwiGLU: constants in llama.cpp, not GGUF keys
OAI_LIMIT = 7.0


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), in x's dtype."""
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


def gelu_tanh_grad(x: np.ndarray) -> np.ndarray:
    """d gelu_tanh(x) / dx."""
    inner = SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)
    t = np.tanh(inner)
    dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_COEF_A * x * x)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner


def gelu_ggml(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU of float32 values (GGML_GELU_FP16): x rounded to fp16 (nearest even) indexes a
    table of fp16(gelu_tanh(h)) for -10 < x < 10; 0 below, x above."""
    h = x.astype(np.float16).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # |h| beyond the table's range is replaced below
        t = gelu_tanh(h).astype(np.float16).astype(x.dtype)
    return np.where(x <= -GELU_TABLE_LIMIT, 0, np.where(x >= GELU_TABLE_LIMIT, x, t)).astype(x.dtype)


class GluCache(NamedTuple):
    g: np.ndarray  # (..., F) gate pre-activation (before any clamp)
    u: np.ndarray  # (..., F) up projection
    a: np.ndarray | None  # (..., F) silu(g) or gelu(g) as the forward used it; None for swiglu_oai and
    # from the CUDA twin, whose backward recomputes it
    act: str  # "silu", "gelu" or "swiglu_oai"
    table: bool | None = None  # gelu: whether through ggml's table (None: as the dtype says)


def _check_act(act: str) -> None:
    if act not in ACTS:
        raise ValueError(f"unknown gated activation {act!r}; expected one of {', '.join(ACTS)}")


def glu_forward_ref(g: np.ndarray, u: np.ndarray, act: str = "silu", table: bool | None = None):
    """h = act(g, u) (the module docstring gives each kind). `table` (gelu only): through ggml's fp16
    table, or exactly; None: the table for float32 inputs (matching llama.cpp), exact for float64. The
    backward differentiates the exact tanh form either way (a straight-through estimate across the
    table's steps)."""
    _check_act(act)
    if act == "silu":
        a = silu(g)
        return a * u, GluCache(g, u, a, act)
    if act == "gelu":
        if table is None:
            table = g.dtype != np.float64
        a = gelu_ggml(g) if table else gelu_tanh(g)
        return a * u, GluCache(g, u, a, act, table)
    gc = np.minimum(g, OAI_LIMIT)
    uc = np.clip(u, -OAI_LIMIT, OAI_LIMIT)
    s = 1.0 / (1.0 + np.exp(-OAI_ALPHA * gc))
    return gc * s * (uc + 1.0), GluCache(g, u, None, act)


def glu_backward_ref(dh: np.ndarray, cache: GluCache):
    """forward was: h = act(g, u).  Returns (dg, du); for swiglu_oai no gradient flows where a clamp
    holds."""
    g, u, a, act, table = cache
    if act == "silu":
        sig = sigmoid(g)
        sg = silu(g) if a is None else a
        return dh * u * (sig * (1.0 + g * (1.0 - sig))), dh * sg
    if act == "gelu":
        if a is None:
            a = gelu_ggml(g) if (g.dtype != np.float64 if table is None else table) else gelu_tanh(g)
        return dh * u * gelu_tanh_grad(g), dh * a
    # forward was: h = min(g, L) sigmoid(alpha min(g, L)) (clamp(u, -L, L) + 1)
    gc = np.minimum(g, OAI_LIMIT)
    uc = np.clip(u, -OAI_LIMIT, OAI_LIMIT)
    s = 1.0 / (1.0 + np.exp(-OAI_ALPHA * gc))
    dgc = dh * (uc + 1.0) * (s + OAI_ALPHA * gc * s * (1.0 - s))
    dg = np.where(g < OAI_LIMIT, dgc, 0.0).astype(dh.dtype)
    du = np.where(np.abs(u) < OAI_LIMIT, dh * gc * s, 0.0).astype(dh.dtype)
    return dg, du


# ----------------------------------------------------------------------------------------------
# CUDA
#
# Contract: g, u float32 (..., F) on the device; fp32 math. The CUDA forward's cache is
# GluCache(g, u, None, act, table): the activation of g is recomputed in the backward (one expf or table read
# per element) instead of being stored, which saves a (..., F) float32 array per FFN layer, the
# widest activation of the block, and its write.
#
# glu_fwd / glu_bwd: elementwise over n values, each thread 4 consecutive values per step (16-byte
#   loads and stores; the tail and 16-byte-misaligned inputs go one value at a time), a grid-stride
#   loop over at most 65535 blocks of 256 threads; `act` selects the kind (cuda/glu.cuh: ACT_SILU,
#   ACT_GELU, ACT_OAI). Floors (bytes, memory-bound): forward 12 per value (read g, u; write h),
#   backward 20 (read dh, g, u; write dg, du): a 16384 x 14336 FFN moves 2.8 / 4.7 GB, ~0.94 / 1.6 ms
#   at 3 TB/s.
# silu(g) = g / (1 + expf(-g)), as the reference: for g < -88, expf overflows to inf and silu is -0, as
#   NumPy's float32; expf is IEEE-faithful (within 2 ulp), no fast-math.
# gelu, table: ggml's table as the reference builds it (`gelu_table`: fp16(gelu_tanh(h)) for all 65536
#   fp16 values h, held as float32 on the device, 256 KB, L2-resident), indexed by g rounded to fp16
#   (nearest even, integer arithmetic in the kernel): the same bits as `gelu_ggml`. Exact (table=False):
#   tanhf in fp32. The backward's derivative is the exact tanh form's, as the reference's.

ACT_CODES = {"silu": 0, "gelu": 1, "swiglu_oai": 2}  # the `act` argument of the kernels (cuda/glu.cuh)
SOURCE = KernelSource.from_file("glu.cu", kernels=("glu_fwd", "glu_bwd", "glu_fwd_bf16", "glu_bwd_bf16"))
SOURCES = (SOURCE,)

THREADS = 256


def elementwise_grid(n: int, per_thread: int = 4) -> int:
    """Blocks of THREADS for n values, per_thread each, capped at 65535 (grid-stride loops do the rest)."""
    return max(1, min(65535, -(-n // (THREADS * per_thread))))


@functools.lru_cache(maxsize=1)
def gelu_table() -> np.ndarray:
    """ggml's fp16 GELU table as float32 values, indexed by the fp16 bit pattern of the input:
    fp16(gelu_tanh(h)) for every fp16 value h (0 for infinities and NaN), as `gelu_ggml` computes it."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        t = gelu_tanh(h).astype(np.float16).astype(np.float32)
    t[~np.isfinite(h)] = 0.0
    return np.where(np.isfinite(t), t, 0.0).astype(np.float32)


@functools.lru_cache(maxsize=4)
def _device_table(rt: Runtime) -> Any:
    return rt.xp.asarray(gelu_table())


def _table_arg(rt: Runtime, act: str, table: bool | None) -> Any:
    """The gelu table on the device for a float32 GEGLU that takes it (the default), else None."""
    return _device_table(rt) if act == "gelu" and table is not False else None


def glu_forward_on(rt: Runtime, g: Any, u: Any, act: str = "silu", table: bool | None = None):
    """`glu_forward` on a runtime."""
    _check_act(act)
    g = f32_input(rt, g, "glu gate g")
    u = f32_input(rt, u, "glu up u")
    if g.shape != u.shape:
        raise ValueError(f"glu gate {tuple(g.shape)} and up {tuple(u.shape)} differ in shape")
    h = rt.xp.empty(g.shape, dtype=rt.xp.float32)
    vec = np.int32(aligned16(rt, g, u, h))
    tab = _table_arg(rt, act, table)
    args = (g, u, h, np.int64(g.size), vec, np.int32(ACT_CODES[act]), tab)
    rt.launch(SOURCE, "glu_fwd", (elementwise_grid(g.size),), (THREADS,), args)
    return h, GluCache(g, u, None, act, table)


def glu_backward_on(rt: Runtime, dh: Any, cache: GluCache) -> tuple[Any, Any]:
    """`glu_backward` on a runtime."""
    g, u, _, act, table = cache
    dh = f32_input(rt, dh, "glu gradient dh")
    if dh.shape != g.shape:
        raise ValueError(f"glu gradient has shape {tuple(dh.shape)}, the forward {tuple(g.shape)}")
    dg = rt.xp.empty(g.shape, dtype=rt.xp.float32)
    du = rt.xp.empty(g.shape, dtype=rt.xp.float32)
    vec = np.int32(aligned16(rt, dh, g, u, dg, du))
    tab = _table_arg(rt, act, table)
    args = (dh, g, u, dg, du, np.int64(g.size), vec, np.int32(ACT_CODES[act]), tab)
    rt.launch(SOURCE, "glu_bwd", (elementwise_grid(g.size),), (THREADS,), args)
    return dg, du


def glu_forward(g: Any, u: Any, act: str = "silu", table: bool | None = None) -> tuple[Any, GluCache]:
    """CUDA twin of `glu_forward_ref`; the cache is GluCache(g, u, None, act, table)."""
    return glu_forward_on(runtime_for(g, "glu_forward"), g, u, act, table)


def glu_backward(dh: Any, cache: GluCache) -> tuple[Any, Any]:
    """CUDA twin of `glu_backward_ref`: (dg, du), the activation recomputed from cache.g."""
    return glu_backward_on(runtime_for(dh, "glu_backward"), dh, cache)


# ----------------------------------------------------------------------------------------------
# The fused training step's activation (engine.train.dense_step): the same forward and backward as
# the reference (`glu_forward_ref`, `glu_backward_ref`), on bf16 bits where the GEMMs write and read
# them. g and u are columns [0, F) and [F, 2F) of the gate/up projection's output `gu` (N, >= 2F, rows
# may be strided); h leaves as bf16 bits (N, F) for the down projection; dh comes in as float32 (N, F)
# and dg, du leave as bf16 bits in columns [0, F) and [F, 2F) of `dgu`. fp32 math in between.
# Floors: forward 6 bytes per value, backward 12.


def glu_fwd_bf16_on(rt: Runtime, gu: Any, F: int, h: Any, act: str = "silu") -> Any:
    """h = act(g, u) (bf16 bits into `h` (N, F)) from bf16 bits g = gu[:, :F], u = gu[:, F:2F]."""
    _check_act(act)
    N = gu.shape[0]
    tab = _table_arg(rt, act, None)
    args = (gu, np.int64(gu.strides[0] // 2), h, np.int64(N), np.int32(F), np.int32(ACT_CODES[act]), tab)
    rt.launch(SOURCE, "glu_fwd_bf16", (elementwise_grid(N * F, 1),), (THREADS,), args)
    return h


def glu_bwd_bf16_on(rt: Runtime, dh: Any, gu: Any, F: int, dgu: Any, act: str = "silu") -> Any:
    """forward was h = act(g, u): dg, du as bf16 bits into dgu[:, :F], dgu[:, F:2F]."""
    _check_act(act)
    N = gu.shape[0]
    tab = _table_arg(rt, act, None)
    args = (
        dh,
        gu,
        np.int64(gu.strides[0] // 2),
        dgu,
        np.int64(dgu.strides[0] // 2),
        np.int64(N),
        np.int32(F),
        np.int32(ACT_CODES[act]),
        tab,
    )
    rt.launch(SOURCE, "glu_bwd_bf16", (elementwise_grid(N * F, 1),), (THREADS,), args)
    return dgu
