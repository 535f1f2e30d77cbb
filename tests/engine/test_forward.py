"""The forward pass: llama.cpp's logits on the golden models, and properties on every architecture."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelError
from engine.model import ops
from engine.model.lora import LoraAdapter, effective_scale
from engine.model.model import Model
from engine.testing import SynthSpec, random_adapter, random_weights, write_adapter, write_model
from tests.conftest import ARCHS, GOLDEN_MODELS, golden_cases


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", golden_cases(), ids=lambda c: c["case"])
def test_golden_logits_match_llama_cpp(case, dtype):
    check_golden_logits(GOLDEN_MODELS, case, dtype)


def check_golden_logits(folder, case: dict, dtype) -> None:
    """The model of a golden case (a manifest entry under `folder`), with its adapter if it has one, gives
    llama.cpp's logits on the case's three token sequences, within the case's tolerances."""
    model = Model.load(folder / case["model_file"], dtype=dtype)
    lora = None
    if case.get("adapter_file"):
        lora = LoraAdapter.load(folder / case["adapter_file"], model).terms(case["adapter"]["scale"])
    z = np.load(folder / case["cases_file"])
    tol = case["tolerance"]
    for i in range(3):
        logits = model.forward(z[f"tokens_{i}"], lora=lora)
        assert logits.dtype == dtype
        err = np.abs(logits - z[f"logits_{i}"]).max()
        assert err <= tol["logits_max_abs"], f"{case['case']} seq {i}: max |diff| {err:.3g}"
        if f"logits_f32deq_{i}" in z:  # MXFP4: llama.cpp rounds activations to Q8_0 for logits_*
            err = np.abs(logits - z[f"logits_f32deq_{i}"]).max()
            assert err <= tol["logits_f32deq_max_abs"], f"{case['case']} seq {i} (dequantized): {err:.3g}"


def _all_lora_targets(model: Model) -> list[str]:
    """Every tensor that can take a LoRA adapter: 2-D and 3-D weights, embedding and output included."""
    return sorted(n for n, a in model.weights.items() if a.ndim >= 2)


def _merged(model: Model, terms) -> dict[str, np.ndarray]:
    """Weights with each adapter folded in: W + s B A (per expert), or W + s A B^T for token_embd."""
    w = {n: np.asarray(a) for n, a in model.weights.items()}
    for name, t in terms.items():
        if name == "token_embd.weight":
            w[name] = w[name] + t.s * (t.A @ t.B.T)
        else:
            w[name] = w[name] + t.s * (t.B @ t.A)  # (E,) batched for expert stacks
    return w


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_on_every_tensor_kind_equals_merged_weights(arch, synth_model, tmp_path):
    model = Model.load(synth_model(arch), dtype=np.float64)
    targets = _all_lora_targets(model)
    kinds = {n.split(".", 2)[-1] if n.startswith("blk.") else n for n in targets}
    assert "attn_k.weight" in kinds and "attn_v.weight" in kinds and "token_embd.weight" in kinds
    if model.config.is_moe:
        assert {"ffn_gate_inp.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"} <= kinds
    pairs = random_adapter(model, targets, rank=3, seed=7, std=0.05)
    path = write_adapter(tmp_path / "a.gguf", arch, pairs, alpha=6.0)
    adapter = LoraAdapter.load(path, model)
    assert sorted(adapter.pairs) == targets
    terms = adapter.terms(0.5)
    assert all(t.s == pytest.approx(0.5 * 6.0 / 3) for t in terms.values())
    tokens = np.array([[1, 280, 290, 270, 300 - 1, 7, 260, 265]])
    with_lora = model.forward(tokens, lora=terms)
    merged = Model(
        model.config, _merged(model, terms), model.tensors, model.metadata, model.path, model.moe_layers
    )
    reference = merged.forward(tokens)
    base = model.forward(tokens)
    assert np.abs(with_lora - base).max() > 1e-2, "the adapter must change the output"
    np.testing.assert_allclose(with_lora, reference, atol=1e-9, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_cache_decoding_equals_full_forward(arch, synth_model):
    model = Model.load(synth_model(arch), dtype=np.float64)
    tokens = np.array([[1, 270, 280, 290, 5, 6, 7, 8, 9], [1, 9, 8, 7, 6, 5, 300 - 1, 262, 263]])
    full = model.forward(tokens)
    cache = model.new_cache(2, 16)
    parts = [model.forward(tokens[:, :5], cache=cache)]
    for t in range(5, tokens.shape[1]):
        parts.append(model.forward(tokens[:, t : t + 1], cache=cache))
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, atol=1e-10)
    assert cache.length == tokens.shape[1]


