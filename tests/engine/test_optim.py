"""AdamW against textbook references, clipping, schedules, resume, non-finite steps, accumulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.train.optim import AdamW, GradAccumulator, OptimConfig, clip_grads, lr_at

# LoRA-shaped (decayed, ndim >= 2), an expert stack (decayed) and a norm weight (not decayed).
SHAPES = {
    "blk.0.attn_q.weight.lora_a": (4, 16),
    "blk.0.attn_q.weight.lora_b": (24, 4),
    "blk.0.ffn_up_exps.weight.lora_a": (4, 2, 16),
    "blk.0.attn_norm.weight": (16,),
}
PLAIN = dict(schedule="constant", gclip=0.0, max_grad_norm=0.0)  # nothing between grads and Adam


def _params(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(dtype) for name, shape in SHAPES.items()}


def _grads(n, dtype=np.float32, seed=1, scale=1.0):
    rng = np.random.default_rng(seed)
    return [
        {name: (scale * rng.standard_normal(shape)).astype(dtype) for name, shape in SHAPES.items()}
        for _ in range(n)
    ]


def _copy(d):
    return {k: v.copy() for k, v in d.items()}


def _adamw_float64(params, grad_seq, cfg, step):
    """AdamW's loop in float64: moments from zero, the learning rate of the schedule, decay on
    ndim >= 2 params; `step(p, m, v, g, t, lr, wd) -> (p, m, v)` updates one tensor at step t."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, grads in enumerate(grad_seq, start=1):
        lr = lr_at(cfg, t - 1)
        for k, g in grads.items():
            wd = cfg.weight_decay if p[k].ndim >= 2 else 0.0
            p[k], m[k], v[k] = step(p[k], m[k], v[k], g, t, lr, wd)
    return p


def _textbook_adamw(params, grad_seq, cfg):
    """The formulas as written in Loshchilov & Hutter."""
    b1, b2 = cfg.betas

    def step(p, m, v, g, t, lr, wd):
        g = g.astype(np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        return p - lr * (m_hat / (np.sqrt(v_hat) + cfg.eps) + wd * p), m, v

    return _adamw_float64(params, grad_seq, cfg, step)


def _torch_form_adamw(params, grad_seq, cfg):
    """torch.optim.AdamW as its documentation states it (decay first, then the bias-corrected step).

    torch docs: theta <- theta - lr*wd*theta; m, v as usual; theta <- theta - lr m_hat / (sqrt(v_hat) + eps),
    computed there as step_size = lr / bc1 and denom = sqrt(v) / sqrt(bc2) + eps.
    """
    b1, b2 = cfg.betas

    def step(p, m, v, g, t, lr, wd):
        p = p * (1 - lr * wd)
        m = m + (1 - b1) * (g - m)  # torch: exp_avg.lerp_(grad, 1 - beta1)
        v = b2 * v + (1 - b2) * g * g
        denom = np.sqrt(v) / math.sqrt(1 - b2**t) + cfg.eps
        return p - (lr / (1 - b1**t)) * m / denom, m, v

    return _adamw_float64(params, grad_seq, cfg, step)


# --- AdamW against references -------------------------------------------------------------------


@pytest.mark.parametrize("dtype, atol", [(np.float32, 1e-6), (np.float64, 1e-12)])
def test_adamw_matches_textbook_and_torch_form_over_20_steps(dtype, atol):
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-7, **PLAIN)
    params = _params(dtype)
    start = _copy(params)
    grad_seq = _grads(20, dtype)
    opt = AdamW(params, cfg)
    for grads in grad_seq:
        opt.step(grads)
    textbook = _textbook_adamw(start, grad_seq, cfg)
    torch_form = _torch_form_adamw(start, grad_seq, cfg)
    for k in SHAPES:
        assert params[k].dtype == dtype
        np.testing.assert_allclose(params[k], textbook[k], rtol=0, atol=atol, err_msg=k)
        np.testing.assert_allclose(params[k], torch_form[k], rtol=0, atol=atol, err_msg=k)
        assert not np.allclose(params[k], start[k], atol=1e-3)  # it did move


