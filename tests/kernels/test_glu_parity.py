"""The gated activation's CUDA twin against `glu_forward_ref` / `glu_backward_ref` (float64), every kind:
SwiGLU (whole float4 runs, odd tails, large |g|: expf overflow), GEGLU through ggml's fp16 table
(values past +-10, fp16 subnormals and rounding ties: the same bits as the float32 reference) and
exact, and gpt-oss's clamped SwiGLU (values at and past both clamps); on the emulator and on a GPU
(marker gpu). The CUDA cache holds no activation: its backward recomputes it."""

from __future__ import annotations

import numpy as np

from engine.kernels import glu
from tests.kernels import twin
from tests.kernels.twin import FP32_TOL, Backend, Check, compare, f32, f64


def _gelu_inputs(rng: np.random.Generator, shape) -> np.ndarray:
    """Values that exercise the table: both limits, fp16 subnormals, and exact fp16 rounding ties."""
    g = f32(rng, *shape, scale=4.0).reshape(-1)
    n = g.size
    halves = rng.integers(0, 0x4900, n // 4).astype(np.uint16)  # |h| < 10, subnormals included
    lo = halves.view(np.float16).astype(np.float32)
    hi = (halves + 1).view(np.float16).astype(np.float32)
    g[: n // 4] = np.where(rng.random(n // 4) < 0.5, -1, 1) * (lo + hi) / 2  # exact midpoints: ties
    g[n // 4 : n // 4 + 6] = [-12.0, -10.0, -9.999, 9.999, 10.0, 15.0][: max(0, min(6, n - n // 4))]
    g[-1] = 3e-7  # an fp16 subnormal
    return g.reshape(shape)


def checks(be: Backend, rng: np.random.Generator) -> list[Check]:
    out = []
    shapes = [(3, 5, 40), (7, 13), (1, 3)] + ([(4096, 14336), (1, 1000003)] if be.large else [])
    kinds = [("silu", None), ("gelu", None), ("gelu", False), ("swiglu_oai", None)]
    for shape in shapes:
        for act, table in kinds:
            if act == "gelu":
                g = _gelu_inputs(rng, shape)
            elif act == "swiglu_oai":
                g = f32(rng, *shape, scale=6.0)
                g.flat[:2] = (7.0, 25.0)[: g.size]  # at and past the gate's clamp
            else:
                g = f32(rng, *shape, scale=4.0)
                g.flat[0] = -100.0  # expf(100) overflows to inf: silu is -0, as the reference's
            u = f32(rng, *shape, scale=4.0 if act == "swiglu_oai" else 1.0)
            if act == "swiglu_oai" and u.size > 3:
                u.flat[2:4] = (-7.0, 9.0)  # at and past the up projection's clamps
            dh = f32(rng, *shape)
            case = f"{shape} {act}" + (" exact" if table is False else "")

            def run(rt, g=g, u=u, dh=dh, act=act, table=table):
                h, cache = glu.glu_forward_on(rt, be.put(g), be.put(u), act, table)
                assert cache.a is None
                return h, glu.glu_backward_on(rt, be.put(dh), cache)

            h, (dg, du) = be.twice(run, f"glu {case}")
            ref_table = None if act != "gelu" else table is not False
            hr, cr = glu.glu_forward_ref(f64(g), f64(u), act, ref_table)
            dgr, dur = glu.glu_backward_ref(f64(dh), cr)
            out.append(compare("glu_forward", case, h, hr, FP32_TOL))
            out.append(compare("glu_backward.dg", case, dg, dgr, FP32_TOL))
            out.append(compare("glu_backward.du", case, du, dur, FP32_TOL))
            if act == "gelu" and table is None:  # ggml's table: the float32 reference's bits exactly
                h32, _ = glu.glu_forward_ref(g, u, "gelu")
                same = np.array_equal(h.view(np.uint32), h32.view(np.uint32))
                bad = int((h.view(np.uint32) != h32.view(np.uint32)).sum())
                out.append(Check("glu_forward.bits", case, float(bad), 0.0, float(bad), 0.0, 0, same))
    return out


def test_glu_parity(backend, fresh_rng):
    twin.assert_checks(checks(backend, fresh_rng))


def test_gelu_table_is_ggmls():
    """The table the kernels read is fp16(gelu_tanh(h)) of every fp16 h, as the reference computes it."""
    t = glu.gelu_table()
    h = np.linspace(-9.99, 9.99, 4001, dtype=np.float32)
    idx = h.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(t[idx], glu.gelu_ggml(h))
