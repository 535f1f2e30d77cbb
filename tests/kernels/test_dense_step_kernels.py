"""Parity of the fused dense step's kernels with their NumPy references (engine.kernels.qkv, the
fused norms of norm.py, the bf16 SwiGLU of glu.py, the device-decided AdamW of adamw.py, the head
loss over padded rows), on the emulator and, where there is one, on a GPU; and the finite-difference
check of the one new forward/backward pair (q/k/v bias + per-head norm + RoPE)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import adamw, glu, norm, qkv
from engine.kernels.cross_entropy import lm_head_loss_on, lm_head_loss_ref
from engine.kernels.rope import rope_angles
from tests.gradcheck import assert_grads_close, check_grads
from tests.kernels.twin import BF16_TOL, FP32_TOL, bf16_bits, bf16_values, compare, f32

CASES = [  # (style, NH, NKV, HS, n_rot, bias, head norm)
    ("norm", 4, 2, 16, 16, False, False),
    ("neox", 4, 2, 16, 16, True, False),
    ("neox", 2, 1, 32, 32, False, True),
    ("norm", 3, 1, 64, 32, True, True),
]


def _qkv_inputs(rng, style, NH, NKV, HS, n_rot, bias, head_norm, B=2, T=5, extra=3):
    n = (NH + 2 * NKV) * HS
    x = f32(rng, B, T, n + extra)
    bits = bf16_bits(x)
    pos = np.tile(np.arange(T), (B, 1))
    cos, sin = rope_angles(pos, n_rot, 10000.0)
    b = f32(rng, n, scale=0.3) if bias else None
    qn = (1 + 0.2 * f32(rng, HS)) if head_norm else None
    kn = (1 + 0.2 * f32(rng, HS)) if head_norm else None
    return bits, b, qn, kn, cos, sin


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_qkv_rope_matches_the_reference(backend, fresh_rng, case):
    style, NH, NKV, HS, n_rot, bias, head_norm = case
    bits, b, qn, kn, cos, sin = _qkv_inputs(fresh_rng, *case)
    B, T = bits.shape[:2]
    N = B * T
    eps = 1e-6
    z = bf16_values(bits)
    ref = qkv.qkv_rope_forward_ref(z, b, qn, kn, eps, cos, sin, style, NH, NKV, HS)
    dq, dk, dv = (f32(fresh_rng, *r.shape) for r in ref)
    dz_ref = qkv.qkv_rope_backward_ref(dq, dk, dv, z, b, qn, kn, eps, cos, sin, style, NH, NKV, HS)
    put = backend.put

    def run(rt):
        args = (
            put(b),
            put(qn),
            put(kn),
            eps,
            put(cos.reshape(N, -1)),
            put(sin.reshape(N, -1)),
            style,
            NH,
            NKV,
            HS,
        )
        x = put(bits.reshape(N, -1))
        q, k, v = qkv.qkv_rope_forward_on(rt, x, *args)
        out = rt.xp.zeros((N, bits.shape[-1] + 2), dtype=rt.xp.uint16)
        qkv.qkv_rope_backward_on(rt, put(dq.reshape(N, NH, HS)), put(dk.reshape(N, NKV, HS)),
                                 put(dv.reshape(N, NKV, HS)), x, *args, out)  # fmt: skip
        return q, k, v, out

    q, k, v, out = backend.twice(run, "qkv_rope")
    for name, got, want in (("q", q, ref[0]), ("k", k, ref[1]), ("v", v, ref[2])):
        c = compare(
            f"qkv_rope_forward.{name}", str(case), np.asarray(got).reshape(want.shape), want, FP32_TOL
        )
        assert c.ok, c.message
    n = (NH + 2 * NKV) * HS
    dz = bf16_values(np.asarray(out)[:, :n]).reshape(dz_ref.shape)
    c = compare("qkv_rope_backward.dz", str(case), dz, dz_ref, BF16_TOL)
    assert c.ok, c.message
    assert not np.asarray(out)[:, n:].any()  # nothing written past the q, k, v columns


@pytest.mark.parametrize("case", CASES[1:3], ids=lambda c: "-".join(map(str, c)))
def test_qkv_rope_backward_is_the_gradient_of_its_forward(case):
    style, NH, NKV, HS, n_rot, bias, head_norm = case
    rng = np.random.default_rng(3)
    bits, b, qn, kn, cos, sin = _qkv_inputs(rng, *case, T=3)
    z = bf16_values(bits)
    b, qn, kn = (None if a is None else a.astype(np.float64) for a in (b, qn, kn))
    cos, sin = cos.astype(np.float64), sin.astype(np.float64)
    args = (b, qn, kn, 1e-6, cos, sin, style, NH, NKV, HS)
    outs = qkv.qkv_rope_forward_ref(z, *args)
    ws = [rng.standard_normal(o.shape) for o in outs]

    def loss():
        return sum(float((w * o).sum()) for w, o in zip(ws, qkv.qkv_rope_forward_ref(z, *args), strict=True))

    dz = qkv.qkv_rope_backward_ref(*ws, z, *args)
    n = dz.shape[-1]
    full = np.zeros_like(z)  # columns past q, k, v (the LoRA products) do not enter: gradient 0
    full[..., :n] = dz
    assert_grads_close(check_grads(loss, {"qkv": z}, {"qkv": full}, max_entries=120))


@pytest.mark.parametrize("C", [64, 96])
def test_fused_norms_match_the_reference(backend, fresh_rng, C):
    N = 7
    x, w, dy, dres = (
        f32(fresh_rng, N, C),
        1 + 0.1 * f32(fresh_rng, C),
        f32(fresh_rng, N, C),
        f32(fresh_rng, N, C),
    )
    y_ref, rstd_ref = norm.rmsnorm_fwd_out_ref(x.astype(np.float64), w, 1e-5)
    acc_ref = norm.rmsnorm_bwd_acc_ref(dy, x, rstd_ref, w, dres)
    put = backend.put

    def run(rt):
        xp = rt.xp
        y16, y32 = xp.empty((N, C + 4), xp.uint16)[:, :C], xp.empty((N, C), xp.float32)
        rstd, copy, rstd2 = xp.empty(N, xp.float32), xp.empty((N, C), xp.float32), xp.empty(N, xp.float32)
        norm.rmsnorm_fwd_out_on(rt, put(x), put(w), 1e-5, y16, rstd, copy=copy)
        norm.rmsnorm_fwd_out_on(rt, put(x), put(w), 1e-5, y32, rstd2)
        d = put(dres)
        g16 = xp.zeros((N, C + 2), xp.uint16)
        norm.rmsnorm_bwd_acc_on(rt, put(dy), put(x), rstd, put(w), d, g16)
        d0 = put(dres)
        norm.rmsnorm_bwd_acc_on(rt, put(dy), put(x), rstd, put(w), d0, None, accumulate=False)
        return y16, y32, rstd, copy, d, g16, d0

    y16, y32, rstd, copy, d, g16, d0 = backend.twice(run, "fused norms")
    for c in (
        compare("rmsnorm_fwd_out.y16", f"C {C}", bf16_values(np.asarray(y16)), y_ref, BF16_TOL),
        compare("rmsnorm_fwd_out.y32", f"C {C}", y32, y_ref, FP32_TOL),
        compare("rmsnorm_fwd_out.rstd", f"C {C}", rstd, rstd_ref, FP32_TOL),
        compare("rmsnorm_bwd_acc.dres", f"C {C}", d, acc_ref, FP32_TOL),
        compare("rmsnorm_bwd_acc.bits", f"C {C}", bf16_values(np.asarray(g16)[:, :C]), acc_ref, BF16_TOL),
        compare("rmsnorm_bwd_acc.dx", f"C {C}", d0, acc_ref - dres, FP32_TOL),
    ):
        assert c.ok, c.message
    assert np.array_equal(np.asarray(copy), x) and not np.asarray(g16)[:, C:].any()


def test_bf16_swiglu_matches_the_reference(backend, fresh_rng):
    N, F, extra = 9, 24, 5
    gu = bf16_bits(f32(fresh_rng, N, 2 * F + extra, scale=2.0))
    g, u = bf16_values(gu[:, :F]), bf16_values(gu[:, F : 2 * F])
    h_ref, cache = glu.glu_forward_ref(g, u)
    dh = f32(fresh_rng, N, F)
    dg_ref, du_ref = glu.glu_backward_ref(dh, cache)
    put = backend.put

    def run(rt):
        h = rt.xp.empty((N, F), rt.xp.uint16)
        glu.glu_fwd_bf16_on(rt, put(gu), F, h)
        dgu = rt.xp.zeros((N, 2 * F + 3), rt.xp.uint16)
        glu.glu_bwd_bf16_on(rt, put(dh), put(gu), F, dgu)
        return h, dgu

    h, dgu = backend.twice(run, "bf16 swiglu")
    dgu = np.asarray(dgu)
    for c in (
        compare("swiglu_fwd_bf16", "", bf16_values(np.asarray(h)), h_ref, BF16_TOL),
        compare("swiglu_bwd_bf16.dg", "", bf16_values(dgu[:, :F]), dg_ref, BF16_TOL),
        compare("swiglu_bwd_bf16.du", "", bf16_values(dgu[:, F : 2 * F]), du_ref, BF16_TOL),
    ):
        assert c.ok, c.message
    assert not dgu[:, 2 * F :].any()


@pytest.mark.parametrize("gclip,max_norm,poison", [(0.0, 1.0, False), (0.05, 0.5, False), (0.0, 1.0, True)])
def test_device_decided_adamw_equals_the_reference_bit_for_bit(backend, fresh_rng, gclip, max_norm, poison):
    shapes = [(4, 33), (50, 4), (3000, 2)]  # a tensor of more than one chunk among them
    params = [f32(fresh_rng, *s, scale=0.1) for s in shapes]
    grads = [f32(fresh_rng, *s) for s in shapes]
    if poison:
        grads[1][3, 1] = np.inf  # a non-finite gradient: the device skips the step
    m = [f32(fresh_rng, *s, scale=0.01) for s in shapes]
    v = [np.abs(f32(fresh_rng, *s, scale=0.01)) for s in shapes]
    steps, decay = [3, 3, 1], [True, False, True]
    hyper = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, gclip=gclip)
    P, M, Vv = ([a.copy() for a in x] for x in (params, m, v))
    ref = adamw.adamw_step_ref(P, grads, M, Vv, steps, decay, max_grad_norm=max_norm, **hyper)
    put = backend.put

    def run(rt):
        p, mm, vv = ([put(a.copy()) for a in x] for x in (params, m, v))
        # gradients as row-strided views (as the fused step's are: blocks of a GEMM's output)
        wide = [put(np.concatenate([g, np.full((g.shape[0], 3), np.nan, np.float32)], axis=1)) for g in grads]
        gv = [w[:, : g.shape[1]] for w, g in zip(wide, grads, strict=True)]
        shadows = [rt.xp.zeros((s[0], s[1] + 1), rt.xp.uint16)[:, : s[1]] for s in shapes]
        dev = adamw.DeviceAdamW(rt, list(zip(p, gv, mm, vv, shadows, strict=True)), decay)
        rt.upload(dev.coef, dev.coefficients(steps, hyper["lr"], hyper["betas"], hyper["weight_decay"]))
        stats = rt.xp.zeros(16, rt.xp.float64)
        dev.step(stats, betas=hyper["betas"], eps=hyper["eps"], gclip=gclip, max_grad_norm=max_norm)
        return p, mm, vv, shadows, stats

    p, mm, vv, shadows, stats = backend.twice(run, "device adamw")
    st = dict(zip(adamw.STATS, np.asarray(stats).tolist(), strict=False))
    assert bool(st["skipped"]) == ref.skipped
    for got, want in zip(p + mm + vv, P + M + Vv, strict=True):
        assert np.array_equal(np.asarray(got), want)
    assert np.sqrt(st["grad_sumsq"]) == pytest.approx(ref.grad_norm) if not poison else True
    if not ref.skipped:
        assert bool(st["clipped"]) == ref.clipped
        assert st["param_sumsq"] == pytest.approx(ref.param_sumsq, rel=1e-6)
        assert st["update_sumsq"] == pytest.approx(ref.update_sumsq, rel=1e-6)
    assert st["max_abs_param"] == max(float(np.abs(a).max()) for a in P)
    for sh, want in zip(shadows, P, strict=True):
        assert np.array_equal(np.asarray(sh), bf16_bits(want))  # the GEMMs' copies of the new values


def test_the_head_loss_over_padded_rows_is_the_loss_of_the_label_rows(backend, fresh_rng):
    N, C, V = 12, 16, 70
    h, w = f32(fresh_rng, N, C), f32(fresh_rng, V, C, scale=0.3)
    targets = fresh_rng.integers(0, V, N).astype(np.int32)
    targets[[1, 5, 6, 11]] = -1
    weights = np.where(targets >= 0, 1.0 / (targets >= 0).sum(), 0.0).astype(np.float32)
    loss, (ce, n), dh_ref, _ = lm_head_loss_ref(h.astype(np.float64), w.astype(np.float64), targets, weights)
    put = backend.put

    def run(rt):
        out = rt.xp.zeros(4, rt.xp.float64)
        _, _, dh, _ = lm_head_loss_on(
            rt, put(h), put(w), put(targets), put(weights), padded=True, out=out[1:3]
        )
        return out, dh

    out, dh = backend.twice(run, "padded head loss")
    out = np.asarray(out)
    assert out[0] == 0 and out[3] == 0  # only its two slots written
    assert out[1] == pytest.approx(loss, rel=1e-5) and out[2] == pytest.approx(ce, rel=1e-5) and n == 8
    c = compare("lm_head_loss(padded).dh", "", dh, dh_ref, FP32_TOL)
    assert c.ok, c.message