def test_adamw_follows_the_schedule_step_by_step():
    cfg = OptimConfig(
        lr=1e-2,
        schedule="cosine",
        warmup_steps=3,
        total_steps=12,
        min_lr_ratio=0.1,
        **{k: v for k, v in PLAIN.items() if k != "schedule"},
    )
    params = _params(np.float64)
    start = _copy(params)
    grad_seq = _grads(12, np.float64)
    opt = AdamW(params, cfg)
    lrs = [opt.step(g).lr for g in grad_seq]
    assert lrs == [lr_at(cfg, s) for s in range(12)]
    assert lrs[0] == 0.0 and lrs[3] == pytest.approx(1e-2)
    ref = _textbook_adamw(start, grad_seq, cfg)
    for k in SHAPES:
        np.testing.assert_allclose(params[k], ref[k], rtol=0, atol=1e-12)


def test_matches_torch_adamw_when_torch_is_available():
    torch = pytest.importorskip("torch")
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, **PLAIN)
    params = _params(np.float64)
    tparams = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in params.items()}
    decayed = [t for k, t in tparams.items() if t.ndim >= 2]
    kept = [t for k, t in tparams.items() if t.ndim < 2]
    topt = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": 0.1}, {"params": kept, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
    )
    opt = AdamW(params, cfg)
    for grads in _grads(20, np.float64):
        opt.step(grads)
        for k, t in tparams.items():
            t.grad = torch.tensor(grads[k])
        topt.step()
    for k in SHAPES:
        np.testing.assert_allclose(params[k], tparams[k].detach().numpy(), rtol=0, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4])
def test_bias_correction_makes_the_first_update_lr_sized_at_any_gradient_scale(scale):
    cfg = OptimConfig(lr=1e-3, **PLAIN)
    rng = np.random.default_rng(2)
    params = {"w": np.zeros((8, 8), np.float32)}
    g = (scale * rng.choice([-1.0, 1.0], (8, 8)) * rng.uniform(0.5, 1.5, (8, 8))).astype(np.float32)
    AdamW(params, cfg).step({"w": g})
    # Without bias correction the first step would be lr * (1 - b1) / sqrt(1 - b2) ~ 3.16 lr.
    np.testing.assert_allclose(np.abs(params["w"]), cfg.lr, rtol=1e-4)
    assert np.array_equal(np.sign(params["w"]), -np.sign(g))


def test_stats_report_the_applied_update_and_resulting_param_norm():
    params = _params(np.float64)
    before = _copy(params)
    opt = AdamW(params, OptimConfig(lr=1e-2, weight_decay=0.1, **PLAIN))
    [grads] = _grads(1, np.float64)
    stats = opt.step(grads)
    delta = math.sqrt(sum(float(np.sum((params[k] - before[k]) ** 2)) for k in SHAPES))
    assert stats.update_norm == pytest.approx(delta, rel=1e-12)
    assert stats.param_norm == pytest.approx(math.sqrt(sum(float(np.sum(p**2)) for p in params.values())))
    assert stats.grad_norm == pytest.approx(math.sqrt(sum(float(np.sum(g**2)) for g in grads.values())))
    assert stats.clipped is False and opt.step_count == 1


# --- weight decay --------------------------------------------------------------------------------


def test_weight_decay_is_decoupled_and_skips_1d_params():
    lr, wd = 1e-2, 0.5
    params = _params()
    start = _copy(params)
    opt = AdamW(params, OptimConfig(lr=lr, weight_decay=wd, **PLAIN))
    zeros = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    for k in range(1, 4):
        opt.step(zeros)
        for name in SHAPES:
            expected = start[name] * (1 - lr * wd) ** k if len(SHAPES[name]) >= 2 else start[name]
            np.testing.assert_allclose(params[name], expected, rtol=1e-6, err_msg=name)
    assert all(not np.any(v) for key, v in opt.state_dict().items() if key[:2] in ("m.", "v."))
    assert [opt.decays(n) for n in SHAPES] == [True, True, True, False]


