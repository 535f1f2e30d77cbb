"""`Runtime.gemm_batched` (the tensor-core attention's products) against NumPy in float64: float32 and
bf16 operands, each transpose, a batch stride of 0 (one matrix for every batch entry), strided row
views; on the emulator (the default one-GEMM-per-matrix loop) and on a GPU (one strided-batched
cuBLAS call, marker gpu). Shapes that do not agree are a ValueError."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.kernels.twin import BF16_TOL, FP32_TOL, bf16_bits, bf16_values, compare, f32


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_gemm_batched_matches_numpy(backend, fresh_rng, dtype):
    rt, xp = backend.rt, backend.rt.xp
    n, M, N, K = 3, 37, 20, 24
    for trans_a, trans_b, shared_b in itertools.product((False, True), (False, True), (False, True)):
        a = f32(fresh_rng, n, *((K, M) if trans_a else (M, K)))
        b = f32(fresh_rng, 1 if shared_b else n, *((N, K) if trans_b else (K, N)))
        if dtype == "bf16":
            a_op, b_op = bf16_bits(a), bf16_bits(b)
            a_ref, b_ref = bf16_values(a_op), bf16_values(b_op)
        else:
            a_op, b_op, a_ref, b_ref = a, b, a.astype(np.float64), b.astype(np.float64)
        a_dev = backend.put(a_op)
        b_dev = backend.put(b_op)
        if shared_b:  # the same matrix for every entry: a batch stride of 0
            b_dev = xp.broadcast_to(b_dev, (n, *b_op.shape[1:]))
        out = xp.full((n, M, N), np.nan, dtype=xp.float32)
        out_ref = backend.put(f32(fresh_rng, n, M, N))
        beta_out = out_ref.copy()
        rt.gemm_batched(a_dev, b_dev, out, trans_a=trans_a, trans_b=trans_b, alpha=0.5)
        rt.gemm_batched(a_dev, b_dev, beta_out, trans_a=trans_a, trans_b=trans_b, alpha=1.0, beta=2.0)
        A = a_ref.swapaxes(1, 2) if trans_a else a_ref
        B = np.broadcast_to(b_ref, (n, *b_ref.shape[1:]))
        B = B.swapaxes(1, 2) if trans_b else B
        want = A @ B
        tol = BF16_TOL if dtype == "bf16" else FP32_TOL
        case = f"{dtype} trans_a {trans_a} trans_b {trans_b} shared_b {shared_b}"
        for got, ref in ((out, 0.5 * want), (beta_out, want + 2.0 * backend.get(out_ref).astype(np.float64))):
            c = compare("gemm_batched", case, backend.get(got), ref, tol / 10)
            assert c.ok, c.message


def test_gemm_batched_refuses_what_does_not_agree(backend):
    rt, xp = backend.rt, backend.rt.xp
    a = xp.zeros((2, 4, 3), dtype=xp.float32)
    with pytest.raises(ValueError, match="3-D arrays of one batch"):
        rt.gemm_batched(a, xp.zeros((3, 3, 5), dtype=xp.float32), xp.zeros((2, 4, 5), dtype=xp.float32))
    with pytest.raises(ValueError, match="shapes do not agree"):
        rt.gemm_batched(a, xp.zeros((2, 4, 5), dtype=xp.float32), xp.zeros((2, 4, 5), dtype=xp.float32))
    with pytest.raises(ValueError, match="C-contiguous out"):
        out = xp.zeros((2, 5, 4), dtype=xp.float32).swapaxes(1, 2)
        rt.gemm_batched(a, xp.zeros((2, 3, 5), dtype=xp.float32), out)
