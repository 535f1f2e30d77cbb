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
        router = shape("blk.0.ffn_gate_inp.weight")
        if router is not None and len(router) == 2 and router[0] != E:
            raise ModelError(
                f"{path}: blk.0.ffn_gate_inp.weight routes to {router[0]} experts, but expert_count is {E}"
            )
        F = integer("feed_forward_length", 0, _MAX_FFN, 0)
        F_exp = integer("expert_feed_forward_length", 0, _MAX_FFN, F if E else 0)
        F_shexp = integer("expert_shared_feed_forward_length", 0, _MAX_FFN, 0)
        shexp = shape("blk.0.ffn_up_shexp.weight")
        if spec.shared_expert and not F_shexp and shexp is not None:
            F_shexp = shexp[0]
        exps = shape("blk.0.ffn_up_exps.weight")
        if E and exps is not None and len(exps) == 3:
            F_exp = exps[1]
        scaling = key("rope.scaling.type", "none")
        rope_scale = 1.0
        if scaling not in ("none", "linear"):
            raise ModelError(f"{path}: RoPE scaling {_shown(scaling)} is not supported (none, linear are)")
        if scaling == "linear":
            rope_scale = real("rope.scaling.factor", 1.0, 0.0, 1e6) or 1.0
        norm_key = f"{arch}.expert_weights_norm"
        moe_renorm = bool(f.metadata[norm_key]) if norm_key in f.metadata else spec.moe_renorm
        gating = key("expert_gating_func", 1 if E else 0)
        if E and gating not in (0, 1):
            raise ModelError(
                f"{path}: expert gating function {_shown(gating)} is not supported (1, softmax, is)"
            )
        scale = real("attention.scale", 0.0, -1e6, 1e6)
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
            rope_base=real("rope.freq_base", 10000.0, 0.0, 1e12, open_lo=True),
            rope_scale=rope_scale,
            rms_eps=real("attention.layer_norm_rms_epsilon", 1e-6, 0.0, 1.0, open_lo=True),
            n_ctx_train=integer("context_length", 1, _MAX_CONTEXT, 2048),
            attn_scale=scale or HS**-0.5,
            rope=spec.rope,
            qk_norm=spec.qk_norm,
            moe_renorm=moe_renorm,
            name=str(f.get("general.name", "")),
        )
