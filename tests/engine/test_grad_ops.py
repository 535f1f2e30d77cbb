"""Every forward op's backward against central differences in float64."""

from __future__ import annotations

import numpy as np
import pytest

from engine.model import ops
from engine.model.ops import LoraTerm
from tests.gradcheck import assert_grads_close, check_grads


def _r(rng, *shape):
    return rng.standard_normal(shape)


def test_embedding_with_lora(rng):
    V, C, r = 11, 6, 3
    W, A, B = _r(rng, V, C), _r(rng, V, r), _r(rng, C, r)
    tokens = np.array([[1, 4, 4, 0], [10, 1, 2, 4]])  # repeated ids accumulate
    R = _r(rng, 2, 4, C)

    def f():
        x, _ = ops.embedding_forward(W, tokens, LoraTerm(A, B, 0.7))
        return float((x * R).sum())

    _, cache = ops.embedding_forward(W, tokens, LoraTerm(A, B, 0.7))
    dW, dA, dB = ops.embedding_backward(R, cache, need_dw=True)
    assert_grads_close(check_grads(f, {"W": W, "A": A, "B": B}, {"W": dW, "A": dA, "B": dB}))


@pytest.mark.parametrize("shape,wshape", [((3, 5, 8), (8,)), ((2, 3, 4, 6), (6,)), ((4, 8), None)])
def test_rmsnorm(rng, shape, wshape):
    x = _r(rng, *shape)
    w = _r(rng, *wshape) if wshape else None
    R = _r(rng, *shape)

    def f():
        return float((ops.rmsnorm_forward(x, w, 1e-5)[0] * R).sum())

    dx, dw = ops.rmsnorm_backward(R, ops.rmsnorm_forward(x, w, 1e-5)[1], w)
    inputs, grads = {"x": x}, {"x": dx}
    if w is not None:
        inputs["w"], grads["w"] = w, dw
    assert_grads_close(check_grads(f, inputs, grads))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("with_lora", [False, True])
def test_linear_with_lora(rng, bias, with_lora):
    x, W = _r(rng, 2, 5, 7), _r(rng, 4, 7)
    b = _r(rng, 4) if bias else None
    A, B = _r(rng, 3, 7), _r(rng, 4, 3)
    lora = LoraTerm(A, B, 1.3) if with_lora else None
    R = _r(rng, 2, 5, 4)

    def f():
        return float((ops.linear_forward(x, W, b, LoraTerm(A, B, 1.3) if with_lora else None)[0] * R).sum())

    dx, dW, db, dA, dB = ops.linear_backward(R, ops.linear_forward(x, W, b, lora)[1], W, need_dw=True)
    inputs, grads = {"x": x, "W": W}, {"x": dx, "W": dW}
    if bias:
        inputs["b"], grads["b"] = b, db
    if with_lora:
        inputs.update(A=A, B=B)
        grads.update(A=dA, B=dB)
    assert_grads_close(check_grads(f, inputs, grads))


@pytest.mark.parametrize("style", ["norm", "neox"])
@pytest.mark.parametrize("n_rot,ff", [(8, False), (8, True), (4, False)])
def test_rope(rng, style, n_rot, ff):
    x = _r(rng, 2, 5, 3, 8)  # HS = 8; n_rot = 4 leaves half the head unrotated
    pos = np.array([[0, 1, 2, 3, 4], [0, 1, 0, 1, 2]])  # restarting positions (packed samples)
    cos, sin = ops.rope_angles(
        pos, n_rot, 100.0, 1.0, np.linspace(1, 3, n_rot // 2) if ff else None, np.float64
    )
    R = _r(rng, *x.shape)

    def f():
        return float((ops.rope_forward(x, cos, sin, style)[0] * R).sum())

    dx = ops.rope_backward(R, ops.rope_forward(x, cos, sin, style)[1])
    assert_grads_close(check_grads(f, {"x": x}, {"x": dx}))


@pytest.mark.parametrize("NH,NKV", [(4, 4), (4, 2), (6, 1)])
def test_grouped_query_attention_with_packed_mask(rng, NH, NKV):
    B, T, HS = 2, 6, 4
    q, k, v = _r(rng, B, T, NH, HS), _r(rng, B, T, NKV, HS), _r(rng, B, T, NKV, HS)
    pos = np.array([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]])
    seg = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    mask = ops.attention_mask(pos, pos, seg, seg)
    R = _r(rng, B, T, NH * HS)

    def f():
        return float((ops.attention_forward(q, k, v, mask, 0.5)[0] * R).sum())

    dq, dk, dv, _ = ops.attention_backward(R, ops.attention_forward(q, k, v, mask, 0.5)[1])
    assert_grads_close(check_grads(f, {"q": q, "k": k, "v": v}, {"q": dq, "k": dk, "v": dv}))
    # the mask keeps packed samples apart: the second sample's keys get no gradient from the first's queries
    R2 = np.zeros_like(R)
    R2[0, :3] = 1.0
    _, dk2, dv2, _ = ops.attention_backward(R2, ops.attention_forward(q, k, v, mask, 0.5)[1])
    assert np.abs(dk2[0, 3:]).max() == 0 and np.abs(dv2[0, 3:]).max() == 0


