"""The fused output head + loss's CUDA twin against `lm_head_loss_ref` (float64, both of its paths:
the head in memory and streamed by row blocks): masked rows, per-token weights, the output LoRA,
a tied embedding LoRA, dW, the KL term, Gemma 3's final soft-cap, float32 and bf16 heads, vocabulary
chunks with odd widths; and the soft-cap alone; on the emulator and on a GPU (marker gpu). The twin
returns the loss as device scalars."""

from __future__ import annotations

import numpy as np

from engine.kernels import cross_entropy as ce
from engine.kernels.linear import LoraTerm
from tests.kernels import twin
from tests.kernels.twin import BF16_TOL, FP32_TOL, Backend, Check, bf16_bits, bf16_values, compare, f32, f64


def compare_sum(op: str, case: str, out: float, ref: float, terms: float, tol: float) -> Check:
    """A sum's error against the size of its terms (`terms`: the sum of their absolute values)."""
    err = abs(out - ref)
    rel = err / terms if terms else err
    ok = bool(np.isfinite(out)) and rel <= tol
    return Check(op, case, err, err / abs(ref) if ref else err, rel, tol, int(np.isnan(out)), ok)


class RowBlocks:
    """A lazy output weight as the weight store gives one: shape, name and row_chunks() only."""

    def __init__(self, w, rows: int, put, name: str = "output.weight"):
        self.w, self.rows, self.put, self.name = w, rows, put, name
        self.shape = w.shape

    def row_chunks(self):
        V = self.w.shape[0]
        return [
            (lo, min(V, lo + self.rows), self.put(self.w[lo : lo + self.rows]))
            for lo in range(0, V, self.rows)
        ]


def cases(large: bool):
    # (N, C, V, r, options, chunk bytes)
    out = [
        (12, 16, 301, 4, ("lora",), 4 * 12 * 64),
        (12, 16, 301, 4, ("tied", "dw"), 4 * 12 * 64),
        (10, 24, 300, 4, ("lora", "kl"), 1 << 20),
        (9, 8, 77, 2, (), 1 << 20),
        (12, 16, 301, 4, ("lora", "cap"), 4 * 12 * 64),
        (10, 24, 300, 4, ("tied", "kl", "dw", "cap"), 1 << 20),
    ]
    if large:
        out += [
            (2048, 1024, 32000, 16, ("lora",), 16 << 20),
            (1024, 896, 151936, 8, ("tied", "kl"), 64 << 20),
            (1024, 640, 262144, 8, ("tied", "cap"), 64 << 20),  # Gemma 3's vocabulary
        ]
    return out


def checks(be: Backend, rng: np.random.Generator) -> list[Check]:
    out = []
    for N, C, V, r, opts, chunk in cases(be.large):
        h = f32(rng, N, C)
        w = f32(rng, V, C, scale=C**-0.5 * 2)
        targets = rng.integers(0, V, N)
        targets[rng.random(N) < 0.3] = -1  # rows without a label
        targets[0] = 0
        weights = rng.uniform(-1.0, 1.5, N).astype(np.float32)
        lora = LoraTerm(f32(rng, r, C, scale=0.3), f32(rng, V, r, scale=0.3), 0.5) if "lora" in opts else None
        tied = (
            LoraTerm(f32(rng, V, r, scale=0.3), f32(rng, C, r, scale=0.3), 0.25) if "tied" in opts else None
        )
        h_ref = h + f32(rng, N, C, scale=0.1) if "kl" in opts else None
        kl = 0.3 if "kl" in opts else 0.0
        cap = 1.5 if "cap" in opts else 0.0  # small: the logits reach where tanh bends
        need_dw = "dw" in opts
        for kind in ("f32", "bf16"):
            wk = w if kind == "f32" else bf16_bits(w)
            wr = f64(w) if kind == "f32" else bf16_values(wk)
            for layout in ("array", "blocks") if kind == "f32" or be.large else ("blocks",):
                case = f"N {N} C {C} V {V} r {r} {'+'.join(opts) or 'plain'} {kind} {layout}"
                tol = FP32_TOL if kind == "f32" else BF16_TOL

                inputs = (h, targets, weights, lora, tied, h_ref, kl, need_dw, chunk, cap)

                def run(rt, wk=wk, layout=layout, inputs=inputs):
                    h, targets, weights, lora, tied, h_ref, kl, need_dw, chunk, cap = inputs
                    W = be.put(wk) if layout == "array" else RowBlocks(wk, 128, be.put)
                    lo = None if lora is None else LoraTerm(be.put(lora.A), be.put(lora.B), lora.s)
                    ti = None if tied is None else LoraTerm(be.put(tied.A), be.put(tied.B), tied.s)
                    return ce.lm_head_loss_on(
                        rt, be.put(h), W, targets, weights, lora=lo, tied_lora=ti, need_dw=need_dw,
                        max_logits_bytes=chunk, h_ref=be.put(h_ref), w_ref=W, kl_coef=kl, cap=cap,
                    )  # fmt: skip

                loss, (ce_sum, n), dh, grads = be.twice(run, f"lm_head_loss {case}")
                Wr = wr if layout == "array" else RowBlocks(wr, 128, lambda a: a)
                lref = None if lora is None else LoraTerm(f64(lora.A), f64(lora.B), lora.s)
                tref = None if tied is None else LoraTerm(f64(tied.A), f64(tied.B), tied.s)
                loss_r, (ce_r, n_r), dh_r, g_r = ce.lm_head_loss_ref(
                    f64(h), Wr, targets, weights, lora=lref, tied_lora=tref, need_dw=need_dw,
                    h_ref=f64(h_ref), w_ref=Wr, kl_coef=kl, cap=cap,
                )  # fmt: skip
                assert n == n_r, f"{case}: {n} label rows, the reference {n_r}"
                # the loss is a sum of per-token terms with weights of both signs, which can cancel
                # to near zero: its error is measured against the size of its terms (the same sum
                # with |weights|), as the error of a vector is against its norm
                terms, _, _, _ = ce.lm_head_loss_ref(
                    f64(h), Wr, targets, np.abs(weights), lora=lref, tied_lora=tref, h_ref=f64(h_ref),
                    w_ref=Wr, kl_coef=kl, backward=False, cap=cap,
                )  # fmt: skip
                out.append(
                    compare_sum("lm_head_loss.loss", case, float(np.asarray(loss)), loss_r, terms, tol)
                )
                out.append(compare("lm_head_loss.ce_sum", case, np.asarray(ce_sum), ce_r, tol))
                out.append(compare("lm_head_loss.dh", case, dh, dh_r, tol))
                for key in ("W", "lora", "tied_lora"):
                    if g_r[key] is None:
                        assert grads[key] is None, f"{case}: grads[{key!r}] should be None"
                        continue
                    if key == "W":
                        pairs = [("", grads[key], g_r[key])]
                    else:
                        pairs = list(zip(("A", "B"), grads[key], g_r[key], strict=True))
                    for name, a, ref in pairs:
                        out.append(compare(f"lm_head_loss.d{key}{name}", case, a, ref, tol))
    return out


