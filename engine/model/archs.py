"""The architecture table and the model hyperparameters read from GGUF metadata.

`ARCHS` states, for each supported `general.architecture`, what llama.cpp's
graph for it does differently: RoPE style, q/k normalisation, MoE weight
renormalisation, shared expert. `ModelConfig.from_gguf` turns a file's
metadata into one frozen config, or raises `ModelError` naming the key or the
architecture that is missing or unsupported. This module does not touch
tensor data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelError
from ..io.gguf_file import GGUFFile


@dataclass(frozen=True)
class ArchSpec:
    """What distinguishes one architecture's forward pass from another's."""

    name: str  # general.architecture
    rope: str  # "norm": rotate adjacent pairs (x[2i], x[2i+1]); "neox": rotate (x[i], x[i+d/2])
    description: str  # for people
    qk_norm: str | None = None  # None; "head": RMSNorm over each head (HS); "full": over the whole projection
    moe_renorm: bool = False  # MoE: renormalise the chosen top-k softmax weights to sum to 1
    shared_expert: bool = False  # MoE: a dense shared expert scaled by sigmoid(h . ffn_gate_inp_shexp)
    moe_only: bool = False  # every layer is MoE (else dense, or MoE when expert tensors exist: llama/Mixtral)
    dense_only: bool = False  # never MoE
    attention: str = "gqa"  # "gqa": attn_q/k/v; "mla": DeepSeek-V2 multi-head latent attention
    ffn_act: str = "silu"  # dense FFN and shared experts: "silu" (SwiGLU) or "gelu" (GEGLU, ggml's fp16 GELU)
    expert_act: str = "silu"  # routed experts: "silu" or "swiglu_oai" (gpt-oss's clamped SwiGLU)
    gating: str = "softmax"  # router: "softmax", "sigmoid" or "softmax_selected" (over the chosen logits)
    shared_ungated: bool = False  # shared experts added without a gate (DeepSeek: expert_shared_count)
    dense_lead: bool = False  # the first leading_dense_block_count layers are dense (DeepSeek)
    moe_scale: bool = False  # the graph multiplies the top-k weights by expert_weights_scale
    swa_period: int = 0  # sliding-window layer period when the file has a window but no pattern (0: none)
    swa_rope_scaled: bool = True  # sliding-window layers use the file's RoPE scaling (gemma3: unscaled)
    post_norms: bool = False  # RMSNorm of the attention and FFN outputs (post_attention_norm, post_ffw_norm)
    ffn_norm: str = "ffn_norm"  # the pre-FFN norm's tensor kind (gpt-oss: post_attention_norm)
    sinks: bool = False  # per-head attention sink logits (attn_sinks)
    embd_scale: bool = False  # token embeddings multiplied by sqrt(n_embd) (in float32, as llama.cpp)
    softcap: bool = False  # final logits soft-capped by final_logit_softcapping when the file has it
    no_lora: tuple[str, ...] = ()  # tensor kinds llama.cpp's graph multiplies without their LoRA adapter


ARCHS: dict[str, ArchSpec] = {
    "llama": ArchSpec(
        "llama", "norm", "Llama / Mistral; Mixtral when ffn_*_exps tensors are present", moe_renorm=True
    ),
    "qwen2": ArchSpec("qwen2", "neox", "Qwen2 / Qwen2.5 (attention biases)", dense_only=True),
    "qwen3": ArchSpec("qwen3", "neox", "Qwen3 dense (per-head q/k RMSNorm)", qk_norm="head", dense_only=True),
    "qwen2moe": ArchSpec(
        "qwen2moe",
        "neox",
        "Qwen1.5-MoE / Qwen2-MoE (shared expert with sigmoid gate)",
        shared_expert=True,
        moe_only=True,
    ),
    "qwen3moe": ArchSpec(
        "qwen3moe",
        "neox",
        "Qwen3-MoE (per-head q/k RMSNorm, renormalised top-k)",
        qk_norm="head",
        moe_renorm=True,
        moe_only=True,
    ),
    "olmoe": ArchSpec(
        "olmoe", "neox", "OLMoE (q/k RMSNorm over the whole projection)", qk_norm="full", moe_only=True
    ),
    "deepseek": ArchSpec(
        "deepseek",
        "norm",
        "DeepSeek-MoE (dense first layers, ungated shared experts, softmax top-k without renormalisation)",
        shared_ungated=True,
        dense_lead=True,
    ),
    "deepseek2": ArchSpec(
        "deepseek2",
        "norm",
        "DeepSeek-V2/V3 (multi-head latent attention; V3: sigmoid gating, expert bias, groups)",
        attention="mla",
        shared_ungated=True,
        dense_lead=True,
        moe_scale=True,
        # llama.cpp's deepseek2 graph multiplies these with ggml_mul_mat, not build_lora_mm
        no_lora=("attn_q", "attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_k_b", "attn_v_b", "output"),
    ),
    "gpt-oss": ArchSpec(
        "gpt-oss",
        "neox",
        "gpt-oss (alternating sliding-window attention with sinks, biases, clamped SwiGLU experts)",
        moe_only=True,
        expert_act="swiglu_oai",
        gating="softmax_selected",
        swa_period=2,
        ffn_norm="post_attention_norm",
        sinks=True,
    ),
    "gemma3": ArchSpec(
        "gemma3",
        "neox",
        "Gemma 3 (sliding-window layers, pre/post norms, GEGLU, embedding scale, logit soft-capping)",
        qk_norm="head",
        dense_only=True,
        ffn_act="gelu",
        swa_period=6,
        swa_rope_scaled=False,
        post_norms=True,
        embd_scale=True,
        softcap=True,
    ),
}

# llama.cpp's expert_gating_func values (LLAMA_EXPERT_GATING_FUNC_TYPE_*); 0: the architecture's own
GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_selected"}


# Plausible ranges of hyperparameters: beyond them a file is corrupt, whatever its tensors say.
_MAX_WIDTH = 1 << 18  # embedding_length, head size (the largest models use 16-32k)
_MAX_LAYERS = 1 << 12  # block_count
_MAX_HEADS = 1 << 12  # attention.head_count
_MAX_EXPERTS = 1 << 12  # expert_count, expert_used_count
_MAX_FFN = 1 << 22  # feed-forward widths
_MAX_VOCAB = 1 << 24  # tokens
_MAX_CONTEXT = 1 << 24  # context_length (16M tokens)


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def supported_architectures() -> list[str]:
    return sorted(ARCHS)


def _one_value(path: str, key: str, value: Any) -> Any:
    """Some files store per-layer arrays; they are accepted when every layer agrees."""
    if isinstance(value, list):
        if not value:
            raise ModelError(f"{path}: metadata {key} is an empty array")
        if any(v != value[0] for v in value):
            raise ModelError(
                f"{path}: metadata {key} varies per layer ({value[:8]}...); "
                "models with layer-dependent shapes are not supported"
            )
        return value[0]
    return value


def _mla_dims(path: str, arch: str, integer: Callable[..., int], md: Mapping, NH: int) -> tuple[int, ...]:
    """(NKV, HS, HS_v, n_rot, kv_lora_rank, q_lora_rank) of a multi-head latent attention model.

    The file states the MQA view of llama.cpp's absorbed graph (head_count_kv 1, key_length =
    kv_lora_rank + rope dimensions, value_length = kv_lora_rank); the engine computes the expanded
    form, every head with its own key (key_length_mla) and value (value_length_mla).
    """
    if f"{arch}.attention.key_length_mla" not in md:
        raise ModelError(
            f"{path}: metadata {arch}.attention.key_length_mla is missing: the file predates the split "
            "attn_k_b / attn_v_b tensors; re-convert it with a current convert_hf_to_gguf.py"
        )
    R = integer("attention.kv_lora_rank", 1, _MAX_WIDTH)
    q_lora = integer("attention.q_lora_rank", 0, _MAX_WIDTH, 0)
    HS = integer("attention.key_length_mla", 2, _MAX_WIDTH)
    HS_v = integer("attention.value_length_mla", 1, _MAX_WIDTH)
    n_rot = integer("rope.dimension_count", 2, HS - 1)
    integer("attention.head_count_kv", 1, 1, 1)
    integer("attention.key_length", R + n_rot, R + n_rot, R + n_rot)
    integer("attention.value_length", R, R, R)
    return NH, HS, HS_v, n_rot, R, q_lora


def _rope_scaling(
    arch: str,
    key: Callable[..., Any],
    real: Callable[..., float],
    integer: Callable[..., int],
    mla: bool,
    path: str,
) -> dict[str, Any]:
    """RoPE scaling from the file: type, factor and YaRN's parameters (as llama.cpp reads them)."""
    scaling = key("rope.scaling.type", "none")
    out: dict[str, Any] = dict(
        type="none", factor=1.0, orig_ctx=0, beta_fast=32.0, beta_slow=1.0, mscale=1.0, kq_mscale=1.0
    )
    if scaling not in ("none", "linear", "yarn"):
        raise ModelError(
            f"{path}: metadata {arch}.rope.scaling.type is {_shown(scaling)}; "
            "none, linear and yarn are supported"
        )
    out["type"] = scaling
    if scaling == "none":
        return out
    out["factor"] = real("rope.scaling.factor", 1.0, 0.0, 1e6) or 1.0
    if scaling == "yarn":
        n_ctx = integer("context_length", 1, _MAX_CONTEXT, 2048)
        out["orig_ctx"] = integer("rope.scaling.original_context_length", 1, _MAX_CONTEXT, n_ctx)
        out["beta_fast"] = real("rope.scaling.yarn_beta_fast", 32.0, 0.0, 1e4)
        out["beta_slow"] = real("rope.scaling.yarn_beta_slow", 1.0, 0.0, 1e4)
        attn_factor = real("rope.scaling.attn_factor", 1.0, 0.0, 1e3, open_lo=True)
        log_factor = math.log(out["factor"])
        if mla:
            # llama.cpp's deepseek2 graph cancels YaRN's magnitude on q/k and scales q.k instead, by the
            # square of 1 + yarn_log_multiplier ln(factor) (HF: yarn_get_mscale(factor, mscale_all_dim))
            log_mul = real("rope.scaling.yarn_log_multiplier", 0.0, 0.0, 1e3)
            out["kq_mscale"] = attn_factor * (1.0 + log_mul * log_factor)
        else:
            out["mscale"] = attn_factor * (1.0 + 0.1 * log_factor)
    return out


