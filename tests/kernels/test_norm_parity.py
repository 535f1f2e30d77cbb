"""RMSNorm's CUDA twin against `rmsnorm_forward_ref` / `rmsnorm_backward_ref` (float64), forward and
backward, with and without a weight, rows of float4 width and of odd width, on the emulator and on a
GPU (marker gpu)."""

from __future__ import annotations

import numpy as np

from engine.kernels import norm
from tests.kernels import twin
from tests.kernels.twin import FP32_TOL, Backend, Check, compare, f32, f64


def cases(large: bool) -> list[tuple[tuple[int, ...], bool]]:
    out = [((3, 5, 64), True), ((7, 13), True), ((4, 2, 36), False), ((2, 3, 2, 16), True)]
    if large:
        out += [((2048, 4096), True), ((16384, 128), True), ((64, 5120), False), ((8, 16384), True)]
    return out


def checks(be: Backend, rng: np.random.Generator) -> list[Check]:
    out = []
    eps = 1e-5
    for shape, with_w in cases(be.large):
        C = shape[-1]
        x = f32(rng, *shape, scale=2.0)
        w = f32(rng, C) if with_w else None
        dy = f32(rng, *shape)
        case = f"{shape} w={'yes' if with_w else 'none'}"

        def run(rt, x=x, w=w, dy=dy):
            y, cache = norm.rmsnorm_forward_on(rt, be.put(x), be.put(w), eps)
            dx, dw = norm.rmsnorm_backward_on(rt, be.put(dy), cache, be.put(w))
            return y, cache, dx, dw

        y, cache, dx, dw = be.twice(run, f"rmsnorm {case}")
        yr, cr = norm.rmsnorm_forward_ref(f64(x), f64(w), eps)
        dxr, dwr = norm.rmsnorm_backward_ref(f64(dy), cr, f64(w))
        out.append(compare("rmsnorm_forward.y", case, y, yr, FP32_TOL))
        out.append(compare("rmsnorm_forward.rstd", case, cache.rstd, cr.rstd, FP32_TOL))
        out.append(compare("rmsnorm_backward.dx", case, dx, dxr, FP32_TOL))
        if with_w:
            out.append(compare("rmsnorm_backward.dw", case, dw, dwr, FP32_TOL))
        else:
            assert dw is None
    return out


def test_rmsnorm_parity(backend, fresh_rng):
    twin.assert_checks(checks(backend, fresh_rng))
