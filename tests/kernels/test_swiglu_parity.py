"""SwiGLU's CUDA twin against `swiglu_forward_ref` / `swiglu_backward_ref` (float64): whole float4
runs, odd tails, large |g| (expf overflow), on the emulator and on a GPU (marker gpu). The CUDA
cache holds no silu(g): its backward recomputes it."""

from __future__ import annotations

import numpy as np

from engine.kernels import swiglu
from tests.kernels.twin import FP32_TOL, Backend, Check, compare, f32, f64


def checks(be: Backend, rng: np.random.Generator) -> list[Check]:
    out = []
    shapes = [(3, 5, 40), (7, 13), (1, 3)] + ([(4096, 14336), (1, 1000003)] if be.large else [])
    for shape in shapes:
        g = f32(rng, *shape, scale=4.0)
        g.flat[0] = -100.0  # expf(100) overflows to inf: silu is -0, as the reference's
        u = f32(rng, *shape)
        dh = f32(rng, *shape)
        case = f"{shape}"

        def run(rt, g=g, u=u, dh=dh):
            h, cache = swiglu.swiglu_forward_on(rt, be.put(g), be.put(u))
            assert cache.sg is None
            return h, swiglu.swiglu_backward_on(rt, be.put(dh), cache)

        h, (dg, du) = be.twice(run, f"swiglu {case}")
        hr, cr = swiglu.swiglu_forward_ref(f64(g), f64(u))
        dgr, dur = swiglu.swiglu_backward_ref(f64(dh), cr)
        out.append(compare("swiglu_forward", case, h, hr, FP32_TOL))
        out.append(compare("swiglu_backward.dg", case, dg, dgr, FP32_TOL))
        out.append(compare("swiglu_backward.du", case, du, dur, FP32_TOL))
    return out


def test_swiglu_parity(backend, fresh_rng):
    for c in checks(backend, fresh_rng):
        assert c.ok, c.message
