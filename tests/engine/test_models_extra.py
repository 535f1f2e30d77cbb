"""DeepSeek-MoE, DeepSeek-V2/V3 (MLA), gpt-oss and Gemma 3 through the engine's one model path:
llama.cpp's logits on the golden cases (tests/data/models-extra), LoRA as llama.cpp applies it, the
KV cache, whole-model gradients against finite differences, the tensors llama.cpp does not adapt,
hostile metadata, and tiny models that overfit until greedy generation repeats the answers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.errors import ModelError
from engine.io.gguf_file import GGUFFile
from engine.io.gguf_write import write_gguf
from engine.kernels.rope import rope_angles
from engine.model.archs import ModelConfig
from engine.model.lora import LoraAdapter
from engine.model.model import Model
from engine.model.rope_scaling import yarn_angles
from engine.model.summary import summarize
from engine.model.targets import TargetSpec, lora_candidates, select_targets
from engine.testing import (
    SynthSpec,
    model_metadata,
    random_adapter,
    random_weights,
    write_adapter,
    write_model,
)
from engine.train import events as ev
from engine.train.train_model import Trainable, loss_and_grads
from engine.train.trainer import TrainConfig, Trainer
from tests.conftest import EXTRA_ARCHS, GOLDEN_EXTRA, write_chats
from tests.engine.test_forward import check_golden_logits
from tests.engine.test_grad_model import packed_batch
from tests.engine.test_trainer import CHATS, answer
from tests.gradcheck import assert_grads_close, check_grads


def _cases() -> list[dict]:
    return json.loads((GOLDEN_EXTRA / "manifest.json").read_text())["cases"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["case"])
def test_golden_logits_match_llama_cpp(case, dtype):
    check_golden_logits(GOLDEN_EXTRA, case, dtype)


def test_golden_gemma3_matches_llama_cpp_far_closer_than_its_tolerance_with_the_gelu_table():
    """The 1e-2 tolerance admits an exact GELU; emulating ggml's fp16 table (float32) lands at ~1e-3."""
    model = Model.load(GOLDEN_EXTRA / "gemma3.gguf", dtype=np.float32)
    z = np.load(GOLDEN_EXTRA / "gemma3.cases.npz")
    err = max(np.abs(model.forward(z[f"tokens_{i}"]) - z[f"logits_{i}"]).max() for i in range(3))
    assert err < 2e-3


# Tiny variants of each architecture; deepseek2-v3 switches on what DeepSeek-V3 adds to V2.
TINY = dict(C=16, L=2, NH=2, NKV=2, HS=8, F=16, F_exp=8, V=270)
VARIANTS = {
    "deepseek": dict(),
    "deepseek2": dict(HS=12, n_rot=4, HS_v=6, kv_lora_rank=8),
    "deepseek2-v3": dict(
        HS=12, n_rot=4, HS_v=6, kv_lora_rank=8, q_lora_rank=6, gating=2, n_group=2, group_used=1,
        probs_bias=True, moe_renorm=True, moe_scale=2.5,
    ),
    "gpt-oss": dict(NKV=1, swa_window=3),
    "gemma3": dict(NKV=1, swa_window=3),
}  # fmt: skip


def _tiny(tmp_path, variant: str, dtype=np.float64, **extra) -> Model:
    arch = variant.removesuffix("-v3")
    spec = SynthSpec.for_arch(arch, seed=3, **{**TINY, **VARIANTS[variant], **extra})
    return Model.load(write_model(tmp_path / f"{variant}.gguf", spec), dtype=dtype)


