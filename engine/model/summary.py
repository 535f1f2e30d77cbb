"""What a model file holds, without loading its weights: the facts `tune-engine inspect` and the
studio's Model page show (architecture, sizes, tensor kinds with types and bytes and what each is
for, the layout of every layer: dense or MoE, sliding-window or global attention, tokenizer, chat
template, and the tensors llama.cpp applies no LoRA to). It validates the file as `Model.load`
would, so a summary that succeeds means the model will load; it does not dequantize anything.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import asdict, dataclass

from ..io.gguf_file import GGUFFile
from .archs import ModelConfig
from .model import check_tensors
from .targets import llamacpp_unadapted_kinds


@dataclass(frozen=True)
class TensorKind:
    """All tensors of one kind (blk.N.<kind>.weight over the layers, or a global tensor)."""

    kind: str  # e.g. "attn_q.weight", "ffn_up_exps.weight", "token_embd.weight"
    count: int  # how many tensors (layers)
    types: dict[str, int]  # ggml type -> count
    shape: tuple[int, ...]  # NumPy shape of one tensor
    n_params: int  # elements, all tensors of the kind
    n_bytes: int  # bytes on disk, all tensors of the kind
    role: str = ""  # what the tensor is for, in words ("MLA key decompression (per head)", ...)
    ignored_by_llamacpp: bool = False  # llama.cpp's graph applies no LoRA adapter to it


@dataclass(frozen=True)
class LayerLayout:
    """What one layer computes, for the layer-by-layer views (Targets grid, expert heatmap)."""

    index: int
    ffn: str  # "dense" or "moe"
    attention: str  # "global" or "sliding"
    window: int  # a sliding layer's window in tokens (0: global)
    rope_base: float  # the layer's RoPE frequency base


@dataclass(frozen=True)
class ModelSummary:
    path: str
    file_bytes: int
    config: ModelConfig
    n_params: int
    n_tensors: int
    kinds: tuple[TensorKind, ...]
    file_type: str  # the dominant matmul weight type, e.g. "Q4_K"
    tokenizer_model: str  # tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    tokenizer_pre: str  # tokenizer.ggml.pre
    vocab_size: int
    has_chat_template: bool
    layers: tuple[LayerLayout, ...] = ()  # per layer: dense or MoE, sliding or global
    attention_text: str = ""  # the attention layout in words (heads, MLA ranks, sinks, window)
    ffn_text: str = ""  # the feed-forward layout in words (experts, routing, shared experts, dense layers)
    features: tuple[str, ...] = ()  # further facts of the architecture, one line each
    unadapted_kinds: tuple[str, ...] = ()  # tensor kinds llama.cpp applies no LoRA to (not offered)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config"] = asdict(self.config)
        d["moe"] = self.config.is_moe
        return d


_ROLES = {
    "attn_q": "attention query",
    "attn_k": "attention key",
    "attn_v": "attention value",
    "attn_output": "attention output",
    "attn_q_a": "MLA query compression",
    "attn_q_a_norm": "MLA compressed-query norm",
    "attn_q_b": "MLA query decompression",
    "attn_kv_a_mqa": "MLA KV compression and the shared RoPE key",
    "attn_kv_a_norm": "MLA compressed-KV norm",
    "attn_k_b": "MLA key decompression (per head)",
    "attn_v_b": "MLA value decompression (per head)",
    "attn_sinks": "attention sinks (one logit per head)",
    "attn_q_norm": "query norm",
    "attn_k_norm": "key norm",
    "attn_norm": "attention input norm",
    "ffn_norm": "feed-forward input norm",
    "post_ffw_norm": "feed-forward output norm",
    "ffn_gate": "dense FFN gate",
    "ffn_up": "dense FFN up",
    "ffn_down": "dense FFN down",
    "ffn_gate_inp": "router",
    "exp_probs_b": "expert-selection bias",
    "ffn_gate_exps": "routed experts' gate",
    "ffn_up_exps": "routed experts' up",
    "ffn_down_exps": "routed experts' down",
    "ffn_gate_shexp": "shared experts' gate",
    "ffn_up_shexp": "shared experts' up",
    "ffn_down_shexp": "shared experts' down",
    "ffn_gate_inp_shexp": "shared expert's gate",
    "token_embd": "token embedding",
    "output": "output head",
    "output_norm": "final norm",
    "rope_freqs": "RoPE frequency factors",
}


def _role(cfg: ModelConfig, kind: str) -> str:
    base, _, suffix = kind.rpartition(".")
    if base == "post_attention_norm":
        role = "feed-forward input norm" if cfg.spec.ffn_norm == base else "attention output norm"
    else:
        role = _ROLES.get(base, "")
    return f"{role} bias" if role and suffix == "bias" and base != "exp_probs_b" else role


def _attention_text(c: ModelConfig) -> str:
    if c.spec.attention == "mla":
        text = (
            f"multi-head latent attention, {c.NH} heads: KV compressed to {c.kv_lora_rank}"
            + (f", query to {c.q_lora_rank}" if c.q_lora_rank else "")
            + f"; key {c.HS - c.n_rot} + {c.n_rot} RoPE (shared), value {c.head_v}, RoPE {c.rope}"
        )
    else:
        text = f"{c.NH} query, {c.NKV} key/value heads, head size {c.HS}, RoPE {c.rope}"
        text += f", q/k norm ({c.qk_norm})" if c.qk_norm else ""
    if c.spec.sinks:
        text += ", attention sinks"
    if c.has_swa:
        n = sum(c.swa_layers)
        text += f"; sliding window {c.swa_window} on {n} of {c.L} layers, the others global"
    return text


def _ffn_text(c: ModelConfig) -> str:
    act = "GEGLU" if c.spec.ffn_act == "gelu" else "SwiGLU"
    if not c.is_moe:
        return f"dense {act}, width {c.F}"
    gating = {"softmax": "softmax", "sigmoid": "sigmoid", "softmax_selected": "softmax over the chosen"}
    text = f"{c.E} experts, {c.K} per token ({gating[c.gating]}"
    text += ", renormalised" if c.moe_renorm else ""
    text += f", x {c.moe_scale:g}" if c.moe_scale != 1.0 else ""
    text += f", best {c.group_used} of {c.n_group} groups" if c.n_group > 1 else ""
    text += f"), width {c.F_exp}"
    if c.spec.expert_act == "swiglu_oai":
        text += ", clamped SwiGLU"
    if c.F_shexp and c.spec.shared_ungated:
        text += f"; {c.n_shexp} shared experts (width {c.F_shexp}, always on)"
    elif c.F_shexp:
        text += f"; a shared expert (width {c.F_shexp}, sigmoid gate)"
    if c.n_dense_lead:
        layers = f"{c.n_dense_lead} layer{'s' if c.n_dense_lead > 1 else ''}"
        text += f"; the first {layers} dense ({act}, width {c.F})"
    return text


def _features(c: ModelConfig, unadapted: tuple[str, ...], has: set[str]) -> tuple[str, ...]:
    out = []
    if c.spec.post_norms:
        out.append("norms before and after attention and feed-forward")
    if c.embd_scale != 1.0:
        out.append(f"token embeddings x sqrt({c.C})")
    if c.softcap:
        out.append(f"final logits soft-capped at {c.softcap:g}")
    if c.rope_scaling != "none":
        out.append(f"RoPE scaling {c.rope_scaling} x{c.rope_scale:g}")
    if c.has_swa and c.rope_base_swa != c.rope_base:
        out.append(f"RoPE base {c.rope_base_swa:g} on sliding layers, {c.rope_base:g} on global ones")
    if {"ffn_gate_exps.bias", "attn_q.bias", "ffn_gate_inp.bias"} & has:
        out.append("biases on " + ", ".join(k.split(".")[0] for k in sorted(has) if k.endswith(".bias")))
    if "exp_probs_b.bias" in has:
        out.append("expert-selection bias (changes which experts, not their weights)")
    if unadapted:
        out.append("llama.cpp applies no LoRA to " + ", ".join(unadapted) + " (not offered as targets)")
    return tuple(out)


_LAYER = re.compile(r"^blk\.\d+\.")


def summarize(path: str | os.PathLike[str]) -> ModelSummary:
    """Read a model's header and directory; ModelError if the file would not load."""
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    groups: dict[str, list] = {}
    for info in f.tensors.values():
        groups.setdefault(_LAYER.sub("", info.name), []).append(info)
    kinds = []
    unadapted = llamacpp_unadapted_kinds(f.tensors, cfg.arch)
    for kind, infos in groups.items():
        kinds.append(
            TensorKind(
                kind=kind,
                count=len(infos),
                types=dict(Counter(i.qtype for i in infos)),
                shape=infos[0].shape,
                n_params=sum(i.n_elements for i in infos),
                n_bytes=sum(i.n_bytes for i in infos),
                role=_role(cfg, kind),
                ignored_by_llamacpp=kind.rpartition(".")[0] in unadapted and kind.endswith(".weight"),
            )
        )
    _, moe_layers = check_tensors(f, cfg)
    layers = tuple(
        LayerLayout(
            i,
            "moe" if moe_layers[i] else "dense",
            "sliding" if cfg.is_swa(i) else "global",
            cfg.swa_window if cfg.is_swa(i) else 0,
            cfg.rope_base_swa if cfg.is_swa(i) else cfg.rope_base,
        )
        for i in range(cfg.L)
    )
    shown_unadapted = tuple(k for k in sorted(unadapted) if any(g.rpartition(".")[0] == k for g in groups))
    matmul_types = Counter()
    for info in f.tensors.values():
        if len(info.shape) >= 2:
            matmul_types[info.qtype] += info.n_elements
    tokens = f.get("tokenizer.ggml.tokens") or []
    return ModelSummary(
        path=f.path,
        file_bytes=os.path.getsize(f.path),
        config=cfg,
        n_params=sum(i.n_elements for i in f.tensors.values()),
        n_tensors=len(f.tensors),
        kinds=tuple(kinds),
        file_type=matmul_types.most_common(1)[0][0] if matmul_types else "F32",
        tokenizer_model=str(f.get("tokenizer.ggml.model", "")),
        tokenizer_pre=str(f.get("tokenizer.ggml.pre", "")),
        vocab_size=len(tokens) or cfg.V,
        has_chat_template=bool(f.get("tokenizer.chat_template")),
        layers=layers,
        attention_text=_attention_text(cfg),
        ffn_text=_ffn_text(cfg),
        features=_features(cfg, shown_unadapted, set(groups)),
        unadapted_kinds=shown_unadapted,
    )


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: int, exact: bool = False) -> str:
    """77824 -> '77.82 K' (exact: '77,824 (77.82 K)')."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            short = f"{n / div:.2f} {unit}"
            return f"{n:,} ({short})" if exact else short
    return str(n)
