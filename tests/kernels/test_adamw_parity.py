"""AdamW: `adamw_step_ref` equals engine.train.optim.AdamW.step bit for bit (no GPU needed), and the
multi-tensor CUDA twin equals `adamw_step_ref` bit for bit (params, m, v over several steps, with
the element-wise and the global-norm clip, decayed and undecayed tensors, sizes off 4 and off the
block chunk), on the emulator and on a GPU (marker gpu)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.kernels import adamw
from engine.train.optim import AdamW, OptimConfig, lr_at
from tests.kernels import twin
from tests.kernels.twin import Backend, Check, compare

SHAPES = {"a.lora_a": (7, 33), "a.lora_b": (4101,), "norm": (3, 4, 5), "b.lora_a": (2, 4100)}
LARGE = {"big.lora_a": (16, 4096), "big.lora_b": (14336, 16), "odd": (1000003,)}


def _cfg(**kw) -> OptimConfig:
    base = dict(lr=1e-2, weight_decay=0.1, gclip=0.05, max_grad_norm=1.0, schedule="cosine", total_steps=5)
    return OptimConfig(**{**base, **kw})


def _grads(rng, shapes, scale=0.03):
    return {k: (rng.standard_normal(s) * scale).astype(np.float32) for k, s in shapes.items()}


@pytest.mark.parametrize(
    "kw",
    [{}, {"gclip": 0.0}, {"max_grad_norm": 0.0, "gclip": 0.0}, {"weight_decay": 0.0}, {"warmup_steps": 2}],
)
def test_ref_equals_optimizer_bit_for_bit(kw, fresh_rng):
    cfg = _cfg(**kw)
    params = {k: fresh_rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    opt = AdamW({k: p.copy() for k, p in params.items()}, cfg)
    names = list(params)
    P = [params[k].copy() for k in names]
    M = [np.zeros_like(p) for p in P]
    V = [np.zeros_like(p) for p in P]
    for step in range(4):
        grads = _grads(fresh_rng, SHAPES, scale=0.03 * (step + 1))
        stats = opt.step(grads)
        res = adamw.adamw_step_ref(
            P, [grads[k] for k in names], M, V, [step + 1] * len(P), [opt.decays(k) for k in names],
            lr=lr_at(cfg, step), betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
            gclip=cfg.gclip, max_grad_norm=cfg.max_grad_norm,
        )  # fmt: skip
        for i, k in enumerate(names):
            assert np.array_equal(opt.params[k].view(np.uint32), P[i].view(np.uint32)), (step, k, "param")
            assert np.array_equal(opt._m[k].view(np.uint32), M[i].view(np.uint32)), (step, k, "m")
            assert np.array_equal(opt._v[k].view(np.uint32), V[i].view(np.uint32)), (step, k, "v")
        assert res.grad_norm == stats.grad_norm and res.clipped == stats.clipped
        assert np.sqrt(res.update_sumsq) == stats.update_norm and np.sqrt(res.param_sumsq) == stats.param_norm


def test_ref_skips_non_finite(fresh_rng):
    p = [fresh_rng.standard_normal(5).astype(np.float32)]
    before = p[0].copy()
    g = [np.array([1.0, np.inf, 0, 0, 0], np.float32)]
    res = adamw.adamw_step_ref(p, g, [np.zeros(5, np.float32)], [np.zeros(5, np.float32)], [1], [True],
                               lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, gclip=0.0,
                               max_grad_norm=1.0)  # fmt: skip
    assert res.skipped and not np.isfinite(res.grad_norm)
    np.testing.assert_array_equal(p[0], before)


def checks(be: Backend, rng: np.random.Generator) -> list[Check]:
    out = []
    shapes = {**SHAPES, **(LARGE if be.large else {})}
    names = list(shapes)
    decay = [len(shapes[k]) >= 2 for k in names]
    for kw in ({}, {"gclip": 0.0}, {"gclip": 0.0, "max_grad_norm": 0.0}, {"weight_decay": 0.0}):
        cfg = _cfg(**kw)
        P0 = [rng.standard_normal(shapes[k]).astype(np.float32) for k in names]
        M0 = [rng.standard_normal(shapes[k]).astype(np.float32) * 0.01 for k in names]
        V0 = [rng.random(shapes[k]).astype(np.float32) * 1e-4 for k in names]
        grads = _grads(rng, shapes, scale=0.05)
        G = [grads[k] for k in names]
        steps = [3, 1, 7, 2, 5, 4, 6][: len(names)]
        hyper = dict(lr=lr_at(cfg, 2), betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                     gclip=cfg.gclip, max_grad_norm=cfg.max_grad_norm)  # fmt: skip
        case = f"{len(names)} tensors " + (", ".join(f"{k}={v}" for k, v in kw.items()) or "defaults")

        def run(rt, a=(P0, M0, V0, G, steps, hyper)):
            P0, M0, V0, G, steps, hyper = a
            P, M, V = ([be.put(a) for a in arrs] for arrs in (P0, M0, V0))
            res = adamw.adamw_step_on(rt, P, [be.put(g) for g in G], M, V, steps, decay, **hyper)
            return P, M, V, dataclasses.astuple(res) if dataclasses.is_dataclass(res) else tuple(res)

        P, M, V, res = be.twice(run, f"adamw {case}")
        Pr, Mr, Vr = ([a.copy() for a in arrs] for arrs in (P0, M0, V0))
        ref = adamw.adamw_step_ref(Pr, G, Mr, Vr, steps, decay, **hyper)
        for what, got, want in (("param", P, Pr), ("m", M, Mr), ("v", V, Vr)):
            for i, k in enumerate(names):
                bad = int((got[i].view(np.uint32) != want[i].view(np.uint32)).sum())
                c = compare(f"adamw_step.{what}", f"{case}; {k}", got[i], want[i], 1e-7)
                out.append(
                    dataclasses.replace(
                        c, ok=c.ok and bad == 0, case=c.case + f"; {bad} values not bit-equal"
                    )
                )
        grad_norm, clipped, skipped, usq, psq = res
        assert not skipped and clipped == ref.clipped, (case, clipped, ref.clipped)
        out.append(compare("adamw_step.grad_norm", case, np.asarray(grad_norm), ref.grad_norm, 1e-12))
        # the reported norms: float64 sums on the device, float32 chunk dots summed in float64 on the host
        out.append(compare("adamw_step.update_sumsq", case, np.asarray(usq), ref.update_sumsq, 1e-6))
        out.append(compare("adamw_step.param_sumsq", case, np.asarray(psq), ref.param_sumsq, 1e-6))
    return out


def test_adamw_parity(backend, fresh_rng):
    twin.assert_checks(checks(backend, fresh_rng))


def test_adamw_non_finite_changes_nothing(backend, fresh_rng):
    p = fresh_rng.standard_normal(300).astype(np.float32)
    g = fresh_rng.standard_normal(300).astype(np.float32)
    g[17] = np.nan
    P, M, V = backend.put(p), backend.put(np.zeros(300, np.float32)), backend.put(np.zeros(300, np.float32))
    hyper = dict(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, gclip=0.0, max_grad_norm=1.0)
    res = adamw.adamw_step_on(backend.rt, [P], [backend.put(g)], [M], [V], [1], [True], **hyper)
    assert res.skipped and not np.isfinite(res.grad_norm)
    np.testing.assert_array_equal(backend.get(P), p)
    assert not backend.get(M).any() and not backend.get(V).any()