def _merged(model: Model, terms) -> dict[str, np.ndarray]:
    w = {n: np.asarray(a) for n, a in model.weights.items()}
    for name, t in terms.items():
        w[name] = w[name] + t.s * (t.A @ t.B.T if name == "token_embd.weight" else t.B @ t.A)
    return w


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lora_equals_merged_weights_and_kv_cache_decoding_equals_full_forward(variant, tmp_path):
    model = _tiny(tmp_path, variant)
    cfg = model.config
    targets = [c.name for c in lora_candidates(model.tensors) if c.lora_ok]
    pairs = random_adapter(model, targets, rank=3, seed=7, std=0.05)
    adapter = LoraAdapter.load(write_adapter(tmp_path / "a.gguf", cfg.arch, pairs, alpha=6.0), model)
    terms = adapter.terms(0.5)
    tokens = np.array([[1, 260, 265, 262, 269, 7, 261, 264, 263], [1, 9, 8, 7, 6, 5, 269, 262, 263]])
    with_lora = model.forward(tokens, lora=terms)
    merged = Model(cfg, _merged(model, terms), model.tensors, model.metadata, model.path, model.moe_layers)
    assert np.abs(with_lora - model.forward(tokens)).max() > 1e-2, "the adapter must change the output"
    np.testing.assert_allclose(with_lora, merged.forward(tokens), atol=1e-9, rtol=0)
    cache = model.new_cache(2, 12)
    parts = [model.forward(tokens[:, :4], cache=cache, lora=terms)]
    for t in range(4, tokens.shape[1]):
        parts.append(model.forward(tokens[:, t : t + 1], cache=cache, lora=terms))
    np.testing.assert_allclose(np.concatenate(parts, axis=1), with_lora, atol=1e-10)
    if cfg.arch in ("gpt-oss", "gemma3"):  # the window matters: a longer one changes the logits
        assert cfg.has_swa and not all(cfg.swa_layers)
        wide = _tiny(tmp_path, variant, swa_window=64)
        assert np.abs(wide.forward(tokens) - model.forward(tokens)).max() > 1e-3


def test_deepseek2_adapters_on_what_llama_cpp_does_not_adapt_change_nothing(tmp_path):
    model = _tiny(tmp_path, "deepseek2-v3")
    cands = {c.name: c for c in lora_candidates(model.tensors)}
    unadapted = [n for n, c in cands.items() if c.ignored_by_llamacpp]
    kinds = {cands[n].kind for n in unadapted}
    assert kinds == {"attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_k_b", "attn_v_b", "output"}
    assert all(not cands[n].lora_ok and "llama.cpp does not apply LoRA" in cands[n].reason for n in unadapted)
    assert cands["blk.0.attn_output.weight"].lora_ok and cands["blk.1.ffn_up_exps.weight"].lora_ok
    chosen = select_targets(model.tensors, TargetSpec(preset="all"), model.config.L, arch="deepseek2")
    assert not set(chosen) & set(unadapted) and "blk.1.ffn_gate_inp.weight" in chosen
    with pytest.raises(ModelError, match="llama.cpp does not apply LoRA"):
        select_targets(model.tensors, TargetSpec(preset="none", patterns=("attn_kv_a_mqa",)), 2)
    # an adapter file that has them anyway loads, as in llama.cpp, and leaves the logits as they are
    pairs = random_adapter(model, unadapted, rank=2, seed=1, std=0.5)
    adapter = LoraAdapter.load(write_adapter(tmp_path / "a.gguf", "deepseek2", pairs, alpha=4.0), model)
    tokens = np.array([1, 260, 265, 262, 269])
    np.testing.assert_array_equal(model.forward(tokens, lora=adapter.terms()), model.forward(tokens))
    s = summarize(model.path)
    assert s.unadapted_kinds == tuple(sorted(kinds))
    assert {k.kind for k in s.kinds if k.ignored_by_llamacpp} == {k + ".weight" for k in kinds}
    assert [x.ffn for x in s.layers] == ["dense", "moe"] and "latent attention" in s.attention_text
    assert "sigmoid" in s.ffn_text and "2 shared experts" in s.ffn_text and "groups" in s.ffn_text


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_lora_kind_and_full_weights_match_finite_differences(variant, tmp_path):
    model = _tiny(tmp_path, variant)
    cfg = model.config
    batch = packed_batch(cfg.V)
    cands = lora_candidates(model.tensors)
    router = f"blk.{cfg.L - 1}.ffn_gate_inp.weight"
    # LoRA on every kind llama.cpp adapts, experts included; in full: every vector (norms, sinks,
    # biases), the last router, and the MLA weights llama.cpp multiplies without an adapter
    targets = [c.name for c in cands if c.lora_ok and c.name != router]
    full = [c.name for c in cands if len(c.shape) == 1 or c.name.endswith(".bias") or c.ignored_by_llamacpp]
    full = [n for n in full if n != "output.weight"] + ([router] if cfg.is_moe else [])
    tr = Trainable.init(model, targets, rank=2, alpha=4.0, full=full, seed=1)
    rng = np.random.default_rng(2)
    for _, B in tr.pairs.values():
        B[...] = 0.3 * rng.standard_normal(B.shape)
    res = loss_and_grads(model, tr, batch)
    params = tr.params()
    assert set(res.grads) == set(params)
    errors = check_grads(
        lambda: loss_and_grads(model, tr, batch, backward=False).loss, params, res.grads, max_entries=5
    )
    assert_grads_close(errors, tol=1e-5)
    for name in params:  # every parameter learns, except the selection bias (it only chooses experts)
        zero = np.abs(res.grads[name]).max() == 0
        assert zero == name.endswith("exp_probs_b.bias"), f"{name}: zero gradient {zero}"
    if cfg.is_moe:  # one row per layer, zeros for the dense ones
        assert res.expert_counts.shape == (cfg.L, cfg.E)
        per_layer = res.expert_counts.sum(axis=1)
        assert per_layer.tolist() == [batch.tokens.size * cfg.K * m for m in model.moe_layers]
    if variant == "gemma3":  # layer checkpointing recomputes the sliding-window layers alike
        ck = loss_and_grads(model, tr, batch, checkpoint=True)
        assert ck.loss == res.loss
        for n in res.grads:
            np.testing.assert_array_equal(ck.grads[n], res.grads[n])