def test_weight_decay_does_not_depend_on_the_gradient():
    # Decoupled: with or without decay, the same grads give updates that differ by exactly lr*wd*p,
    # whatever the gradient's scale (an L2 term in the gradient would be renormalised by Adam).
    lr, wd = 1e-2, 0.3
    for scale in (1e-3, 1e3):
        [grads] = _grads(1, np.float64, scale=scale)
        with_wd, without = _params(np.float64), _params(np.float64)
        start = _copy(with_wd)
        AdamW(with_wd, OptimConfig(lr=lr, weight_decay=wd, **PLAIN)).step(grads)
        AdamW(without, OptimConfig(lr=lr, weight_decay=0.0, **PLAIN)).step(grads)
        for name in SHAPES:
            diff = without[name] - with_wd[name]
            expected = lr * wd * start[name] if len(SHAPES[name]) >= 2 else np.zeros_like(diff)
            np.testing.assert_allclose(diff, expected, rtol=1e-9, atol=1e-15, err_msg=name)


@pytest.mark.parametrize("min_ndim, decayed", [(0, 4), (2, 3), (3, 1), (99, 0)])
def test_decay_min_ndim_selects_the_decayed_params(min_ndim, decayed):
    params = _params()
    start = _copy(params)
    opt = AdamW(params, OptimConfig(lr=0.1, weight_decay=1.0, decay_min_ndim=min_ndim, **PLAIN))
    opt.step({k: np.zeros(s, np.float32) for k, s in SHAPES.items()})
    shrunk = [n for n in SHAPES if not np.array_equal(params[n], start[n])]
    assert shrunk == [n for n in SHAPES if len(SHAPES[n]) >= min_ndim]
    assert len(shrunk) == decayed
    for n in shrunk:
        np.testing.assert_allclose(params[n], start[n] * 0.9, rtol=1e-6)


# --- clipping ------------------------------------------------------------------------------------


def test_gclip_clips_element_wise_and_reports_the_norm_before():
    g = {"a": np.array([[-3.0, 0.5], [2.0, -0.2]], np.float32), "b": np.array([0.1, -0.4], np.float32)}
    original = _copy(g)
    out, norm, clipped = clip_grads(g, gclip=1.0, max_norm=0.0)
    np.testing.assert_array_equal(out["a"], np.array([[-1.0, 0.5], [1.0, -0.2]], np.float32))
    assert out["b"] is g["b"]  # nothing to clip there: returned as is
    assert clipped
    assert norm == pytest.approx(math.sqrt(9 + 0.25 + 4 + 0.04 + 0.01 + 0.16))
    for k in g:
        np.testing.assert_array_equal(g[k], original[k])  # inputs untouched
    out, norm2, clipped = clip_grads(g, gclip=5.0, max_norm=0.0)
    assert not clipped and norm2 == norm and all(out[k] is g[k] for k in g)


def test_global_norm_clip_scales_to_exactly_max_norm():
    [g] = _grads(1, scale=10.0)
    before = math.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in g.values()))
    out, norm, clipped = clip_grads(g, gclip=0.0, max_norm=1.0)
    after = math.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in out.values()))
    assert clipped and norm == pytest.approx(before, rel=1e-12)
    assert after == pytest.approx(1.0, rel=1e-6)
    for k in g:  # same direction
        np.testing.assert_allclose(out[k], g[k] / before, rtol=1e-6)
    out, _, clipped = clip_grads(g, gclip=0.0, max_norm=2 * before)
    assert not clipped and all(out[k] is g[k] for k in g)


def test_gclip_applies_before_the_global_norm():
    g = {"a": np.array([30.0, 4.0], np.float32)}
    out, norm, clipped = clip_grads(g, gclip=3.0, max_norm=2.5)
    assert norm == pytest.approx(math.sqrt(916.0))
    np.testing.assert_allclose(out["a"], np.array([3.0, 3.0]) * 2.5 / math.sqrt(18.0), rtol=1e-6)
    assert clipped


