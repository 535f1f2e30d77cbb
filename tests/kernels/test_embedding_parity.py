"""The token embedding's CUDA twin against `embedding_forward_ref` / `embedding_backward_ref`
(float64): float32 and bf16 tables, rows of float4 width and odd width, repeated tokens (the
scatter-add), a LoRA pair, on the emulator and on a GPU (marker gpu)."""

from __future__ import annotations

import numpy as np

from engine.kernels import embedding
from engine.kernels.linear import LoraTerm
from tests.kernels import twin
from tests.kernels.twin import FP32_TOL, Backend, Check, bf16_bits, bf16_values, compare, f32, f64


def checks(be: Backend, rng: np.random.Generator) -> list[Check]:
    out = []
    cases = [(50, 16, 4, (3, 7)), (50, 13, 3, (2, 9)), (30, 24, 8, (1, 5))]
    if be.large:
        cases += [(32000, 4096, 16, (4, 512)), (151936, 896, 8, (2, 1024))]
    for V, C, r, bt in cases:
        wte = f32(rng, V, C)
        tokens = rng.integers(0, V, bt)
        tokens.flat[: min(4, tokens.size)] = tokens.flat[0]  # a repeated token: several rows to one
        lora = LoraTerm(f32(rng, V, r), f32(rng, C, r), 0.75)
        dx = f32(rng, *bt, C)
        for kind in ("f32", "bf16"):
            table = wte if kind == "f32" else bf16_bits(wte)
            ref_table = f64(wte) if kind == "f32" else bf16_values(table)
            case = f"V {V} C {C} r {r} tokens {bt} {kind}"

            def run(rt, table=table, lora=lora, tokens=tokens, dx=dx):
                lo = LoraTerm(be.put(lora.A), be.put(lora.B), lora.s)
                x, cache = embedding.embedding_forward_on(rt, be.put(table), be.put(tokens), lo)
                return x, embedding.embedding_backward_on(rt, be.put(dx), cache, need_dw=True)

            x, (dW, dA, dB) = be.twice(run, f"embedding {case}")
            lref = LoraTerm(f64(lora.A), f64(lora.B), lora.s)
            xr, cr = embedding.embedding_forward_ref(ref_table, tokens, lref)
            dWr, dAr, dBr = embedding.embedding_backward_ref(f64(dx), cr, need_dw=True)
            out.append(compare("embedding_forward", case, x, xr, FP32_TOL))
            out.append(compare("embedding_backward.dW", case, dW, dWr, FP32_TOL))
            out.append(compare("embedding_backward.dA", case, dA, dAr, FP32_TOL))
            out.append(compare("embedding_backward.dB", case, dB, dBr, FP32_TOL))
    return out


def test_embedding_parity(backend, fresh_rng):
    twin.assert_checks(checks(backend, fresh_rng))


def test_bad_token_id_gives_nan_row(backend, fresh_rng):
    """An id outside the table writes NaN over its row instead of reading out of bounds."""
    w = f32(fresh_rng, 10, 8)
    x = backend.get(embedding.get_rows_on(backend.rt, backend.put(w), np.array([3, 10, -1, 9])))
    assert np.isnan(x[1]).all() and np.isnan(x[2]).all()
    np.testing.assert_array_equal(x[[0, 3]], w[[3, 9]])