def test_lm_head_loss_parity(backend, fresh_rng):
    twin.assert_checks(checks(backend, fresh_rng))


def test_loss_only_and_no_labels(backend, fresh_rng):
    h = f32(fresh_rng, 6, 8)
    w = f32(fresh_rng, 40, 8)
    t = np.array([3, -1, 39, 0, -1, 7])
    wts = np.ones(6, np.float32)
    loss, (ce_sum, n), dh, _ = ce.lm_head_loss_on(
        backend.rt, backend.put(h), backend.put(w), t, wts, backward=False
    )
    loss_r, (ce_r, _), _, _ = ce.lm_head_loss_ref(f64(h), f64(w), t, wts, backward=False)
    assert n == 4 and compare("loss", "backward=False", backend.get(loss), loss_r, FP32_TOL).ok
    assert not backend.get(dh).any(), "no backward: dh stays zero"
    none = np.full(6, -1)
    loss, (ce_sum, n), dh, _ = ce.lm_head_loss_on(backend.rt, backend.put(h), backend.put(w), none, wts)
    assert n == 0 and float(backend.get(loss)) == 0.0 and not backend.get(dh).any()


def test_project_parity(backend, fresh_rng):
    """The output head alone (inference logits): float32 and bf16 heads, as an array and in blocks."""
    for N, C, V in ((7, 16, 301), (1, 24, 64)):
        h = f32(fresh_rng, N, C)
        h3 = h.reshape(1, N, C)
        w = f32(fresh_rng, V, C, scale=C**-0.5 * 2)
        for kind in ("f32", "bf16"):
            wk = w if kind == "f32" else bf16_bits(w)
            wr = f64(w) if kind == "f32" else bf16_values(wk)
            hr = f64(h) if kind == "f32" else bf16_values(bf16_bits(h))
            for layout in ("array", "blocks"):

                def run(rt, wk=wk, layout=layout, h3=h3):
                    W = backend.put(wk) if layout == "array" else RowBlocks(wk, 100, backend.put)
                    return ce.project_on(rt, backend.put(h3), W)

                z = backend.twice(run, f"project {N}x{C}x{V} {kind} {layout}")
                assert z.shape == (1, N, V) and z.dtype == np.float32
                c = compare(
                    "project", f"N {N} C {C} V {V} {kind} {layout}", z[0], ce.project_ref(hr, wr), FP32_TOL
                )
                assert c.ok, c.message


def test_softcap_parity(backend, fresh_rng):
    """The soft-cap alone (inference logits), forward and backward, odd sizes."""
    for shape in ((3, 301), (1, 7, 64)):
        z = f32(fresh_rng, *shape, scale=20.0)
        dy = f32(fresh_rng, *shape)

        def run(rt, z=z, dy=dy):
            y, cache = ce.softcap_forward_on(rt, backend.put(z), 15.0)
            return y, ce.softcap_backward_on(rt, backend.put(dy), cache)

        y, dz = backend.twice(run, f"softcap {shape}")
        yr, cr = ce.softcap_forward_ref(f64(z), 15.0)
        for c in (
            compare("softcap_forward", f"{shape}", y, yr, FP32_TOL),
            compare("softcap_backward", f"{shape}", dz, ce.softcap_backward_ref(f64(dy), cr), FP32_TOL),
        ):
            assert c.ok, c.message