@pytest.mark.parametrize("gclip, max_norm", [(0.5, 0.0), (0.0, 1.0), (0.5, 1.0), (100.0, 500.0)])
def test_step_clips_as_clip_grads_does(gclip, max_norm):
    grad_seq = _grads(3, scale=2.0)
    a, b = _params(), _params()
    opt_a = AdamW(a, OptimConfig(lr=1e-2, gclip=gclip, max_grad_norm=max_norm, schedule="constant"))
    opt_b = AdamW(b, OptimConfig(lr=1e-2, **PLAIN))
    for grads in grad_seq:
        stats = opt_a.step(grads)
        pre, norm, clipped = clip_grads(grads, gclip, max_norm)
        opt_b.step(pre)
        assert stats.grad_norm == norm and stats.clipped == clipped
    assert stats.clipped == (max_norm != 500.0)
    for k in SHAPES:
        np.testing.assert_array_equal(a[k], b[k])


# --- schedules -----------------------------------------------------------------------------------


def _hf_lambda(schedule, step, W, N):
    """transformers.optimization's lr lambdas (constant / linear / cosine with warmup), copied as formulas."""
    if step < W:
        return float(step) / float(max(1, W))
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, float(N - step) / float(max(1, N - W)))
    progress = float(step - W) / float(max(1, N - W))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_schedules_match_transformers_without_floor(schedule):
    cfg = OptimConfig(lr=3e-4, schedule=schedule, warmup_steps=7, total_steps=50)
    for step in range(51):
        assert lr_at(cfg, step) == pytest.approx(3e-4 * _hf_lambda(schedule, step, 7, 50), abs=1e-15)


@pytest.mark.parametrize(
    "schedule, start, end_warmup, quarter, mid, end, beyond",
    [
        ("constant", 0.0, 1.0, 1.0, 1.0, 1.0, 1.0),
        ("linear", 0.0, 1.0, 0.1 + 0.9 * 0.75, 0.55, 0.1, 0.1),
        ("cosine", 0.0, 1.0, 0.1 + 0.45 * (1 + math.cos(math.pi / 4)), 0.55, 0.1, 0.1),
    ],
)
def test_schedule_values_with_min_lr_ratio(schedule, start, end_warmup, quarter, mid, end, beyond):
    cfg = OptimConfig(lr=2.0, schedule=schedule, warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    got = [lr_at(cfg, s) for s in (0, 5, 10, 35, 60, 110, 500)]
    want = [2.0 * x for x in (start, 0.5, end_warmup, quarter, mid, end, beyond)]
    assert got == pytest.approx(want, abs=1e-12)


def test_schedule_without_warmup_starts_at_lr_and_decays_to_zero():
    cfg = OptimConfig(lr=1.0, schedule="cosine", total_steps=4)
    assert [lr_at(cfg, s) for s in range(5)] == pytest.approx([1.0, 0.853553, 0.5, 0.146447, 0.0], abs=1e-6)
    assert lr_at(OptimConfig(lr=1.0, schedule="linear", total_steps=4), 2) == 0.5
    with pytest.raises(ValueError, match="-1"):
        lr_at(cfg, -1)


@pytest.mark.parametrize(
    "field, value",
    [("schedule", "step"), ("lr", -1.0), ("eps", 0.0), ("betas", (0.9, 1.0)), ("total_steps", 0),
     ("min_lr_ratio", 1.5), ("warmup_steps", -2), ("gclip", float("nan"))],
)  # fmt: skip
def test_bad_config_values_raise_naming_the_value(field, value):
    with pytest.raises(ValueError, match=field):
        OptimConfig(**{field: value})


# --- state ---------------------------------------------------------------------------------------


def test_resume_from_state_dict_is_bit_identical(tmp_path):
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, gclip=1.5, max_grad_norm=3.0, warmup_steps=2, total_steps=10)
    grad_seq = _grads(10, scale=2.0)
    params = _params()
    opt = AdamW(params, cfg)
    for grads in grad_seq[:5]:
        opt.step(grads)
    saved_params = _copy(params)
    np.savez(tmp_path / "opt.npz", **opt.state_dict())  # plain values survive a file round trip
    for grads in grad_seq[5:]:
        opt.step(grads)

    with np.load(tmp_path / "opt.npz") as f:
        state = dict(f)
    resumed = AdamW(saved_params, OptimConfig())  # the saved config replaces this one
    resumed.load_state_dict(state)
    assert resumed.cfg == cfg and resumed.step_count == 5
    for grads in grad_seq[5:]:
        resumed.step(grads)
    for k in SHAPES:
        assert np.array_equal(saved_params[k], params[k]), k
    final, again = opt.state_dict(), resumed.state_dict()
    assert final.keys() == again.keys()
    for key in final:
        assert np.array_equal(final[key], again[key]), key