def test_swiglu(rng):
    g, u = _r(rng, 3, 7), _r(rng, 3, 7)
    R = _r(rng, 3, 7)

    def f():
        return float((ops.glu_forward(g, u)[0] * R).sum())

    dg, du = ops.glu_backward(R, ops.glu_forward(g, u)[1])
    assert_grads_close(check_grads(f, {"g": g, "u": u}, {"g": dg, "u": du}))


@pytest.mark.parametrize("renorm", [False, True])
def test_router_softmax_topk(rng, renorm):
    N, E, K = 6, 5, 2
    # well-separated logits so that finite differences never change the top-k choice
    logits = rng.permuted(np.tile(np.arange(E) * 1.5, (N, 1)), axis=1) + 0.1 * _r(rng, N, E)
    R = _r(rng, N, K)

    def f():
        return float((ops.route_forward(logits, K, renorm)[0].weights * R).sum())

    dlogits = ops.route_backward(R, ops.route_forward(logits, K, renorm)[1])
    assert_grads_close(check_grads(f, {"logits": logits}, {"logits": dlogits}))


@pytest.mark.parametrize("with_lora", [False, True])
def test_expert_dispatch_and_combine(rng, with_lora):
    N, C, F, E, K, r = 7, 6, 5, 4, 2, 2
    x = _r(rng, N, C)
    wg, wu, wd = _r(rng, E, F, C) / 2, _r(rng, E, F, C) / 2, _r(rng, E, C, F) / 2
    logits = rng.permuted(np.tile(np.arange(E) * 2.0, (N, 1)), axis=1)
    routing, _ = ops.route_forward(logits, K, True)
    weights = routing.weights.copy()  # treat the mixing weights as an input too
    L = {
        k: (_r(rng, E, r, n_in), _r(rng, E, n_out, r))
        for k, n_in, n_out in (("gate", C, F), ("up", C, F), ("down", F, C))
    }
    R = _r(rng, N, C)

    def run():
        rt = routing._replace(weights=weights)
        loras = [LoraTerm(*L[k], 0.8) for k in ("gate", "up", "down")] if with_lora else [None] * 3
        return ops.experts_forward(x, rt, wg, wu, wd, *loras)

    def f():
        return float((run()[0] * R).sum())

    dx, dweights, dW, dlora, _ = ops.experts_backward(R, run()[1], wg, wu, wd, need_dw=True)
    inputs = {"x": x, "weights": weights, "wg": wg, "wu": wu, "wd": wd}
    grads = {"x": dx, "weights": dweights, "wg": dW["gate"], "wu": dW["up"], "wd": dW["down"]}
    if with_lora:
        for k in ("gate", "up", "down"):
            inputs[f"A_{k}"], inputs[f"B_{k}"] = L[k]
            grads[f"A_{k}"], grads[f"B_{k}"] = dlora[k]
    assert_grads_close(check_grads(f, inputs, grads))


class RowBlocks:
    """An output weight read in blocks of vocabulary rows, as the weight store streams a large head."""

    def __init__(self, w: np.ndarray, block: int, name: str = "output.weight"):
        self.w, self.block, self.name = w, block, name
        self.shape, self.dtype = w.shape, w.dtype

    def row_chunks(self):
        for lo in range(0, self.shape[0], self.block):
            yield lo, min(lo + self.block, self.shape[0]), self.w[lo : lo + self.block]

    def fits_in_memory(self) -> bool:
        return False


