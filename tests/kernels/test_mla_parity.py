"""Multi-head latent attention's key/value decompression, CUDA twin against `mla_kv_forward_ref` /
`mla_kv_backward_ref` (float64): float32 weights (fp32 GEMMs) and bf16 weights as the device weight
store gives them (bf16 operands, fp32 accumulation), keys and values of different head sizes, the
weight gradients too; on the emulator and on a GPU (marker gpu)."""

from __future__ import annotations

import numpy as np

from engine.kernels import mla
from tests.kernels import twin
from tests.kernels.twin import BF16_TOL, FP32_TOL, Backend, Check, bf16_bits, bf16_values, compare, f32, f64


def cases(large: bool):
    # (B, T, R, NH, NOPE, HSV)
    out = [(2, 5, 32, 4, 16, 16), (1, 7, 24, 3, 8, 12)]
    if large:
        out += [(2, 1024, 512, 16, 128, 128)]  # DeepSeek-V2-Lite's
    return out


def checks(be: Backend, rng: np.random.Generator) -> list[Check]:
    out = []
    for B, T, R, NH, NOPE, HSV in cases(be.large):
        c = f32(rng, B, T, R)
        kb, vb = f32(rng, NH, R, NOPE, scale=R**-0.5), f32(rng, NH, HSV, R, scale=R**-0.5)
        dk, dv = f32(rng, B, T, NH, NOPE), f32(rng, B, T, NH, HSV)
        for kind in ("f32", "bf16"):
            kw, vw = (kb, vb) if kind == "f32" else (bf16_bits(kb), bf16_bits(vb))
            kr, vr = (f64(kb), f64(vb)) if kind == "f32" else (bf16_values(kw), bf16_values(vw))
            tol = FP32_TOL if kind == "f32" else BF16_TOL
            case = f"B {B} T {T} R {R} NH {NH} NOPE {NOPE} HSV {HSV} {kind}"

            def run(rt, c=c, kw=kw, vw=vw, dk=dk, dv=dv):
                (k, v), cache = mla.mla_kv_forward_on(rt, be.put(c), be.put(kw), be.put(vw))
                back = mla.mla_kv_backward_on(rt, be.put(dk), be.put(dv), cache, be.put(kw), be.put(vw), True)
                return k, v, back

            k, v, (dc, dkb, dvb) = be.twice(run, f"mla {case}")
            (k_r, v_r), cache_r = mla.mla_kv_forward_ref(f64(c), kr, vr)
            dc_r, dkb_r, dvb_r = mla.mla_kv_backward_ref(f64(dk), f64(dv), cache_r, kr, vr, need_dw=True)
            for name, a, r in (("k", k, k_r), ("v", v, v_r), ("dc", dc, dc_r), ("dw_kb", dkb, dkb_r),
                               ("dw_vb", dvb, dvb_r)):  # fmt: skip
                # the weight gradients are fp32 products of fp32 activations on both paths
                out.append(compare(f"mla_kv.{name}", case, a, r, FP32_TOL if name.startswith("dw") else tol))
    return out


def test_mla_kv_parity(backend, fresh_rng):
    twin.assert_checks(checks(backend, fresh_rng))
