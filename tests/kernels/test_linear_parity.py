"""The linear map's CUDA twin against `linear_forward_ref` / `linear_backward_ref` (float64): a
float32 weight (fp32 GEMMs, 1e-5) and a bf16 weight (bf16 products with fp32 sums, 1e-2), with bias,
LoRA and dW, and the fp32 -> bf16 cast kernel bit for bit; on the emulator and on a GPU (marker gpu)."""

from __future__ import annotations

import numpy as np

from engine.kernels import linear
from engine.kernels.linear import LoraTerm
from tests.kernels import twin
from tests.kernels.twin import BF16_TOL, FP32_TOL, Backend, Check, bf16_bits, bf16_values, compare, f32, f64


def checks(be: Backend, rng: np.random.Generator) -> list[Check]:
    out = []
    cases = [((2, 5), 24, 12, 4, True), ((7,), 13, 9, 2, False)]
    if be.large:
        cases += [((4, 512), 4096, 4096, 16, False), ((2048,), 896, 4864, 8, True)]
    for lead, n_in, n_out, r, bias in cases:
        x = f32(rng, *lead, n_in)
        w = f32(rng, n_out, n_in, scale=n_in**-0.5)
        b = f32(rng, n_out) if bias else None
        lora = LoraTerm(f32(rng, r, n_in), f32(rng, n_out, r), 0.5)
        dy = f32(rng, *lead, n_out)
        for kind in ("f32", "bf16"):
            wk = w if kind == "f32" else bf16_bits(w)
            wr = f64(w) if kind == "f32" else bf16_values(wk)
            tol = FP32_TOL if kind == "f32" else BF16_TOL
            case = f"x {(*lead, n_in)} W ({n_out}, {n_in}) {kind} r {r} bias {bias}"

            def run(rt, wk=wk, lora=lora, x=x, b=b, dy=dy):
                lo = LoraTerm(be.put(lora.A), be.put(lora.B), lora.s)
                y, cache = linear.linear_forward_on(rt, be.put(x), be.put(wk), be.put(b), lo)
                return y, linear.linear_backward_on(rt, be.put(dy), cache, be.put(wk), need_dw=True)

            y, (dx, dW, db, dA, dB) = be.twice(run, f"linear {case}")
            lref = LoraTerm(f64(lora.A), f64(lora.B), lora.s)
            yr, cr = linear.linear_forward_ref(f64(x), wr, f64(b), lref)
            dxr, dWr, dbr, dAr, dBr = linear.linear_backward_ref(f64(dy), cr, wr, need_dw=True)
            out.append(compare("linear_forward", case, y, yr, tol))
            out.append(compare("linear_backward.dx", case, dx, dxr, tol))
            for name, a, ref in (("dW", dW, dWr), ("dA", dA, dAr), ("dB", dB, dBr)):
                out.append(compare(f"linear_backward.{name}", case, a, ref, FP32_TOL))  # fp32 GEMMs
            if bias:
                out.append(compare("linear_backward.db", case, db, dbr, FP32_TOL))
    return out


def test_linear_parity(backend, fresh_rng):
    twin.assert_checks(checks(backend, fresh_rng))


def test_bf16_cast_is_round_to_nearest_even(backend, fresh_rng):
    x = f32(fresh_rng, 1003)
    x[:4] = [np.inf, -np.inf, 3.0e38, -0.0]
    x[4] = np.float32(1.0) + np.float32(2.0**-8)  # a tie: rounds to even (1.0)
    got = backend.get(linear.to_bf16(backend.rt, backend.put(x)))
    np.testing.assert_array_equal(got, bf16_bits(x))
