"""Our GGUF models as Hugging Face transformers models with exactly the same weights: the peer that
bench/vs_peers.py and bench/gpu.py time beside our engine, and the independent reference of
tests/data/hf_reference/make_reference.py.

`build_hf_model(arch, hf_class, spec, weights, dtype)` makes the transformers config from a
`SynthSpec`'s hyperparameters and loads the GGUF-named weights (NumPy layout) strictly: RoPE rows
of llama-style files are un-permuted as llama.cpp's converter permuted them, expert stacks are
fused into transformers' `gate_up_proj`. Needs torch and transformers, which the project itself
does not depend on (`pip install torch==2.13.0 transformers peft` gives a CPU build).
"""

from __future__ import annotations

import numpy as np
import torch
import transformers

from engine.testing import SynthSpec

BOS = 1
HF_CLASS = {  # GGUF general.architecture (dense or MoE) -> transformers class
    ("llama", False): "LlamaForCausalLM",
    ("llama", True): "MixtralForCausalLM",
    ("qwen2", False): "Qwen2ForCausalLM",
    ("qwen3", False): "Qwen3ForCausalLM",
    ("qwen2moe", True): "Qwen2MoeForCausalLM",
    ("qwen3moe", True): "Qwen3MoeForCausalLM",
    ("olmoe", True): "OlmoeForCausalLM",
    ("gpt-oss", True): "GptOssForCausalLM",
    ("deepseek2", True): "DeepseekV2ForCausalLM",
}


# --- config -----------------------------------------------------------------------------------------


def hf_config(hf_class: str, spec: SynthSpec):
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
    if hf_class == "Qwen2ForCausalLM":
        cfg = transformers.Qwen2Config(intermediate_size=spec.F, use_sliding_window=False, **common)
    elif hf_class == "Qwen3ForCausalLM":
        cfg = transformers.Qwen3Config(
            intermediate_size=spec.F,
            head_dim=spec.HS,
            attention_bias=spec.qkv_bias,
            use_sliding_window=False,
            **common,
        )
    elif hf_class == "Qwen2MoeForCausalLM":
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
    elif hf_class == "OlmoeForCausalLM":
        cfg = transformers.OlmoeConfig(
            intermediate_size=spec.F_exp,
            attention_bias=spec.qkv_bias,
            clip_qkv=None,
            norm_topk_prob=False,
            output_router_logits=False,
            **moe,
            **common,
        )
    elif hf_class == "LlamaForCausalLM":
        cfg = transformers.LlamaConfig(intermediate_size=spec.F, head_dim=spec.HS, **common)
    elif hf_class == "MixtralForCausalLM":
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
    elif hf_class == "Qwen3MoeForCausalLM":
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
    elif hf_class == "GptOssForCausalLM":
        # every other layer a sliding window, from layer 0, as llama.cpp's gpt-oss graph (and the model)
        layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(spec.L)]
        common.pop("hidden_act")
        cfg = transformers.GptOssConfig(
            intermediate_size=spec.F_exp, head_dim=spec.HS, num_local_experts=spec.E,
            num_experts_per_tok=spec.K,
            sliding_window=spec.swa_window or None, layer_types=layer_types, attention_bias=True,
            router_aux_loss_coef=0.0, output_router_logits=False, **common,
        )  # fmt: skip
    elif hf_class == "DeepseekV2ForCausalLM":
        common["num_key_value_heads"] = spec.NH  # MLA: every head its own key and value
        cfg = transformers.DeepseekV2Config(
            intermediate_size=spec.F, moe_intermediate_size=spec.F_exp, n_routed_experts=spec.E,
            num_experts_per_tok=spec.K, n_shared_experts=spec.n_shexp,
            first_k_dense_replace=spec.n_dense_lead,
            kv_lora_rank=spec.kv_lora_rank, q_lora_rank=spec.q_lora_rank or None,
            qk_nope_head_dim=spec.HS - spec.n_rot, qk_rope_head_dim=spec.n_rot, v_head_dim=spec.HS_v,
            head_dim=spec.n_rot, topk_method="greedy", norm_topk_prob=False,
            routed_scaling_factor=float(spec.moe_scale or 1.0), **common,
        )  # fmt: skip
    else:
        raise ValueError(hf_class)
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


def hf_state_dict(arch: str, spec: SynthSpec, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our GGUF-named weights (NumPy layout) as the transformers model's state dict."""
    rope_norm = arch == "llama"  # GGUF llama: adjacent-pair RoPE, rows permuted by the converter
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


def build_hf_model(
    arch: str,
    hf_class: str,
    spec: SynthSpec,
    w: dict[str, np.ndarray],
    dtype: torch.dtype,
    experts: str = "eager",
):
    """The transformers model of `hf_class` with exactly the weights `w` (GGUF names, NumPy layout).

    experts: transformers' experts implementation ("eager": the per-expert loop, which runs in
    float64; "grouped_mm": torch._grouped_mm, the fast path of transformers v5)."""
    cfg = hf_config(hf_class, spec)
    cfg._attn_implementation = "sdpa"
    cfg._experts_implementation = experts
    torch.manual_seed(0)
    model = getattr(transformers, hf_class)(cfg)
    model = model.to(dtype).eval()
    sd = {
        k: torch.from_numpy(np.ascontiguousarray(v)).to(dtype)
        for k, v in hf_state_dict(arch, spec, w).items()
    }
    expected = model.state_dict()
    shapes_bad = {
        k: (tuple(sd[k].shape), tuple(expected[k].shape))
        for k in sd.keys() & expected.keys()
        if sd[k].shape != expected[k].shape
    }
    if shapes_bad:
        raise RuntimeError(f"{hf_class}: shape mismatches {shapes_bad}")
    model.load_state_dict(sd, strict=True)  # nothing left at its random initialisation
    if spec.tied:
        tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        assert tied, "lm_head is not tied to embed_tokens"
    return model