def _sliding_window(
    path: str, arch: str, integer: Callable[..., int], spec: ArchSpec, L: int, md: Mapping
) -> tuple[int, tuple[bool, ...]]:
    """(window, per-layer flags) of an architecture with sliding-window layers; (0, ()) for none.

    `attention.sliding_window_pattern` absent: the architecture's period n (llama.cpp's
    set_swa_pattern: layer il slides when il % n < n - 1); a number: that period (0: every layer);
    an array of booleans: one flag per layer.
    """
    if not spec.swa_period:
        return 0, ()
    window = integer("attention.sliding_window", 0, _MAX_CONTEXT, 0)
    if not window:
        return 0, ()
    full = f"{arch}.attention.sliding_window_pattern"
    pattern = md.get(full, spec.swa_period)
    if isinstance(pattern, list):
        if len(pattern) != L or not all(isinstance(v, bool) for v in pattern):
            raise ModelError(
                f"{path}: metadata {full} is {_shown(pattern)}; expected {L} booleans (one per layer) "
                "or a period"
            )
        return window, tuple(pattern)
    if isinstance(pattern, bool) or not isinstance(pattern, int) or not 0 <= pattern <= _MAX_LAYERS:
        raise ModelError(
            f"{path}: metadata {full} is {_shown(pattern)}; expected a period 0..{_MAX_LAYERS} or "
            f"{L} booleans"
        )
    return window, tuple(pattern == 0 or i % pattern < pattern - 1 for i in range(L))


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of one model, named with the house vocabulary of dimensions."""

    arch: str  # general.architecture
    V: int  # vocabulary size
    C: int  # embedding width (n_embd)
    L: int  # layers
    NH: int  # query heads
    NKV: int  # key/value heads (grouped-query attention when < NH)
    HS: int  # head size (attention.key_length)
    F: int  # dense FFN width (0 when every layer is MoE)
    E: int  # routed experts (0 for dense models)
    K: int  # experts used per token
    F_exp: int  # width of one routed expert
    F_shexp: int  # width of the shared expert (0: none)
    n_rot: int  # RoPE dimensions (the first n_rot of each head are rotated)
    rope_base: float  # RoPE frequency base
    rope_scale: float  # linear RoPE scaling factor (positions divided by it; 1 = none)
    rms_eps: float  # RMSNorm epsilon
    n_ctx_train: int  # context length the model was trained with
    attn_scale: float  # multiplier of q.k (1/sqrt(HS) unless the file says otherwise)
    rope: str  # "norm" or "neox"
    qk_norm: str | None  # None, "head" or "full"
    moe_renorm: bool  # renormalise top-k weights
    name: str  # general.name, for display
    HS_v: int = 0  # value head size (0: HS); MLA: value_length_mla
    kv_lora_rank: int = 0  # MLA: width of the compressed KV (0: not MLA)
    q_lora_rank: int = 0  # MLA: width of the compressed query (0: one attn_q projection)
    n_dense_lead: int = 0  # leading layers with a dense FFN before the MoE layers (DeepSeek)
    moe_scale: float = 1.0  # routing weights multiplied by this (expert_weights_scale)
    gating: str = "softmax"  # router gating: "softmax", "sigmoid" or "softmax_selected"
    n_group: int = 0  # expert groups of group-limited routing (0: none)
    group_used: int = 0  # groups a token's experts may come from
    n_shexp: int = 0  # shared experts (DeepSeek: expert_shared_count; one F_shexp-wide FFN in the file)
    swa_window: int = 0  # sliding window: query t sees key s when t - s < swa_window (0: none)
    swa_layers: tuple[bool, ...] = ()  # per layer: sliding-window attention (empty: none)
    rope_base_swa: float = 0.0  # RoPE base of the sliding-window layers
    rope_scaling: str = "none"  # "none", "linear" (positions / rope_scale) or "yarn"
    rope_orig_ctx: int = 0  # YaRN: the context length the model was trained with before scaling
    yarn_beta_fast: float = 32.0  # YaRN: correction range, in rotations
    yarn_beta_slow: float = 1.0
    rope_mscale: float = 1.0  # YaRN: magnitude of cos and sin (ggml's attn_factor * mscale)
    embd_scale: float = 1.0  # token embeddings multiplied by this (gemma3: float32 sqrt(C))
    softcap: float = 0.0  # final logits soft-capped: cap * tanh(z / cap) (0: none)

    @property
    def is_moe(self) -> bool:
        return self.E > 0

    @property
    def head_v(self) -> int:
        """Value head size (HS except for multi-head latent attention)."""
        return self.HS_v or self.HS

    @property
    def has_swa(self) -> bool:
        return any(self.swa_layers)

    def is_swa(self, i: int) -> bool:
        """Whether layer i attends through the sliding window."""
        return bool(self.swa_layers) and self.swa_layers[i]

    @property
    def spec(self) -> ArchSpec:
        return ARCHS[self.arch]

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ModelConfig:
        """The hyperparameters of a model file; ModelError naming the key that is missing or wrong.

        Every value is checked against its plausible range and, where the tensor directory says
        it too (vocabulary, width, heads, experts), against the tensors' shapes: nothing is
        allocated from a number that a corrupt file made up.
        """
        try:
            return cls._from_gguf(f)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ModelError(f"{f.path}: malformed hyperparameter metadata ({exc})") from exc

    @classmethod
    def _from_gguf(cls, f: GGUFFile) -> ModelConfig:
        path = f.path
        arch = f.architecture
        if f.get("general.type") == "adapter":
            raise ModelError(f"{path}: is a LoRA adapter (general.type = adapter), not a model")
        if not isinstance(arch, str) or arch not in ARCHS:
            raise ModelError(
                f"{path}: architecture {_shown(arch)} is not supported; "
                f"supported: {', '.join(supported_architectures())}"
            )
        spec = ARCHS[arch]

        def key(name: str, default: Any = ...) -> Any:
            full = f"{arch}.{name}"
            if full in f.metadata:
                return _one_value(path, full, f.metadata[full])
            if default is ...:
                raise ModelError(f"{path}: metadata key {full!r} is missing")
            return default

        def integer(name: str, lo: int, hi: int, default: Any = ...) -> int:
            value = key(name, default)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ModelError(
                    f"{path}: metadata {arch}.{name} is {_shown(value)}; expected an integer in {lo}..{hi}"
                )
            return value

        def real(name: str, default: float, lo: float, hi: float, *, open_lo: bool = False) -> float:
            value = key(name, default)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            number = float(value) if ok else math.nan
            if not (math.isfinite(number) and (lo < number if open_lo else lo <= number) and number <= hi):
                bound = f"{'more than' if open_lo else 'at least'} {lo:g} and at most {hi:g}"
                raise ModelError(
                    f"{path}: metadata {arch}.{name} is {_shown(value)}; expected a finite number {bound}"
                )
            return number

        def shape(name: str) -> tuple[int, ...] | None:
            info = f.tensors.get(name)
            return info.shape if info is not None else None

        C = integer("embedding_length", 1, _MAX_WIDTH)
        L = integer("block_count", 1, _MAX_LAYERS)
        NH = integer("attention.head_count", 1, _MAX_HEADS)
        mla = spec.attention == "mla"
        R = q_lora = 0
        if mla:
            NKV, HS, HS_v, n_rot, R, q_lora = _mla_dims(path, arch, integer, f.metadata, NH)
        else:
            NKV = integer("attention.head_count_kv", 1, NH, NH)
            if NH % NKV:
                raise ModelError(
                    f"{path}: head counts {NH} query / {NKV} key-value are not valid for GQA "
                    f"(attention.head_count must be a multiple of attention.head_count_kv)"
                )
            if f"{arch}.attention.key_length" not in f.metadata and C % NH:
                raise ModelError(
                    f"{path}: embedding_length {C} is not a multiple of attention.head_count {NH}, and "
                    "attention.key_length (the head size) is not given"
                )
            HS = integer("attention.key_length", 1, _MAX_WIDTH, C // NH)
            HS_v = integer("attention.value_length", 1, _MAX_WIDTH, HS)
            if HS_v != HS:
                raise ModelError(f"{path}: key length {HS} != value length {HS_v} is not supported")
            n_rot = integer("rope.dimension_count", 0, HS, HS)
        if n_rot < 2 or n_rot % 2:
            raise ModelError(
                f"{path}: metadata {arch}.rope.dimension_count is {n_rot}; expected an even number "
                f"from 2 to the head size {HS}"
            )
        E = integer("expert_count", 0, _MAX_EXPERTS, 0)
        K = integer("expert_used_count", 0, _MAX_EXPERTS, 0)
        tokens = f.get("tokenizer.ggml.tokens")
        n_tokens = len(tokens) if isinstance(tokens, list) else 0
        embd = shape("token_embd.weight")
        V = integer("vocab_size", 0, _MAX_VOCAB, n_tokens)
        if V == 0 and embd is not None and len(embd) == 2:
            V = embd[0]
        if not 0 < V <= _MAX_VOCAB:
            raise ModelError(
                f"{path}: the vocabulary size is {V}; expected 1..{_MAX_VOCAB} "
                f"(from {arch}.vocab_size, tokenizer.ggml.tokens or token_embd.weight)"
            )
        if embd is not None and embd != (V, C):
            raise ModelError(
                f"{path}: token_embd.weight has shape {embd}, but the metadata says {V} tokens of "
                f"embedding_length {C}: expected shape {(V, C)}"
            )
        q = shape("blk.0.attn_q.weight")
        if q is not None and len(q) == 2 and q[0] != NH * HS:
            raise ModelError(
                f"{path}: blk.0.attn_q.weight has {q[0]} rows, but attention.head_count {NH} x head "
                f"size {HS} = {NH * HS}"
            )
        if spec.dense_only and E:
            raise ModelError(f"{path}: {arch} models are dense, but the file has expert_count = {E}")
        if spec.moe_only and not E:
            raise ModelError(
                f"{path}: {arch} models are Mixture-of-Experts, but expert_count is missing or 0"
            )
        if E and not 0 < K <= E:
            raise ModelError(f"{path}: expert_used_count {K} must be in 1..{E}")
        n_dense_lead = integer("leading_dense_block_count", 0, L, 0) if spec.dense_lead and E else 0
        router = shape(f"blk.{n_dense_lead}.ffn_gate_inp.weight")
        if router is not None and len(router) == 2 and router[0] != E:
            raise ModelError(
                f"{path}: blk.{n_dense_lead}.ffn_gate_inp.weight routes to {router[0]} experts, "
                f"but expert_count is {E}"
            )
        F = integer("feed_forward_length", 0, _MAX_FFN, 0)
        F_exp = integer("expert_feed_forward_length", 0, _MAX_FFN, F if E else 0)
        F_shexp = integer("expert_shared_feed_forward_length", 0, _MAX_FFN, 0)
        shexp = shape(f"blk.{n_dense_lead}.ffn_up_shexp.weight")
        n_shexp = 0
        if spec.shared_ungated and E:
            n_shexp = integer("expert_shared_count", 0, _MAX_EXPERTS, 0)
            F_shexp = F_exp * n_shexp
        elif spec.shared_expert and not F_shexp and shexp is not None:
            F_shexp = shexp[0]
        exps = shape(f"blk.{n_dense_lead}.ffn_up_exps.weight")
        if E and exps is not None and len(exps) == 3:
            F_exp = exps[1]
            if spec.shared_ungated:
                F_shexp = F_exp * n_shexp
        rope = _rope_scaling(arch, key, real, integer, mla, path)
        norm_key = f"{arch}.expert_weights_norm"
        moe_renorm = bool(f.metadata[norm_key]) if norm_key in f.metadata else spec.moe_renorm
        gating = spec.gating
        if spec.attention == "mla":  # llama.cpp's deepseek2 graph is the one that reads the key
            func = integer("expert_gating_func", 0, max(GATING_FUNCS), 0)
            gating = GATING_FUNCS.get(func, gating)
        elif spec.gating == "softmax":  # (gpt-oss's graph fixes its own gating and ignores the key)
            func = key("expert_gating_func", 1 if E else 0)
            if E and func not in (0, 1):
                raise ModelError(
                    f"{path}: expert gating function {_shown(func)} is not supported (1, softmax, is)"
                )
        n_group = group_used = 0
        if spec.attention == "mla" and E:
            n_group = integer("expert_group_count", 0, E, 0)
            group_used = integer("expert_group_used_count", 0, max(n_group, 0), 0)
            if n_group > 1 and (E % n_group or not group_used or group_used * (E // n_group) < K):
                raise ModelError(
                    f"{path}: metadata {arch}.expert_group_count {n_group} with expert_group_used_count "
                    f"{group_used} cannot route {K} of {E} experts; expected a divisor of {E} and enough "
                    "groups used"
                )
        moe_scale = real("expert_weights_scale", 1.0, 0.0, 1e6) if spec.moe_scale and E else 1.0
        if spec.moe_scale and E and moe_scale == 0.0:
            moe_scale = 1.0  # llama.cpp: 0 (an unset key) means no scaling
        swa_window, swa_layers = _sliding_window(path, arch, integer, spec, L, f.metadata)
        rope_base = real("rope.freq_base", 10000.0, 0.0, 1e12, open_lo=True)
        rope_base_swa = rope_base
        if swa_layers:
            default_swa = 10000.0 if arch == "gemma3" else rope_base
            rope_base_swa = real("rope.freq_base_swa", default_swa, 0.0, 1e12, open_lo=True)
        scale = real("attention.scale", 0.0, -1e6, 1e6)
        attn_scale = scale or HS**-0.5
        if arch == "gemma3" and L == 62 and not scale:  # llama.cpp: Gemma 3 27B scales by n_embd / n_head
            attn_scale = (C / NH) ** -0.5
        if mla:
            attn_scale = HS**-0.5 * rope["kq_mscale"] ** 2
        softcap = real("final_logit_softcapping", 0.0, 0.0, 1e6) if spec.softcap else 0.0
        return cls(
            arch=arch,
            V=V,
            C=C,
            L=L,
            NH=NH,
            NKV=NKV,
            HS=HS,
            F=F,
            E=E,
            K=K,
            F_exp=F_exp,
            F_shexp=F_shexp,
            n_rot=n_rot,
            rope_base=rope_base,
            rope_scale=rope["factor"],
            rms_eps=real("attention.layer_norm_rms_epsilon", 1e-6, 0.0, 1.0, open_lo=True),
            n_ctx_train=integer("context_length", 1, _MAX_CONTEXT, 2048),
            attn_scale=attn_scale,
            rope=spec.rope,
            qk_norm=spec.qk_norm,
            moe_renorm=moe_renorm,
            name=str(f.get("general.name", "")),
            HS_v=HS_v,
            kv_lora_rank=R,
            q_lora_rank=q_lora,
            n_dense_lead=n_dense_lead,
            moe_scale=moe_scale,
            gating=gating,
            n_group=n_group,
            group_used=group_used,
            n_shexp=n_shexp,
            swa_window=swa_window,
            swa_layers=swa_layers,
            rope_base_swa=rope_base_swa,
            rope_scaling=rope["type"],
            rope_orig_ctx=rope["orig_ctx"],
            yarn_beta_fast=rope["beta_fast"],
            yarn_beta_slow=rope["beta_slow"],
            rope_mscale=rope["mscale"],
            embd_scale=float(np.sqrt(np.float32(C), dtype=np.float32)) if spec.embd_scale else 1.0,
            softcap=softcap,
        )