def test_state_dict_holds_copies():
    params = _params()
    opt = AdamW(params, OptimConfig(**PLAIN))
    [g] = _grads(1)
    opt.step(g)
    state = opt.state_dict()
    m = state["m.blk.0.attn_norm.weight"].copy()
    opt.step(g)
    assert np.array_equal(state["m.blk.0.attn_norm.weight"], m)
    assert state["t.blk.0.attn_norm.weight"] == 1 and state["step_count"] == 1 and state["cfg.beta2"] == 0.999


def _state_of(shapes):
    opt = AdamW({k: np.zeros(s, np.float32) for k, s in shapes.items()}, OptimConfig(**PLAIN))
    opt.step({k: np.ones(s, np.float32) for k, s in shapes.items()})
    return opt.state_dict()


@pytest.mark.parametrize(
    "params_shapes, culprit",
    [
        ({"a": (3, 5), "b": (5,)}, "'a'"),  # shape differs
        ({"a": (3, 4), "b": (5,), "c": (2,)}, "'c'"),  # no moments saved for c
        ({"a": (3, 4)}, "'m.b'"),  # moments saved for a param this optimizer lacks
    ],
)
def test_load_state_dict_rejects_mismatches_naming_the_param(params_shapes, culprit):
    state = _state_of({"a": (3, 4), "b": (5,)})
    opt = AdamW({k: np.zeros(s, np.float32) for k, s in params_shapes.items()}, OptimConfig())
    with pytest.raises(ValueError, match=culprit):
        opt.load_state_dict(state)
    assert opt.step_count == 0 and opt.cfg == OptimConfig()  # nothing was half-loaded
    assert all(not np.any(v) for key, v in opt.state_dict().items() if key[:2] in ("m.", "v."))


def test_load_state_dict_rejects_a_foreign_or_incomplete_state():
    state = _state_of({"a": (2,)})
    opt = AdamW({"a": np.zeros(2, np.float32)}, OptimConfig())
    with pytest.raises(ValueError, match="'cfg.lr'"):
        opt.load_state_dict({k: v for k, v in state.items() if k != "cfg.lr"})
    with pytest.raises(ValueError, match="'sgd'"):
        opt.load_state_dict({**state, "kind": "sgd"})
    with pytest.raises(ValueError, match="'step_count'"):
        opt.load_state_dict({**state, "step_count": 2.5})


# --- non-finite and partial gradients ------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_gradient_changes_nothing(bad):
    params = _params()
    opt = AdamW(params, OptimConfig(lr=1e-2, weight_decay=0.1, gclip=1.0))
    grad_seq = _grads(3)
    for grads in grad_seq[:2]:
        opt.step(grads)
    before_params, before_state = _copy(params), opt.state_dict()
    poisoned = _copy(grad_seq[2])
    poisoned["blk.0.attn_q.weight.lora_b"][3, 1] = bad
    stats = opt.step(poisoned)
    assert not math.isfinite(stats.grad_norm)
    assert (math.isnan(stats.grad_norm)) == (math.isnan(bad))
    assert stats.update_norm == 0.0 and not stats.clipped
    for k in SHAPES:
        assert np.array_equal(params[k], before_params[k]), k
    after_state = opt.state_dict()
    for key in before_state:
        assert np.array_equal(before_state[key], after_state[key]), key
    assert opt.step(grad_seq[2]).grad_norm > 0 and opt.step_count == 3  # and it carries on