@pytest.mark.parametrize("arch", EXTRA_ARCHS)
def test_overfits_and_generation_reproduces_the_answers(arch, tmp_path):
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    small = dict(C=32, L=2, NH=2, V=300, NKV=1, HS=16, F=32, F_exp=16)
    if arch == "deepseek":
        small.update(NKV=2)
    if arch == "deepseek2":
        small.update(NKV=2, HS=12, n_rot=4, HS_v=8, kv_lora_rank=16)
    path = write_model(tmp_path / "m.gguf", SynthSpec.for_arch(arch, seed=11, **small))
    cfg = TrainConfig(
        targets=TargetSpec(preset="all"), rank=8, alpha=16, lr=2e-2, steps=40, schedule="constant", n_ctx=64,
        batch_size=3, out=str(tmp_path / "adapter.gguf"), seed=1,
    )  # fmt: skip
    got: list = []
    result = Trainer(path, data, cfg).run(got.append, lambda: False)
    steps = [e for e in got if isinstance(e, ev.Step)]
    assert isinstance(result, ev.Finished) and len(steps) == 40
    assert steps[-1].mean_ce < 0.35 * steps[0].mean_ce, (steps[0].mean_ce, steps[-1].mean_ce)
    model = Model.load(path)
    adapter = LoraAdapter.load(result.adapter_path, model)  # llama.cpp's names and layout, checked
    if model.config.is_moe:
        assert any(n.endswith("_exps.weight") for n in adapter.pairs)
    for q, a in CHATS:
        assert answer(model, adapter.terms(), q) == a
    assert answer(model, None, "hello") != "the quick brown fox"


def _config(tmp_path, arch, **md) -> ModelConfig:
    """The config of a tiny model of `arch` whose metadata keys `md` are changed (None: removed)."""
    spec = SynthSpec.for_arch(arch, **{**TINY, **VARIANTS.get(arch, {})})
    meta = model_metadata(spec)
    for k, v in md.items():
        meta.pop(f"{arch}.{k}", None)
        if v is not None:
            meta[f"{arch}.{k}"] = v
    path = tmp_path / "h.gguf"
    write_gguf(path, arch, meta, {n: (a, "F32") for n, a in random_weights(spec).items()})
    return ModelConfig.from_gguf(GGUFFile(path))


