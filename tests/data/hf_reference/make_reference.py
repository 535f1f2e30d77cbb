"""Regenerate the Hugging Face transformers reference cases in this folder.

For each case a tiny model with random weights is made with our own generator
(`engine.io.synth`), written as `<case>.gguf`, and the same weights are loaded (strict)
into the transformers implementation of the architecture; the logits that
transformers computes for three token sequences are saved as `<case>.npz`
(`tokens_i` int32, `logits_i` float64 for i = 0..2), and `manifest.json` describes
every case. `tests/engine/test_hf_reference.py` compares `engine.model.model` against them.

This is an independent reference for architectures without llama.cpp golden data:
the GGUF side is only our writer, the computation side is transformers' modeling code.
It needs torch and transformers, which the project itself does not depend on:

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch==2.13.0 transformers numpy gguf
    /tmp/hfvenv/bin/python tests/data/hf_reference/make_reference.py

The model runs in float64 (`.double()`), with SDPA attention and the eager per-expert
loop, so that matmuls and the attention softmax are float64. transformers' modeling code
still computes some steps in float32 whatever the model dtype (RMSNorm, the RoPE angles,
the router softmax), which limits the reference to about 1e-6 relative (1e-5 absolute on
the qwen2 case, whose tied logits reach 60); the test tolerance is 1e-4. The manifest also
records how far transformers' own float32 run is from its float64 run.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from engine.io.synth import SynthSpec, random_weights, write_model  # noqa: E402

LENGTHS = (1, 9, 20)
BOS = 1


@dataclass
class Case:
    name: str
    arch: str  # GGUF general.architecture
    hf_class: str  # transformers *ForCausalLM class
    spec_overrides: dict = field(default_factory=dict)
    seed: int = 0
    what: str = ""


CASES = [
    Case(
        "qwen2",
        "qwen2",
        "Qwen2ForCausalLM",
        seed=11,
        what="q/k/v biases, tied output = token_embd, NEOX RoPE base 1e6",
    ),
    Case(
        "qwen3",
        "qwen3",
        "Qwen3ForCausalLM",
        seed=12,
        what="per-head q/k RMSNorm, head_dim 32 (NH*HS != C), NEOX RoPE base 1e6",
    ),
    Case(
        "qwen2moe",
        "qwen2moe",
        "Qwen2MoeForCausalLM",
        seed=13,
        what="q/k/v biases, 4 experts top-2 without renormalisation, "
        "shared expert scaled by sigmoid(h . ffn_gate_inp_shexp)",
    ),
    Case(
        "olmoe",
        "olmoe",
        "OlmoeForCausalLM",
        seed=14,
        what="q/k RMSNorm over the whole projection, 4 experts top-2 without renormalisation",
    ),
    Case(
        "mixtral",
        "llama",
        "MixtralForCausalLM",
        dict(E=4, K=2, F=0),
        seed=15,
        what="llama with experts (Mixtral): adjacent-pair RoPE, 4 experts top-2 renormalised",
    ),
    Case(
        "qwen3moe",
        "qwen3moe",
        "Qwen3MoeForCausalLM",
        seed=16,
        what="sanity check of the method (llama.cpp golden data exists): per-head q/k norm, "
        "renormalised top-2",
    ),
]


# --- config -----------------------------------------------------------------------------------------


def hf_config(case: Case, spec: SynthSpec):
    """The transformers config with the same hyperparameters as `spec`, optional features off."""
    common = dict(
        vocab_size=spec.V,
        hidden_size=spec.C,
        num_hidden_layers=spec.L,
        num_attention_heads=spec.NH,
        num_key_value_heads=spec.NKV,
        hidden_act="silu",
        max_position_embeddings=spec.n_ctx,
        rms_norm_eps=spec.eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(spec.rope_base)},
        tie_word_embeddings=spec.tied,
        attention_dropout=0.0,
        use_cache=False,
        pad_token_id=None,
        bos_token_id=BOS,
        eos_token_id=2,
    )
    moe = dict(num_experts=spec.E, num_experts_per_tok=spec.K, moe_intermediate_size=spec.F_exp)
    if case.hf_class == "Qwen2ForCausalLM":
        cfg = transformers.Qwen2Config(intermediate_size=spec.F, use_sliding_window=False, **common)
    elif case.hf_class == "Qwen3ForCausalLM":
        cfg = transformers.Qwen3Config(
            intermediate_size=spec.F,
            head_dim=spec.HS,
            attention_bias=spec.qkv_bias,
            use_sliding_window=False,
            **common,
        )
    elif case.hf_class == "Qwen2MoeForCausalLM":
        cfg = transformers.Qwen2MoeConfig(
            intermediate_size=spec.F_shexp,
            shared_expert_intermediate_size=spec.F_shexp,
            qkv_bias=spec.qkv_bias,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            use_sliding_window=False,
            output_router_logits=False,
            **moe,
            **common,
        )
    elif case.hf_class == "OlmoeForCausalLM":
        cfg = transformers.OlmoeConfig(
            intermediate_size=spec.F_exp,
            attention_bias=spec.qkv_bias,
            clip_qkv=None,
            norm_topk_prob=False,
            output_router_logits=False,
            **moe,
            **common,
        )
    elif case.hf_class == "MixtralForCausalLM":
        cfg = transformers.MixtralConfig(
            intermediate_size=spec.F_exp,
            head_dim=spec.HS,
            num_local_experts=spec.E,
            num_experts_per_tok=spec.K,
            router_jitter_noise=0.0,
            sliding_window=None,
            output_router_logits=False,
            **common,
        )
    elif case.hf_class == "Qwen3MoeForCausalLM":
        cfg = transformers.Qwen3MoeConfig(
            intermediate_size=spec.F_exp,
            attention_bias=spec.qkv_bias,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            use_sliding_window=False,
            output_router_logits=False,
            **moe,
            **common,
        )
        cfg.head_dim = spec.HS  # Qwen3MoeConfig takes no head_dim argument; the modules read the attribute
    else:
        raise ValueError(case.hf_class)
    return cfg


# --- weights ----------------------------------------------------------------------------------------


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's convert_hf_to_gguf `LlamaModel.permute` (rows of attn_q/attn_k, or biases).

    The converter maps HF rows (rotate-half pairs (j, j + HS/2)) to GGUF rows (adjacent pairs
    (2j, 2j + 1)) with w.reshape(n_head, 2, HS//2, ...).swapaxes(1, 2); this undoes it.
    """
    hs = w.shape[0] // n_head
    return w.reshape(n_head, hs // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `LlamaModel.permute` (HF row order -> GGUF row order)."""
    hs = w.shape[0] // n_head
    return w.reshape(n_head, 2, hs // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_state_dict(case: Case, spec: SynthSpec, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our GGUF-named weights (NumPy layout) as the transformers model's state dict."""
    rope_norm = case.arch == "llama"  # GGUF llama: adjacent-pair RoPE, rows permuted by the converter
    sd = {"model.embed_tokens.weight": w["token_embd.weight"], "model.norm.weight": w["output_norm.weight"]}
    sd["lm_head.weight"] = w["token_embd.weight"] if spec.tied else w["output.weight"]
    for i in range(spec.L):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        sd[h + "input_layernorm.weight"] = w[p + "attn_norm.weight"]
        sd[h + "post_attention_layernorm.weight"] = w[p + "ffn_norm.weight"]
        for ours, theirs, n_head in (
            ("attn_q", "q_proj", spec.NH),
            ("attn_k", "k_proj", spec.NKV),
            ("attn_v", "v_proj", 0),
            ("attn_output", "o_proj", 0),
        ):
            for suffix in ("weight", "bias"):
                name = f"{p}{ours}.{suffix}"
                if name in w:
                    a = w[name]
                    if rope_norm and n_head:
                        a = unpermute_rope_rows(a, n_head)
                        assert np.array_equal(permute_rope_rows(a, n_head), w[name])
                    sd[f"{h}self_attn.{theirs}.{suffix}"] = a
        if p + "attn_q_norm.weight" in w:
            sd[h + "self_attn.q_norm.weight"] = w[p + "attn_q_norm.weight"]
            sd[h + "self_attn.k_norm.weight"] = w[p + "attn_k_norm.weight"]
        if spec.E:
            m = h + "mlp."
            sd[m + "gate.weight"] = w[p + "ffn_gate_inp.weight"]
            # fused expert stacks: gate_up_proj (E, 2*F_exp, C) = [gate; up], down_proj (E, C, F_exp)
            sd[m + "experts.gate_up_proj"] = np.concatenate(
                [w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"]], axis=1
            )
            sd[m + "experts.down_proj"] = w[p + "ffn_down_exps.weight"]
            if spec.F_shexp:
                for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                    sd[f"{m}shared_expert.{theirs}.weight"] = w[f"{p}ffn_{ours}_shexp.weight"]
                sd[m + "shared_expert_gate.weight"] = w[p + "ffn_gate_inp_shexp.weight"][None, :]  # (1, C)
        else:
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                sd[f"{h}mlp.{theirs}.weight"] = w[f"{p}ffn_{ours}.weight"]
    return sd


def build_hf_model(case: Case, spec: SynthSpec, w: dict[str, np.ndarray], dtype: torch.dtype):
    cfg = hf_config(case, spec)
    cfg._attn_implementation = "sdpa"
    cfg._experts_implementation = "eager"  # the modeling file's per-expert loop (grouped_mm: no float64)
    torch.manual_seed(0)
    model = getattr(transformers, case.hf_class)(cfg)
    model = model.to(dtype).eval()
    sd = {
        k: torch.from_numpy(np.ascontiguousarray(v)).to(dtype)
        for k, v in hf_state_dict(case, spec, w).items()
    }
    expected = model.state_dict()
    shapes_bad = {
        k: (tuple(sd[k].shape), tuple(expected[k].shape))
        for k in sd.keys() & expected.keys()
        if sd[k].shape != expected[k].shape
    }
    if shapes_bad:
        raise RuntimeError(f"{case.name}: shape mismatches {shapes_bad}")
    model.load_state_dict(sd, strict=True)  # nothing left at its random initialisation
    if spec.tied:
        tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        assert tied, "lm_head is not tied to embed_tokens"
    return model


@torch.no_grad()
def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    ids = torch.from_numpy(tokens.astype(np.int64))[None]
    out = model(input_ids=ids, use_cache=False)
    return out.logits[0].double().numpy()


def token_sequences(V: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.concatenate([[BOS], rng.integers(3, V, n - 1)]).astype(np.int32) for n in LENGTHS]


# --- main -------------------------------------------------------------------------------------------


def make_case(case: Case) -> dict:
    spec = SynthSpec.for_arch(
        case.arch, seed=case.seed, name=f"hf-reference-{case.name}", **case.spec_overrides
    )
    weights = random_weights(spec)
    gguf_path = HERE / f"{case.name}.gguf"
    write_model(gguf_path, spec, weights)
    gguf_path.chmod(0o644)
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}  # exactly the F32 values in the file
    model64 = build_hf_model(case, spec, w64, torch.float64)
    model32 = build_hf_model(case, spec, w64, torch.float32)
    seqs = token_sequences(spec.V, 1000 + case.seed)
    arrays, max_abs, f32_vs_f64 = {}, 0.0, 0.0
    for i, toks in enumerate(seqs):
        lg = hf_logits(model64, toks)
        arrays[f"tokens_{i}"] = toks
        arrays[f"logits_{i}"] = lg
        max_abs = max(max_abs, float(np.abs(lg).max()))
        f32_vs_f64 = max(f32_vs_f64, float(np.abs(hf_logits(model32, toks) - lg).max()))
    np.savez_compressed(HERE / f"{case.name}.npz", **arrays)
    return {
        "case": case.name,
        "arch": case.arch,
        "hf_class": case.hf_class,
        "what": case.what,
        "model_file": gguf_path.name,
        "cases_file": f"{case.name}.npz",
        "spec": {k: v for k, v in asdict(spec).items() if k != "name"},
        "lengths": [len(s) for s in seqs],
        "torch_dtype": "float64",
        "attn_implementation": "sdpa",
        "experts_implementation": "eager" if spec.E else None,
        "max_abs_logit": max_abs,
        "hf_float32_vs_float64_max_abs_diff": f32_vs_f64,
        "gguf_bytes": gguf_path.stat().st_size,
    }


def main() -> None:
    entries = [make_case(c) for c in CASES]
    manifest = {
        "description": "Hugging Face transformers logits for tiny random GGUF models (engine.io.synth)",
        "generator": "tests/data/hf_reference/make_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "tolerance_max_abs": 1e-4,
        "cases": entries,
    }
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for e in entries:
        print(
            f"{e['case']:10s} {e['arch']:9s} {e['hf_class']:22s} max|logit| {e['max_abs_logit']:.3f} "
            f"hf f32-f64 {e['hf_float32_vs_float64_max_abs_diff']:.2e} {e['gguf_bytes']} bytes"
        )


if __name__ == "__main__":
    main()
