"""The MoE experts' CPU twin (engine.kernels.moe_cpu: experts side by side on CPU workers, products in
the transposed layout) against `experts_forward_ref` / `experts_backward_ref` (float64): SwiGLU and
gpt-oss's clamped SwiGLU, biases on some projections, LoRA on all three, an expert without tokens,
every output and gradient; run in line and on two workers, which must give the same bits (the
parity helper of the CUDA twins, tests/kernels/twin.py, with its "cpu" backend)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import moe, moe_cpu
from engine.kernels.linear import LoraTerm
from tests.kernels import twin
from tests.kernels.twin import FP32_TOL, Backend, Check, _leaves, compare, f32, f64


def _case(rng, N, C, F, E, K, act, biases):
    logits = f32(rng, N, E)
    logits[:, E - 1] -= 30.0  # the last expert gets no token
    routing, _ = moe.route_forward_ref(logits, K, True)
    ws = [
        f32(rng, E, F, C, scale=C**-0.5),
        f32(rng, E, F, C, scale=C**-0.5),
        f32(rng, E, C, F, scale=F**-0.5),
    ]
    if act == "swiglu_oai":
        ws[0] *= 8.0  # gate values past the clamp at 7
    loras = [
        LoraTerm(f32(rng, E, r, n_in, scale=0.3), f32(rng, E, n_out, r, scale=0.3), 0.7)
        for r, n_out, n_in in ((3, F, C), (2, F, C), (4, C, F))
    ]
    b = {"b_gate": f32(rng, E, F), "b_up": None, "b_down": f32(rng, E, C)} if biases else {}
    return f32(rng, N, C), routing, ws, loras, b, f32(rng, N, C)


def _as64(obj):
    if isinstance(obj, LoraTerm):
        return LoraTerm(f64(obj.A), f64(obj.B), obj.s)
    if isinstance(obj, np.ndarray) and obj.dtype == np.float32:
        return f64(obj)
    return obj


def checks(be: Backend, rng: np.random.Generator) -> list[Check]:
    out = []
    for act, biases in (("silu", False), ("silu", True), ("swiglu_oai", True)):
        N, C, F, E, K = 40, 24, 16, 5, 2
        x, routing, ws, loras, b, dy = _case(rng, N, C, F, E, K, act, biases)
        case = f"N {N} C {C} F {F} E {E} K {K} {act}{' biases' if biases else ''}"

        def run(_rt, x=x, routing=routing, ws=ws, loras=loras, b=b, dy=dy, act=act):
            y, cache = moe_cpu.experts_forward_cpu(x, routing, *ws, *loras, act=act, **b)
            return y, moe_cpu.experts_backward_cpu(dy, cache, *ws, need_dw=True, need_db=bool(b))

        got = be.twice(run, f"experts (cpu) {case}")
        r64 = moe.Routing(*(_as64(a) for a in routing))
        y_r, c_r = moe.experts_forward_ref(
            f64(x), r64, *map(f64, ws), *map(_as64, loras), act=act, **{k: f64(v) for k, v in b.items()}
        )
        ref = (y_r, moe.experts_backward_ref(f64(dy), c_r, *map(f64, ws), need_dw=True, need_db=bool(b)))
        for (path, a), (_, r) in zip(_leaves(got), _leaves(ref), strict=True):
            if r is None:
                assert a is None, f"{case}{path}: the reference has none"
                continue
            out.append(compare(f"experts{path}", case, a, r, FP32_TOL))
    return out


@pytest.fixture
def cpu_twin() -> Backend:
    return Backend("cpu")


def test_moe_cpu_twin_parity(cpu_twin, fresh_rng):
    twin.assert_checks(checks(cpu_twin, fresh_rng))