@pytest.mark.parametrize(
    "arch,md,match",
    [
        ("gemma3", {"attention.sliding_window_pattern": [True, False, True]}, "sliding_window_pattern"),
        ("gemma3", {"attention.sliding_window_pattern": "6"}, "sliding_window_pattern"),
        ("gemma3", {"final_logit_softcapping": -3.0}, "final_logit_softcapping"),
        ("gemma3", {"rope.freq_base_swa": 0.0}, "rope.freq_base_swa"),
        ("gpt-oss", {"attention.sliding_window": -1}, "attention.sliding_window"),
        ("gpt-oss", {"rope.scaling.type": "longrope"}, "rope.scaling.type"),
        (
            "gpt-oss",
            {"rope.scaling.type": "yarn", "rope.scaling.yarn_beta_fast": float("nan")},
            "yarn_beta_fast",
        ),
        ("deepseek", {"leading_dense_block_count": 9}, "leading_dense_block_count"),
        ("deepseek", {"expert_shared_count": -2}, "expert_shared_count"),
        ("deepseek2", {"attention.kv_lora_rank": 0}, "kv_lora_rank"),
        ("deepseek2", {"attention.key_length": 99}, "attention.key_length"),
        ("deepseek2", {"attention.key_length_mla": None}, "key_length_mla.*re-convert"),
        ("deepseek2", {"expert_gating_func": 7}, "expert_gating_func"),
        ("deepseek2", {"expert_group_count": 3, "expert_group_used_count": 1}, "expert_group_count"),
        ("deepseek2", {"expert_weights_scale": float("inf")}, "expert_weights_scale"),
    ],
)
def test_bad_new_metadata_is_a_one_line_model_error_naming_the_key(tmp_path, arch, md, match):
    with pytest.raises(ModelError, match=match) as info:
        _config(tmp_path, arch, **md)
    assert "\n" not in str(info.value)


def test_sliding_window_patterns_and_rope_bases(tmp_path):
    c = _config(tmp_path, "gemma3", **{"attention.sliding_window_pattern": None})
    assert c.swa_layers == (True, True) and c.rope_base_swa == 1e4 and c.rope_base == 1e6  # period 6
    c = _config(tmp_path, "gemma3", **{"attention.sliding_window_pattern": [False, True]})
    assert c.swa_layers == (False, True)
    c = _config(tmp_path, "gpt-oss", **{"attention.sliding_window": 0})
    assert not c.has_swa
    c = _config(tmp_path, "gpt-oss")
    assert c.swa_layers == (True, False) and c.rope_base_swa == c.rope_base  # period 2, one base


def test_yarn_angles_follow_ggml(tmp_path):
    pos = np.arange(0, 4000, 397)[None]
    plain = rope_angles(pos, 16, 150000.0, 1.0, None, np.float64)
    same = yarn_angles(pos, 16, 150000.0, 1.0, 4096, 32.0, 1.0, 1.0, None, np.float64)
    np.testing.assert_allclose(same[0], plain[0], atol=1e-12)
    cos, sin = yarn_angles(pos, 16, 150000.0, 32.0, 4096, 32.0, 1.0, 1.3466, None, np.float64)
    np.testing.assert_allclose(np.hypot(cos, sin), 1.3466, rtol=1e-12)  # the magnitude is mscale
    theta = np.arctan2(sin, cos)
    interp = rope_angles(pos, 16, 150000.0, 32.0, None, np.float64)
    ref_hi = np.arctan2(plain[1], plain[0])  # pair 0 (highest frequency): extrapolated, unscaled
    np.testing.assert_allclose(theta[..., 0], ref_hi[..., 0], atol=1e-9)
    ref_lo = np.arctan2(interp[1], interp[0])  # last pair (lowest frequency): interpolated, / factor
    np.testing.assert_allclose(theta[..., -1], ref_lo[..., -1], atol=1e-9)
    yarn = {
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": 32.0,
        "rope.scaling.original_context_length": 64,
    }
    c = _config(tmp_path, "gpt-oss", **yarn)
    assert c.rope_scaling == "yarn" and c.rope_mscale == pytest.approx(1 + 0.1 * np.log(32))