@pytest.mark.parametrize("arch", ["llama", "qwen2moe"])
def test_batch_rows_are_independent(arch, synth_model):
    model = Model.load(synth_model(arch), dtype=np.float64)
    tokens = np.array([[1, 270, 280, 290, 5, 6], [1, 9, 8, 7, 6, 5]])
    both = model.forward(tokens)
    for b in range(2):
        np.testing.assert_allclose(both[b], model.forward(tokens[b]), atol=1e-10)


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q5_1", "Q4_K", "Q6_K"])
def test_quantized_model_computes_with_exactly_dequantized_weights(qtype, tmp_path):
    spec = SynthSpec.for_arch("llama", C=256, F=512, HS=64, NH=4, NKV=2, qtype=qtype)
    qmodel = Model.load(write_model(tmp_path / "q.gguf", spec), dtype=np.float64)
    assert qmodel.tensors["blk.0.attn_q.weight"].qtype == qtype
    assert qmodel.tensors["blk.0.attn_norm.weight"].qtype == "F32"
    # the same weights written as F32 after dequantization must give the same logits
    deq = {n: np.asarray(qmodel.weights[n]) for n in qmodel.weights}
    fmodel = Model.load(
        write_model(
            tmp_path / "f.gguf",
            spec.__class__(**{**spec.__dict__, "qtype": "F32"}),
            weights={n: a.astype(np.float32) for n, a in deq.items()},
        ),
        dtype=np.float64,
    )
    tokens = np.array([1, 270, 280, 290, 5, 6, 7])
    np.testing.assert_allclose(qmodel.forward(tokens), fmodel.forward(tokens), atol=1e-6)
    # and stay close to the unquantized random weights
    exact = Model.load(
        write_model(tmp_path / "x.gguf", spec.__class__(**{**spec.__dict__, "qtype": "F32"})),
        dtype=np.float64,
    )
    ref = exact.forward(tokens)
    drift = np.linalg.norm(qmodel.forward(tokens) - ref) / np.linalg.norm(ref)
    assert drift < {"F16": 0.002, "BF16": 0.01, "Q8_0": 0.02, "Q6_K": 0.08, "Q5_1": 0.15}.get(qtype, 0.3), (
        drift
    )


def test_rope_freq_factors_of_one_change_nothing_and_others_do(tmp_path):
    spec = SynthSpec.for_arch("llama")
    w = random_weights(spec)
    plain = Model.load(write_model(tmp_path / "a.gguf", spec, weights=w), dtype=np.float64)
    w["rope_freqs.weight"] = np.ones(spec.HS // 2, np.float32)
    ones = Model.load(write_model(tmp_path / "b.gguf", spec, weights=w), dtype=np.float64)
    w["rope_freqs.weight"] = np.linspace(1, 8, spec.HS // 2).astype(np.float32)
    scaled = Model.load(write_model(tmp_path / "c.gguf", spec, weights=w), dtype=np.float64)
    tokens = np.array([1, 270, 280, 290, 5, 6])
    np.testing.assert_allclose(ones.forward(tokens), plain.forward(tokens), atol=1e-12)
    assert np.abs(scaled.forward(tokens) - plain.forward(tokens)).max() > 1e-3


def test_rope_angles_formula():
    pos = np.array([[0, 1, 5]])
    cos, sin = ops.rope_angles(
        pos, n_rot=8, base=100.0, scale=2.0, freq_factors=np.array([1, 2, 1, 1.0]), dtype=np.float64
    )
    theta = (5 / 2.0) * 100.0 ** (-2 * 1 / 8) / 2.0  # position 5, pair 1, factor 2
    assert cos[0, 2, 1] == pytest.approx(np.cos(theta)) and sin[0, 2, 1] == pytest.approx(np.sin(theta))


@pytest.mark.parametrize("style", ["norm", "neox"])
def test_rope_rotates_the_documented_pairs(style):
    x = np.arange(8, dtype=np.float64).reshape(1, 1, 1, 8) + 1
    cos = np.zeros((1, 1, 4))
    sin = np.ones((1, 1, 4))  # a rotation by 90 degrees: (a, b) -> (-b, a)
    y, _ = ops.rope_forward(x, cos, sin, style)
    if style == "norm":
        assert y[0, 0, 0, :2].tolist() == [-2, 1]  # pair (x0, x1)
    else:
        assert [y[0, 0, 0, 0], y[0, 0, 0, 4]] == [-5, 1]  # pair (x0, x4)


def test_moe_routing_sorts_tokens_by_expert_once():
    logits = np.array([[3.0, 1.0, 2.0, 0.0], [0.0, 0.5, 0.1, 4.0], [1.0, 1.1, 5.0, 0.0]])
    r, _ = ops.route_forward(logits, K=2, renorm=True)
    assert r.topk.tolist() == [[0, 2], [3, 1], [2, 1]]
    np.testing.assert_allclose(r.weights.sum(axis=1), 1.0)
    experts_of_pairs = r.topk.reshape(-1)[r.order]
    assert experts_of_pairs.tolist() == sorted(experts_of_pairs.tolist())
    assert r.offsets.tolist() == [0, 1, 3, 5, 6]
    r2, _ = ops.route_forward(logits, K=2, renorm=False)
    np.testing.assert_allclose(r2.weights, np.take_along_axis(ops.softmax(logits), r2.topk, axis=1))


def test_token_out_of_range_is_model_error(synth_model):
    model = Model.load(synth_model("llama"))
    with pytest.raises(ModelError, match="out of range"):
        model.forward(np.array([1, 5, 300]))


def test_adapter_for_another_model_is_rejected(synth_model, tmp_path):
    model = Model.load(synth_model("llama"))
    other = Model.load(synth_model("qwen3"))
    pairs = random_adapter(other, ["blk.0.attn_q.weight"], rank=2)
    path = write_adapter(tmp_path / "a.gguf", "qwen3", pairs, alpha=4.0)
    with pytest.raises(ModelError, match="architecture 'qwen3'"):
        LoraAdapter.load(path, model)
    # same architecture, wrong width
    pairs = {"blk.0.attn_q.weight": (np.zeros((2, 32), np.float32), np.zeros((64, 2), np.float32))}
    path = write_adapter(tmp_path / "b.gguf", "llama", pairs, alpha=4.0)
    with pytest.raises(ModelError, match="transposed"):
        LoraAdapter.load(path, model)


def test_alpha_zero_means_no_alpha_over_r():
    assert effective_scale(0.0, 8, 0.5) == 0.5
    assert effective_scale(16.0, 8, 0.5) == 1.0
