"""RoPE's CUDA twin against `rope_forward_ref` / `rope_backward_ref` (float64): both styles, full and
partial rotation, the 16-byte and the scalar kernel, on the emulator and on a GPU (marker gpu)."""

from __future__ import annotations

import numpy as np

from engine.kernels import rope
from tests.kernels import twin
from tests.kernels.twin import FP32_TOL, Backend, Check, compare, f32, f64

# (B, T, H, HS, n_rot): 16-byte paths; partial rotation; scalar paths (n_rot/2 odd, HS % 4 != 0)
CASES = [(2, 5, 3, 16, 16), (2, 5, 3, 16, 8), (1, 3, 2, 12, 6), (1, 4, 2, 10, 4)]
LARGE = [(2, 2048, 32, 128, 128), (4, 512, 8, 64, 32)]


def checks(be: Backend, rng: np.random.Generator) -> list[Check]:
    out = []
    for B, T, H, HS, n_rot in CASES + (LARGE if be.large else []):
        x = f32(rng, B, T, H, HS)
        dy = f32(rng, B, T, H, HS)
        pos = rng.integers(0, 4096, (B, T))
        ff = rng.uniform(0.5, 2.0, n_rot // 2)
        cos, sin = rope.rope_angles(pos, n_rot, 10000.0, 1.5, ff)
        for style in rope.STYLES:
            case = f"x {(B, T, H, HS)} n_rot {n_rot} {style}"

            def run(rt, style=style, cos=cos, sin=sin, x=x, dy=dy):
                y, cache = rope.rope_forward_on(rt, be.put(x), be.put(cos), be.put(sin), style)
                return y, rope.rope_backward_on(rt, be.put(dy), cache)

            y, dx = be.twice(run, f"rope {case}")
            yr, cr = rope.rope_forward_ref(f64(x), f64(cos), f64(sin), style)
            dxr = rope.rope_backward_ref(f64(dy), cr)
            out.append(compare("rope_forward", case, y, yr, FP32_TOL))
            out.append(compare("rope_backward", case, dx, dxr, FP32_TOL))
    return out


def test_rope_parity(backend, fresh_rng):
    twin.assert_checks(checks(backend, fresh_rng))