@pytest.mark.parametrize("streamed", [False, True], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("variant", ["plain", "lora", "tied_lora", "kl"])
def test_output_projection_with_masked_weighted_cross_entropy(rng, variant, streamed):
    N, C, V, r = 9, 5, 13, 2
    h, W = _r(rng, N, C), _r(rng, V, C)
    targets = np.array([3, -1, 0, 12, 5, -1, 7, 7, 1])
    weights = np.where(
        targets >= 0, rng.uniform(-1, 1, N), 0.0
    )  # negative weights: group-relative advantages
    A, B = _r(rng, r, C), _r(rng, V, r)
    TA, TB = _r(rng, V, r), _r(rng, C, r)
    # the reference model: its own hidden states (constants here); a streamed head is the frozen base
    # tensor, so the reference shares it, an in-memory one may differ
    Wref = W if streamed else _r(rng, V, C)
    href = _r(rng, N, C)
    # blocks of 4 vocabulary rows (streamed), or 4 label rows' logits at a time (in memory)
    w_arg = RowBlocks(W, 4) if streamed else W

    def run():
        return ops.lm_head_loss(
            h,
            w_arg,
            targets,
            weights,
            need_dw=not streamed,
            max_logits_bytes=4 * V * 8,
            lora=LoraTerm(A, B, 0.6) if variant == "lora" else None,
            tied_lora=LoraTerm(TA, TB, 0.6) if variant == "tied_lora" else None,
            h_ref=href if variant == "kl" else None,
            w_ref=(RowBlocks(Wref, 4) if streamed else Wref) if variant == "kl" else None,
            kl_coef=0.3 if variant == "kl" else 0.0,
        )

    loss, (ce_sum, n), dh, g = run()
    assert n == 7
    inputs, grads = {"h": h}, {"h": dh}
    if not streamed:
        inputs["W"], grads["W"] = W, g["W"]
    if variant == "lora":
        inputs.update(A=A, B=B)
        grads.update(A=g["lora"][0], B=g["lora"][1])
    if variant == "tied_lora":
        inputs.update(TA=TA, TB=TB)
        grads.update(TA=g["tied_lora"][0], TB=g["tied_lora"][1])
    assert_grads_close(check_grads(lambda: run()[0], inputs, grads))
    assert np.abs(dh[targets < 0]).max() == 0  # masked rows get no gradient


def test_streamed_head_gives_the_in_memory_loss_and_gradients(rng):
    """Online log-sum-exp over vocabulary blocks equals the full softmax, KL term included."""
    N, C, V = 12, 6, 37
    h, W, href = _r(rng, N, C), _r(rng, V, C), _r(rng, N, C)
    targets = rng.integers(-1, V, N)
    weights = np.where(targets >= 0, rng.uniform(-1, 1, N), 0.0)
    lora = LoraTerm(_r(rng, 3, C), _r(rng, V, 3), 0.5)
    kw = dict(lora=lora, h_ref=href, kl_coef=0.7)
    a = ops.lm_head_loss(h, W, targets, weights, w_ref=W, **kw)
    b = ops.lm_head_loss(h, RowBlocks(W, 5), targets, weights, w_ref=RowBlocks(W, 5), **kw)
    assert b[0] == pytest.approx(a[0], rel=1e-12) and b[1][0] == pytest.approx(a[1][0], rel=1e-12)
    np.testing.assert_allclose(b[2], a[2], rtol=1e-10, atol=1e-12)
    for x, y in zip(a[3]["lora"], b[3]["lora"], strict=True):
        np.testing.assert_allclose(y, x, rtol=1e-10, atol=1e-12)


def test_cross_entropy_value():
    h = np.eye(3)
    W = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]))  # logits rows = W[:, c]
    loss, (ce_sum, n), _, _ = ops.lm_head_loss(h, W.T, np.array([0, 2, -1]), np.array([0.5, 0.5, 0.0]))
    assert n == 2
    assert ce_sum == pytest.approx(-np.log(0.7) - np.log(0.8))
    assert loss == pytest.approx(0.5 * (-np.log(0.7) - np.log(0.8)))
