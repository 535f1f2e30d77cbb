"""The ops of DeepSeek-MoE, DeepSeek-V2/V3, gpt-oss and Gemma 3: each backward against central differences
in float64, and the forward facts llama.cpp's graphs depend on (the fp16 GELU table, the SwiGLU clamp,
sinks, sliding windows, routing)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import EngineError
from engine.kernels.glu import gelu_ggml, gelu_tanh
from engine.model import ops
from engine.model.ops import LoraTerm
from tests.gradcheck import assert_grads_close, check_grads


def _r(rng, *shape):
    return rng.standard_normal(shape)


@pytest.mark.parametrize(
    "sinks,window", [(False, 0), (True, 0), (True, 3)], ids=["mla", "sinks", "sinks-swa"]
)
def test_attention_with_sinks_value_width_and_sliding_window(rng, sinks, window):
    B, T, NH, NKV, HS, HSV = 2, 6, 4, 2, 5, 3
    q, k, v = _r(rng, B, T, NH, HS), _r(rng, B, T, NKV, HS), _r(rng, B, T, NKV, HSV)
    s = _r(rng, NH) if sinks else None
    pos = np.array([[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5]])
    seg = np.array([[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]])
    mask = ops.attention_mask(pos, pos, seg, seg)
    if window:
        mask &= pos[:, :, None] - pos[:, None, :] < window
    R = _r(rng, B, T, NH * HSV)

    def f():
        return float((ops.attention_forward(q, k, v, mask, 0.4, s)[0] * R).sum())

    y, cache = ops.attention_forward(q, k, v, mask, 0.4, s)
    dq, dk, dv, ds = ops.attention_backward(R, cache)
    inputs, grads = {"q": q, "k": k, "v": v}, {"q": dq, "k": dk, "v": dv}
    if sinks:
        inputs["sinks"], grads["sinks"] = s, ds
    else:
        assert ds is None
        # without sinks it is the plain attention (value width aside)
        ref, _ = ops.attention_forward(q, k, np.pad(v, ((0, 0), (0, 0), (0, 0), (0, HS - HSV))), mask, 0.4)
        np.testing.assert_allclose(y, ref.reshape(B, T, NH, HS)[..., :HSV].reshape(B, T, -1), atol=1e-12)
    assert_grads_close(check_grads(f, inputs, grads))
    if sinks:  # a sink takes probability mass and gives nothing: the output shrinks toward 0
        plain, _ = ops.attention_forward(q, k, v, mask, 0.4, None)
        assert np.abs(y).sum() < np.abs(plain).sum()
    if window:  # query 5 of row 1 sees keys 3, 4, 5 only
        R2 = np.zeros_like(R)
        R2[1, 5] = 1.0
        _, dk2, dv2, _ = ops.attention_backward(R2, cache)
        assert np.abs(dv2[1, :3]).max() == 0 and np.abs(dv2[1, 3:]).max() > 0


def test_geglu_exact_in_float64_and_ggml_table_in_float32(rng):
    g, u, R = _r(rng, 3, 9) * 3, _r(rng, 3, 9), _r(rng, 3, 9)

    def f():
        return float((ops.glu_forward(g, u, "gelu")[0] * R).sum())

    dg, du = ops.glu_backward(R, ops.glu_forward(g, u, "gelu")[1])
    assert_grads_close(check_grads(f, {"g": g, "u": u}, {"g": dg, "u": du}))
    # float32: ggml's table, an fp16 value of gelu at the fp16-rounded input; 0 / x beyond +-10
    x = np.array([-12.0, -10.0, -3.3, -0.01, 0.0, 0.3337, 2.5, 9.99, 10.0, 15.0], np.float32)
    y = gelu_ggml(x)
    assert y.dtype == np.float32 and y[0] == 0 and y[1] == 0 and y[8] == 10 and y[9] == 15
    inner = slice(2, 8)
    assert np.array_equal(y[inner], y[inner].astype(np.float16).astype(np.float32))
    h = x[inner].astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(y[inner], gelu_tanh(h), rtol=2e-3, atol=1e-4)
    a32, _ = ops.glu_forward(g.astype(np.float32), np.ones((3, 9), np.float32), "gelu")
    assert np.array_equal(a32, gelu_ggml(g.astype(np.float32)))


def test_clamped_swiglu_of_gpt_oss(rng):
    g = np.array([[-9.0, -1.0, 0.5, 3.0, 6.5, 8.0, 20.0]])
    u = np.array([[-9.0, -6.5, 0.2, 2.0, 6.9, 7.5, -20.0]])
    y, cache = ops.glu_forward(g, u, "swiglu_oai")
    gc, uc = np.minimum(g, 7), np.clip(u, -7, 7)
    np.testing.assert_allclose(y, gc / (1 + np.exp(-1.702 * gc)) * (uc + 1), rtol=1e-14)
    assert y[0, 5] == y[0, 5] and y[0, 5] == pytest.approx(7 / (1 + np.exp(-1.702 * 7)) * 8)  # both clamped
    R = _r(rng, 1, 7)
    dg, du = ops.glu_backward(R, cache)
    assert dg[0, 5] == 0 and dg[0, 6] == 0 and du[0, 0] == 0 and du[0, 6] == 0  # no gradient past a clamp

    def f():
        return float((ops.glu_forward(g, u, "swiglu_oai")[0] * R).sum())

    assert_grads_close(check_grads(f, {"g": g, "u": u}, {"g": dg, "u": du}))


def test_mla_key_value_decompression(rng):
    B, T, R_, NH, NOPE, HSV = 2, 3, 6, 4, 5, 3
    c, kb, vb = _r(rng, B, T, R_), _r(rng, NH, R_, NOPE), _r(rng, NH, HSV, R_)
    (k, v), cache = ops.mla_kv_forward(c, kb, vb)
    np.testing.assert_allclose(k, np.einsum("btr,hrn->bthn", c, kb), atol=1e-12)
    np.testing.assert_allclose(v, np.einsum("btr,hvr->bthv", c, vb), atol=1e-12)
    Rk, Rv = _r(rng, *k.shape), _r(rng, *v.shape)

    def f():
        (k, v), _ = ops.mla_kv_forward(c, kb, vb)
        return float((k * Rk).sum() + (v * Rv).sum())

    dc, dkb, dvb = ops.mla_kv_backward(Rk, Rv, cache, kb, vb, need_dw=True)
    assert_grads_close(check_grads(f, {"c": c, "kb": kb, "vb": vb}, {"c": dc, "kb": dkb, "vb": dvb}))


def _separated_logits(rng, N, E):
    """Router logits whose top-k choices (and group choices) stay put under finite differences."""
    return np.stack([rng.permutation(E) * 0.7 for _ in range(N)]) + 0.05 * _r(rng, N, E)


@pytest.mark.parametrize(
    "gating,renorm,scale,bias,groups",
    [
        ("softmax", False, 2.0, False, 0),  # deepseek2 (V2): softmax, no renormalisation, scale
        ("sigmoid", True, 2.5, True, 2),  # V3: sigmoid, selection bias, group-limited, renormalised
        ("softmax_selected", False, 1.0, False, 0),  # gpt-oss: softmax over the chosen logits
    ],
)
def test_routing_variants(rng, gating, renorm, scale, bias, groups):
    N, E, K = 5, 8, 3
    logits = _separated_logits(rng, N, E)
    b = 0.3 * _r(rng, E) if bias else None
    R = _r(rng, N, K)
    r, cache = ops.route_forward(logits, K, renorm, gating, scale, b, groups, 1 if groups else 0)
    if gating == "softmax_selected":
        chosen = np.take_along_axis(logits, r.topk, 1)
        np.testing.assert_allclose(r.weights, ops.softmax(chosen), rtol=1e-12)
        assert (r.topk == np.argsort(-logits, axis=1)[:, :K]).all()
    if renorm:
        np.testing.assert_allclose(r.weights.sum(1), scale, rtol=1e-12)
    if groups:  # all K experts of a token come from one half of the experts (one group of two used)
        assert ((r.topk // (E // groups)) == (r.topk[:, :1] // (E // groups))).all()
        sel = 1 / (1 + np.exp(-logits)) + b
        free = np.argsort(-sel, axis=1)[:, :K]
        assert (np.sort(free, 1) != np.sort(r.topk, 1)).any(), "groups should change some choice here"
    experts_of_pairs = r.topk.reshape(-1)[r.order]
    assert experts_of_pairs.tolist() == sorted(experts_of_pairs.tolist())

    def f():
        rr, _ = ops.route_forward(logits, K, renorm, gating, scale, b, groups, 1 if groups else 0)
        assert (rr.topk == r.topk).all()
        return float((rr.weights * R).sum())

    dlogits = ops.route_backward(R, cache)
    assert_grads_close(check_grads(f, {"logits": logits}, {"logits": dlogits}))


def test_router_options_at_their_neutral_values_are_the_plain_router(rng):
    logits = _separated_logits(rng, 6, 5)
    a, _ = ops.route_forward(logits, 2, True)
    b, _ = ops.route_forward(logits, 2, True, "softmax", 1.0, np.zeros(5), 1, 1)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12)
    p = ops.softmax(logits)
    top = np.argsort(-p, axis=1)[:, :2]
    np.testing.assert_array_equal(a.topk, top)
    w = np.take_along_axis(p, top, 1)
    np.testing.assert_allclose(a.weights, w / w.sum(1, keepdims=True), rtol=1e-12)


@pytest.mark.parametrize("act", ["silu", "swiglu_oai"])
def test_experts_with_biases_lora_and_activation(rng, act):
    N, C, F, E, K, r = 7, 6, 5, 4, 2, 2
    x = _r(rng, N, C)
    routing, _ = ops.route_forward(_separated_logits(rng, N, E), K, False)
    wg, wu, wd = _r(rng, E, F, C), _r(rng, E, F, C), _r(rng, E, C, F)
    if act == "swiglu_oai":
        wg *= 3.0  # some gate values beyond the clamp at 7
    bg, bu, bd = _r(rng, E, F), _r(rng, E, F), _r(rng, E, C)
    la = [
        (_r(rng, E, r, C), _r(rng, E, F, r)),
        (_r(rng, E, r, C), _r(rng, E, F, r)),
        (_r(rng, E, r, F), _r(rng, E, C, r)),
    ]
    R = _r(rng, N, C)

    def terms():
        return [LoraTerm(A, B, 0.6) for A, B in la]

    def f():
        y, _ = ops.experts_forward(x, routing, wg, wu, wd, *terms(), b_gate=bg, b_up=bu, b_down=bd, act=act)
        return float((y * R).sum())

    y, cache = ops.experts_forward(x, routing, wg, wu, wd, *terms(), b_gate=bg, b_up=bu, b_down=bd, act=act)
    if act == "swiglu_oai":
        assert max(c.g.max() for c in cache.per_expert) > 7
    dx, dweights, dW, dl, db = ops.experts_backward(R, cache, wg, wu, wd, need_dw=True, need_db=True)
    inputs = {"x": x, "wg": wg, "wu": wu, "wd": wd, "bg": bg, "bu": bu, "bd": bd}
    grads = {"x": dx, "wg": dW["gate"], "wu": dW["up"], "wd": dW["down"], "bg": db["gate"], "bu": db["up"]}
    grads["bd"] = db["down"]
    for i, key in enumerate(("gate", "up", "down")):
        inputs[f"A{key}"], inputs[f"B{key}"] = la[i]
        grads[f"A{key}"], grads[f"B{key}"] = dl[key]
    assert_grads_close(check_grads(f, inputs, grads, max_entries=20))
    w = routing.weights.copy()

    def fw():
        rr = routing._replace(weights=w)
        return float(
            (ops.experts_forward(x, rr, wg, wu, wd, b_gate=bg, b_up=bu, b_down=bd, act=act)[0] * R).sum()
        )

    _, c2 = ops.experts_forward(x, routing, wg, wu, wd, b_gate=bg, b_up=bu, b_down=bd, act=act)
    assert_grads_close(check_grads(fw, {"w": w}, {"w": ops.experts_backward(R, c2, wg, wu, wd)[1]}))
    if act == "silu":  # without biases it is the plain MUL_MAT_ID op
        plain, _ = ops.experts_forward(x, routing, wg, wu, wd)
        np.testing.assert_allclose(ops.experts_forward(x, routing, wg, wu, wd)[0], plain, atol=1e-12)


def test_softcap_and_the_capped_head_loss(rng):
    z = _r(rng, 4, 5) * 20
    R = _r(rng, 4, 5)
    y, cache = ops.softcap_forward(z, 15.0)
    assert np.abs(y).max() < 15.0
    assert_grads_close(
        check_grads(
            lambda: float((ops.softcap_forward(z, 15.0)[0] * R).sum()),
            {"z": z},
            {"z": ops.softcap_backward(R, cache)},
        )
    )
    N, C, V, r = 6, 5, 9, 2
    h, w, h_ref = _r(rng, N, C) * 3, _r(rng, V, C), _r(rng, N, C)
    w_ref = w.copy()  # the reference model's head: a constant of the objective
    A, B = _r(rng, V, r), _r(rng, C, r)  # a tied token_embd adapter
    targets = np.array([1, -1, 4, 8, 0, 2])
    weights = rng.uniform(0.2, 1.0, N) * (targets >= 0)

    def run(backward=True):
        return ops.lm_head_loss(
            h, w, targets, weights, cap=4.0, tied_lora=LoraTerm(A, B, 0.5), need_dw=True, h_ref=h_ref,
            w_ref=w_ref, kl_coef=0.3, backward=backward,
        )  # fmt: skip

    loss, (ce_sum, n), dh, g = run()
    assert n == 5
    z = np.tanh((h @ w.T + 0.5 * (h @ B) @ A.T) / 4.0) * 4.0
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    assert ce_sum == pytest.approx(-sum(logp[i, t] for i, t in enumerate(targets) if t >= 0))
    grads = {"h": dh, "w": g["W"], "A": g["tied_lora"][0], "B": g["tied_lora"][1]}
    assert_grads_close(check_grads(lambda: run(False)[0], {"h": h, "w": w, "A": A, "B": B}, grads))


def test_every_op_has_a_cuda_twin_and_one_without_would_say_so(rng):
    table = [getattr(ops, n) for n in ops.__all__ if hasattr(getattr(ops, n), "twin_on")]
    assert len(table) >= 20 and all(op.twin_on is not None for op in table), [
        op.__name__ for op in table if op.twin_on is None
    ]
    untwinned = ops._op(ops.softcap_forward.reference, None)
    with ops.use_runtime(object()):
        with pytest.raises(EngineError, match="no CUDA version yet"):
            untwinned(_r(rng, 2, 3), 15.0)
