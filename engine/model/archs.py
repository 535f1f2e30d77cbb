"""The architecture table and the model hyperparameters read from GGUF metadata.

`ARCHS` states, for each supported `general.architecture`, what llama.cpp's
graph for it does differently: RoPE style, q/k normalisation, MoE weight
renormalisation, shared expert. `ModelConfig.from_gguf` turns a file's
metadata into one frozen config, or raises `ModelError` naming the key or the
architecture that is missing or unsupported. This module does not touch
tensor data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ModelError
from ..io.gguf_file import GGUFFile


@dataclass(frozen=True)
class ArchSpec:
    """What distinguishes one architecture's forward pass from another's."""

    name: str  # general.architecture
    rope: str  # "norm": rotate adjacent pairs (x[2i], x[2i+1]); "neox": rotate (x[i], x[i+d/2])
    qk_norm: str | None  # None; "head": RMSNorm over each head (HS); "full": over the whole projection
    moe_renorm: bool  # MoE: renormalise the chosen top-k softmax weights to sum to 1
    shared_expert: bool  # MoE: a dense shared expert scaled by sigmoid(h . ffn_gate_inp_shexp)
    moe_only: bool  # every layer is MoE (else dense, or MoE when expert tensors exist: llama/Mixtral)
    dense_only: bool  # never MoE
    description: str  # for people


ARCHS: dict[str, ArchSpec] = {
    "llama": ArchSpec(
        "llama",
        "norm",
        None,
        True,
        False,
        False,
        False,
        "Llama / Mistral; Mixtral when ffn_*_exps tensors are present",
    ),
    "qwen2": ArchSpec("qwen2", "neox", None, False, False, False, True, "Qwen2 / Qwen2.5 (attention biases)"),
    "qwen3": ArchSpec(
        "qwen3", "neox", "head", False, False, False, True, "Qwen3 dense (per-head q/k RMSNorm)"
    ),
    "qwen2moe": ArchSpec(
        "qwen2moe",
        "neox",
        None,
        False,
        True,
        True,
        False,
        "Qwen1.5-MoE / Qwen2-MoE (shared expert with sigmoid gate)",
    ),
    "qwen3moe": ArchSpec(
        "qwen3moe",
        "neox",
        "head",
        True,
        False,
        True,
        False,
        "Qwen3-MoE (per-head q/k RMSNorm, renormalised top-k)",
    ),
    "olmoe": ArchSpec(
        "olmoe", "neox", "full", False, False, True, False, "OLMoE (q/k RMSNorm over the whole projection)"
    ),
}


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

    @property
    def is_moe(self) -> bool:
        return self.E > 0

    @property
    def spec(self) -> ArchSpec:
        return ARCHS[self.arch]

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ModelConfig:
        """The hyperparameters of a model file; ModelError naming the key that is missing or wrong."""
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
        if arch not in ARCHS:
            raise ModelError(
                f"{path}: architecture {arch!r} is not supported; "
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

        C = int(key("embedding_length"))
        L = int(key("block_count"))
        NH = int(key("attention.head_count"))
        NKV = int(key("attention.head_count_kv", NH))
        HS = int(key("attention.key_length", C // NH if NH else 0))
        HS_v = int(key("attention.value_length", HS))
        if HS_v != HS:
            raise ModelError(f"{path}: key length {HS} != value length {HS_v} is not supported")
        if NH <= 0 or NKV <= 0 or NH % NKV:
            raise ModelError(f"{path}: head counts {NH} query / {NKV} key-value are not valid for GQA")
        E = int(key("expert_count", 0))
        K = int(key("expert_used_count", 0))
        tokens = f.get("tokenizer.ggml.tokens")
        V = int(key("vocab_size", len(tokens) if tokens else 0))
        if V == 0 and "token_embd.weight" in f.tensors:
            V = f.tensors["token_embd.weight"].shape[0]
        if spec.dense_only and E:
            raise ModelError(f"{path}: {arch} models are dense, but the file has expert_count = {E}")
        if spec.moe_only and not E:
            raise ModelError(
                f"{path}: {arch} models are Mixture-of-Experts, but expert_count is missing or 0"
            )
        if E and not 0 < K <= E:
            raise ModelError(f"{path}: expert_used_count {K} must be in 1..{E}")
        F = int(key("feed_forward_length", 0))
        F_exp = int(key("expert_feed_forward_length", F if E else 0))
        F_shexp = int(key("expert_shared_feed_forward_length", 0))
        if spec.shared_expert and not F_shexp and "blk.0.ffn_up_shexp.weight" in f.tensors:
            F_shexp = f.tensors["blk.0.ffn_up_shexp.weight"].shape[0]
        if E and "blk.0.ffn_up_exps.weight" in f.tensors:
            F_exp = f.tensors["blk.0.ffn_up_exps.weight"].shape[1]
        scaling = key("rope.scaling.type", "none")
        rope_scale = 1.0
        if scaling not in ("none", "linear"):
            raise ModelError(f"{path}: RoPE scaling {scaling!r} is not supported (none, linear are)")
        if scaling == "linear":
            rope_scale = float(key("rope.scaling.factor", 1.0)) or 1.0
        norm_key = f"{arch}.expert_weights_norm"
        moe_renorm = bool(f.metadata[norm_key]) if norm_key in f.metadata else spec.moe_renorm
        gating = key("expert_gating_func", 1 if E else 0)
        if E and int(gating) not in (0, 1):
            raise ModelError(f"{path}: expert gating function {gating} is not supported (softmax is)")
        attn_scale = float(key("attention.scale", 0.0)) or HS**-0.5
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
            n_rot=int(key("rope.dimension_count", HS)),
            rope_base=float(key("rope.freq_base", 10000.0)),
            rope_scale=rope_scale,
            rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            n_ctx_train=int(key("context_length", 2048)),
            attn_scale=attn_scale,
            rope=spec.rope,
            qk_norm=spec.qk_norm,
            moe_renorm=moe_renorm,
            name=str(f.get("general.name", "")),
        )