def test_params_without_gradients_are_left_alone_and_bias_corrected_on_their_own():
    params = _params()
    start = _copy(params)
    opt = AdamW(params, OptimConfig(lr=1e-3, weight_decay=0.1, **PLAIN))
    late = "blk.0.attn_q.weight.lora_b"
    for grads in _grads(3):
        del grads[late]
        opt.step(grads)
    assert np.array_equal(params[late], start[late])
    assert not np.any(opt.state_dict()[f"m.{late}"]) and opt.state_dict()[f"t.{late}"] == 0
    g = np.full(SHAPES[late], 5.0, np.float32)
    opt.step({late: g})
    # Its first update: bias-corrected on its own count (t = 1), so ~lr per element, plus the decay.
    np.testing.assert_allclose(start[late] - params[late], 1e-3 + 1e-3 * 0.1 * start[late], rtol=0, atol=3e-7)
    assert opt.step_count == 4


def test_unknown_or_misshaped_gradients_raise_naming_them():
    opt = AdamW({"a": np.zeros((2, 3), np.float32)}, OptimConfig())
    with pytest.raises(ValueError, match="'zz'"):
        opt.step({"zz": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="'a'"):
        opt.step({"a": np.zeros((3, 2), np.float32)})
    assert opt.step_count == 0


def test_params_must_be_writeable_float_arrays():
    frozen = np.zeros(3, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="'w'"):
        AdamW({"w": frozen}, OptimConfig())
    with pytest.raises(ValueError, match="'i'"):
        AdamW({"i": np.zeros(3, np.int32)}, OptimConfig())


# --- accumulation --------------------------------------------------------------------------------


def test_grad_accumulator_averages_micro_batches():
    micro = _grads(3)
    acc = GradAccumulator()
    for g in micro:
        acc.add(g)
    mean = acc.mean()
    assert acc.n == 3 and list(mean) == list(SHAPES)
    for k in SHAPES:
        np.testing.assert_allclose(mean[k], (micro[0][k] + micro[1][k] + micro[2][k]) / 3, rtol=1e-6)
        assert mean[k].dtype == np.float32


def test_grad_accumulator_scales_missing_names_and_reset():
    acc = GradAccumulator()
    a = {"w": np.array([1.0, 2.0], np.float32), "b": np.array([4.0], np.float32)}
    acc.add(a, scale=0.5)
    acc.add({"w": np.array([3.0, 6.0], np.float32)}, scale=2.0)
    mean = acc.mean()
    np.testing.assert_allclose(mean["w"], [(0.5 + 6.0) / 2, (1.0 + 12.0) / 2])
    np.testing.assert_allclose(mean["b"], [2.0 / 2])  # absent from the second micro-batch: zero there
    mean["w"][:] = 99.0  # a fresh array, not the running sum
    np.testing.assert_allclose(acc.mean()["w"], [3.25, 6.5])

    acc.reset()
    assert acc.n == 0
    with pytest.raises(ValueError, match="add"):
        acc.mean()
    acc.add({"w": np.array([10.0, 20.0], np.float32)})
    assert acc.mean().keys() == {"w"}
    np.testing.assert_allclose(acc.mean()["w"], [10.0, 20.0])
    with pytest.raises(ValueError, match="'w'"):
        acc.add({"w": np.zeros(3, np.float32)})
    assert acc.n == 1


# --- end to end ----------------------------------------------------------------------------------


def test_minimising_a_least_squares_quadratic_converges():
    # loss(x) = ||A x - b||^2 with a noisy b: its minimum is the least-squares solution, not zero.
    rng = np.random.default_rng(5)
    A = rng.standard_normal((40, 10))
    b = A @ rng.uniform(-2.0, 2.0, 10) + 0.1 * rng.standard_normal(40)
    x_star, *_ = np.linalg.lstsq(A, b, rcond=None)
    params = {"x": np.zeros((10, 1), np.float32)}
    opt = AdamW(params, OptimConfig(lr=0.1, weight_decay=0.0, warmup_steps=20, total_steps=1500))
    for _ in range(1500):
        x = params["x"][:, 0].astype(np.float64)
        stats = opt.step({"x": (2.0 * A.T @ (A @ x - b))[:, None]})
    np.testing.assert_allclose(params["x"][:, 0], x_star, atol=1e-4)
    assert stats.lr == pytest.approx(lr_at(opt.cfg, 1499)) and stats.lr < 1e-6
