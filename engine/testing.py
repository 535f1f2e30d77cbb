"""Synthetic GGUF models and adapters with random weights, for tests, benchmarks and demos.

`SynthSpec.for_arch("qwen2moe", C=64, ...)` describes a model of any supported
architecture; `write_model(path, spec)` writes it as a real GGUF file (any
weight type `engine.io.quantize` can write) with a real SentencePiece-style
vocabulary (byte fallback, ChatML control tokens, a chat template), so that
every part of the engine can be exercised on it. `write_adapter` writes a
random LoRA adapter in llama.cpp's layout. Nothing here is downloaded.

A top layer of its own: it writes models of every architecture in the table, and no other module of
the engine imports it (the import contracts in pyproject.toml hold that).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .errors import ModelError
from .io.gguf_write import write_gguf
from .model.archs import ARCHS

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Words whose "▁"-prefixed prefixes make up the text pieces of the synthetic vocabulary.
_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part hello world quick brown fox jumps over lazy dog answer question yes"
).split()

# Byte offsets of the float16 fields of one block (d, and m / dmin where there is one), from ggml's
# block layouts: fixtures that fill blocks with random bytes put finite scales there. MXFP4's scale is
# an e8m0 byte at offset 0, drawn separately.
F16_FIELDS = {
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "MXFP4": (),
}

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")


def spm_vocab(V: int) -> tuple[list[str], list[float], list[int]]:
    """tokens, scores and token types of a SentencePiece-style vocabulary of exactly V entries.

    0 <unk>, 1 <s>, 2 </s>, 3-258 the byte tokens <0x00>..<0xFF>, then <|im_start|>, <|im_end|>,
    then "▁" and letters, then prefixes of common words (each prefix before its extension, so
    every piece is reachable by merges); padded with unused tokens when V is larger.
    """
    tokens = list(SPECIAL_TOKENS) + [f"<0x{b:02X}>" for b in range(256)] + list(CHAT_TOKENS)
    types = [2, 3, 3] + [6] * 256 + [3, 3]
    scores = [0.0] * len(tokens)
    minimum = len(tokens) + 1
    if V < minimum:
        raise ModelError(f"a synthetic vocabulary needs at least {minimum} tokens, got V={V}")
    pieces: list[str] = ["▁"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    seen = set(pieces)
    for w in _WORDS:
        w = "▁" + w
        for n in range(2, len(w) + 1):
            if w[:n] not in seen:
                seen.add(w[:n])
                pieces.append(w[:n])
    for p in pieces:
        if len(tokens) == V:
            break
        tokens.append(p)
        types.append(1)
        scores.append(-float(len(tokens)) / 100.0 + 0.5 * len(p))  # longer pieces merge first
    while len(tokens) < V:
        tokens.append(f"<unused{len(tokens)}>")
        types.append(5)
        scores.append(-1e9)
    return tokens, scores, types


@dataclass(frozen=True)
class SynthSpec:
    """Shape and storage of a synthetic model."""

    arch: str = "llama"  # any of engine.archs.ARCHS
    V: int = 300  # vocabulary size (>= 262)
    C: int = 64  # embedding width
    L: int = 2  # layers
    NH: int = 4  # query heads
    NKV: int = 2  # key/value heads
    HS: int = 16  # head size
    F: int = 128  # dense FFN width
    E: int = 0  # routed experts (0: dense)
    K: int = 0  # experts per token
    F_exp: int = 32  # expert FFN width
    F_shexp: int = 0  # shared expert width (qwen2moe)
    qkv_bias: bool = False  # q/k/v biases (qwen2, qwen2moe)
    tied: bool = False  # no output.weight: the output projection reuses token_embd
    rope_freqs: bool = False  # write a rope_freqs.weight tensor of frequency factors (llama 3.1 style)
    qtype: str = "F32"  # type of the 2-D/3-D matmul weights (norms stay F32)
    expert_qtype: str = ""  # type of the routed expert stacks when it differs (gpt-oss: "MXFP4")
    n_ctx: int = 256  # context_length
    rope_base: float = 10000.0
    eps: float = 1e-5
    seed: int = 0
    name: str = "synthetic"
    n_dense_lead: int = 0  # DeepSeek: leading layers with a dense FFN of width F before the MoE layers
    n_shexp: int = 0  # DeepSeek: ungated shared experts, one FFN of width n_shexp * F_exp in the file
    kv_lora_rank: int = 0  # deepseek2 (MLA): compressed KV width; HS = qk_nope + n_rot
    q_lora_rank: int = 0  # deepseek2: compressed query width (0: one attn_q)
    HS_v: int = 0  # deepseek2: value head size
    n_rot: int = 0  # RoPE dimensions (0: HS)
    gating: int = 0  # deepseek2: expert_gating_func (0: not written; 1 softmax, 2 sigmoid)
    moe_scale: float = 0.0  # expert_weights_scale (0: not written)
    moe_renorm: bool | None = None  # expert_weights_norm (None: not written)
    n_group: int = 0  # deepseek2 (V3): expert groups and groups used per token
    group_used: int = 0
    probs_bias: bool = False  # deepseek2 (V3): exp_probs_b, the expert-selection bias
    expert_bias: bool = False  # gpt-oss: biases on the router and the expert stacks
    swa_window: int = 0  # gemma3, gpt-oss: sliding window (0: none)
    swa_pattern: int = 0  # sliding_window_pattern period written to the file (0: not written)
    rope_base_swa: float = 0.0  # gemma3: rope.freq_base_swa (0: not written)
    softcap: float = 0.0  # gemma3: final_logit_softcapping (0: not written)

    @classmethod
    def for_arch(cls, arch: str, **overrides) -> SynthSpec:
        """A tiny model with the features that characterise `arch` switched on."""
        if arch not in ARCHS:
            raise ModelError(f"unknown architecture {arch!r}; supported: {', '.join(sorted(ARCHS))}")
        spec = ARCHS[arch]
        base = dict(arch=arch)
        if spec.moe_only:
            base.update(E=4, K=2, F=0)
        if arch in ("qwen2", "qwen2moe"):
            base.update(qkv_bias=True, rope_base=1e6)
        if arch in ("qwen3", "qwen3moe"):
            base.update(HS=32, rope_base=1e6)  # NH*HS != C, as in the real models
        if arch == "olmoe":
            base.update(NKV=4)  # OLMoE has no grouped-query attention; llama.cpp sizes attn_k_norm as n_embd
        if spec.shared_expert:
            base.update(F_shexp=64)
        if arch == "qwen2":
            base.update(tied=True)
        if arch in ("deepseek", "deepseek2"):
            base.update(E=4, K=2, F=64, F_exp=32, n_shexp=2, n_dense_lead=1, NKV=4, moe_scale=1.0)
        if arch == "deepseek2":
            # V2-Lite's layout: no q compression, kv_lora_rank, qk_nope + qk_rope heads, v heads
            base.update(HS=24, n_rot=8, HS_v=16, kv_lora_rank=32, gating=1, moe_scale=2.0)
        if arch == "gpt-oss":
            base.update(qkv_bias=True, expert_bias=True, swa_window=4, rope_base=150000.0, F_exp=32)
        if arch == "gemma3":
            base.update(
                HS=32, NKV=1, tied=True, swa_window=4, swa_pattern=2, rope_base=1e6, rope_base_swa=1e4
            )
            base.update(softcap=15.0, eps=1e-6)
        base.update(overrides)
        return cls(**base)


def tensor_shapes(spec: SynthSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor of a synthetic model with its NumPy shape, in file order."""
    arch = ARCHS[spec.arch]
    C, HS = spec.C, spec.HS
    q_out, kv_out = spec.NH * HS, spec.NKV * HS
    t: dict[str, tuple[int, ...]] = {"token_embd.weight": (spec.V, C)}
    for i in range(spec.L):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = (C,)
        if arch.attention == "mla":
            R, n_rot = spec.kv_lora_rank, spec.n_rot
            if spec.q_lora_rank:
                t[p + "attn_q_a.weight"] = (spec.q_lora_rank, C)
                t[p + "attn_q_a_norm.weight"] = (spec.q_lora_rank,)
                t[p + "attn_q_b.weight"] = (q_out, spec.q_lora_rank)
            else:
                t[p + "attn_q.weight"] = (q_out, C)
            t[p + "attn_kv_a_mqa.weight"] = (R + n_rot, C)
            t[p + "attn_kv_a_norm.weight"] = (R,)
            t[p + "attn_k_b.weight"] = (spec.NH, R, HS - n_rot)
            t[p + "attn_v_b.weight"] = (spec.NH, spec.HS_v, R)
            t[p + "attn_output.weight"] = (C, spec.NH * spec.HS_v)
        else:
            t[p + "attn_q.weight"] = (q_out, C)
            t[p + "attn_k.weight"] = (kv_out, C)
            t[p + "attn_v.weight"] = (kv_out, C)
            t[p + "attn_output.weight"] = (C, q_out)
        if spec.qkv_bias:
            t[p + "attn_q.bias"] = (q_out,)
            t[p + "attn_k.bias"] = (kv_out,)
            t[p + "attn_v.bias"] = (kv_out,)
            if spec.arch == "gpt-oss":
                t[p + "attn_output.bias"] = (C,)
        if arch.sinks:
            t[p + "attn_sinks.weight"] = (spec.NH,)
        if arch.qk_norm == "head":
            t[p + "attn_q_norm.weight"] = (HS,)
            t[p + "attn_k_norm.weight"] = (HS,)
        elif arch.qk_norm == "full":
            t[p + "attn_q_norm.weight"] = (q_out,)
            t[p + "attn_k_norm.weight"] = (kv_out,)
        if arch.post_norms:
            t[p + "post_attention_norm.weight"] = (C,)
        t[p + arch.ffn_norm + ".weight"] = (C,)
        if spec.E and i >= spec.n_dense_lead:
            t[p + "ffn_gate_inp.weight"] = (spec.E, C)
            if spec.expert_bias:
                t[p + "ffn_gate_inp.bias"] = (spec.E,)
            if spec.probs_bias:
                t[p + "exp_probs_b.bias"] = (spec.E,)
            t[p + "ffn_gate_exps.weight"] = (spec.E, spec.F_exp, C)
            t[p + "ffn_up_exps.weight"] = (spec.E, spec.F_exp, C)
            t[p + "ffn_down_exps.weight"] = (spec.E, C, spec.F_exp)
            if spec.expert_bias:
                t[p + "ffn_gate_exps.bias"] = (spec.E, spec.F_exp)
                t[p + "ffn_up_exps.bias"] = (spec.E, spec.F_exp)
                t[p + "ffn_down_exps.bias"] = (spec.E, C)
            F_shexp = spec.n_shexp * spec.F_exp if arch.shared_ungated else spec.F_shexp
            if F_shexp:
                t[p + "ffn_gate_shexp.weight"] = (F_shexp, C)
                t[p + "ffn_up_shexp.weight"] = (F_shexp, C)
                t[p + "ffn_down_shexp.weight"] = (C, F_shexp)
                if not arch.shared_ungated:
                    t[p + "ffn_gate_inp_shexp.weight"] = (C,)
        else:
            t[p + "ffn_gate.weight"] = (spec.F, C)
            t[p + "ffn_up.weight"] = (spec.F, C)
            t[p + "ffn_down.weight"] = (C, spec.F)
        if arch.post_norms:
            t[p + "post_ffw_norm.weight"] = (C,)
    t["output_norm.weight"] = (C,)
    if not spec.tied:
        t["output.weight"] = (spec.V, C)
    if spec.rope_freqs:
        t["rope_freqs.weight"] = ((spec.n_rot or HS) // 2,)
    return t


def random_weights(spec: SynthSpec, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights in NumPy layout, scaled so that activations stay O(1) through the layers."""
    rng = np.random.default_rng(spec.seed)
    w: dict[str, np.ndarray] = {}
    for name, shape in tensor_shapes(spec).items():
        kind = name.split(".", 2)[-1] if name.startswith("blk.") else name
        if name == "token_embd.weight":
            x = rng.standard_normal(shape)
            if ARCHS[spec.arch].embd_scale:  # gemma3 multiplies them by sqrt(C): keep inputs and logits O(1)
                x /= np.sqrt(shape[1])
        elif name == "rope_freqs.weight":
            x = 1.0 + np.arange(shape[0]) / 4.0
        elif kind.endswith("norm.weight"):
            x = 1.0 + 0.1 * rng.standard_normal(shape[0])
        elif kind.endswith(".bias"):
            x = 0.1 * rng.standard_normal(shape)
        elif kind == "ffn_gate_inp_shexp.weight":
            x = rng.standard_normal(shape[0]) / np.sqrt(shape[0])
        elif kind == "attn_sinks.weight":
            x = rng.standard_normal(shape)
        elif kind == "attn_k_b.weight":  # (NH, R, qk_nope): keys are c @ w[h], a sum over R
            x = rng.standard_normal(shape) / np.sqrt(shape[1])
        else:  # matmul weights (n_out, n_in) or expert stacks (E, n_out, n_in)
            x = rng.standard_normal(shape) / np.sqrt(shape[-1])
            if kind == "ffn_gate_inp.weight":
                x = 3.0 * x.astype(dtype)  # wide router margins
        w[name] = np.asarray(x).astype(dtype)
    return w


def model_metadata(spec: SynthSpec) -> dict:
    a = spec.arch
    tokens, scores, types = spm_vocab(spec.V)
    md = {
        "general.name": spec.name,
        "general.type": "model",
        f"{a}.context_length": spec.n_ctx,
        f"{a}.embedding_length": spec.C,
        f"{a}.block_count": spec.L,
        f"{a}.attention.head_count": spec.NH,
        f"{a}.attention.head_count_kv": spec.NKV,
        f"{a}.attention.key_length": spec.HS,
        f"{a}.attention.value_length": spec.HS,
        f"{a}.rope.dimension_count": spec.HS,
        f"{a}.rope.freq_base": float(spec.rope_base),
        f"{a}.attention.layer_norm_rms_epsilon": float(spec.eps),
        f"{a}.vocab_size": spec.V,
    }
    if spec.F:
        md[f"{a}.feed_forward_length"] = spec.F
    elif spec.E:
        md[f"{a}.feed_forward_length"] = spec.F_exp  # as in real OLMoE/Mixtral files: llama.cpp reads it
    if spec.E:
        md[f"{a}.expert_count"] = spec.E
        md[f"{a}.expert_used_count"] = spec.K
        md[f"{a}.expert_feed_forward_length"] = spec.F_exp
    if spec.F_shexp:
        md[f"{a}.expert_shared_feed_forward_length"] = spec.F_shexp
    md.update(_arch_metadata(spec))
    md.update(
        {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.eot_token_id": tokens.index("<|im_end|>"),
            "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_eos_token": False,
            "tokenizer.chat_template": CHATML,
        }
    )
    return md


# the SynthSpec fields written as "<arch>.<key>" when set (not 0), with the type the file holds
_OPTIONAL_KEYS = (
    ("n_dense_lead", "leading_dense_block_count", int),
    ("n_shexp", "expert_shared_count", int),
    ("moe_scale", "expert_weights_scale", float),
    ("gating", "expert_gating_func", int),
    ("n_rot", "rope.dimension_count", int),
    ("swa_window", "attention.sliding_window", int),
    ("swa_pattern", "attention.sliding_window_pattern", int),
    ("rope_base_swa", "rope.freq_base_swa", float),
    ("softcap", "final_logit_softcapping", float),
)


def _arch_metadata(spec: SynthSpec) -> dict:
    """The metadata keys of the MoE and attention variants (dense lead layers, shared experts, expert
    scales, MLA, sinks, ...), as convert_hf_to_gguf.py writes them."""
    a = spec.arch
    md = {
        f"{a}.{key}": kind(getattr(spec, name)) for name, key, kind in _OPTIONAL_KEYS if getattr(spec, name)
    }
    if spec.moe_renorm is not None:
        md[f"{a}.expert_weights_norm"] = bool(spec.moe_renorm)
    if spec.n_group:
        md[f"{a}.expert_group_count"] = spec.n_group
        md[f"{a}.expert_group_used_count"] = spec.group_used
    if spec.kv_lora_rank:  # MLA: the MQA view of llama.cpp's absorbed graph, and the expanded heads
        R = spec.kv_lora_rank
        md.update(
            {
                f"{a}.attention.head_count_kv": 1,
                f"{a}.attention.q_lora_rank": spec.q_lora_rank,
                f"{a}.attention.kv_lora_rank": R,
                f"{a}.attention.key_length": R + spec.n_rot,
                f"{a}.attention.value_length": R,
                f"{a}.attention.key_length_mla": spec.HS,
                f"{a}.attention.value_length_mla": spec.HS_v,
            }
        )
    return md


def _storage_type(name: str, array: np.ndarray, spec: SynthSpec) -> str:
    """Matmul weights get `qtype` (expert stacks `expert_qtype` when set); vectors (norms, biases,
    expert biases) stay F32, as llama-quantize does."""
    if array.ndim < 2 or name.endswith(".bias"):
        return "F32"
    return spec.expert_qtype if spec.expert_qtype and name.endswith("_exps.weight") else spec.qtype


def _stored(array: np.ndarray, qtype: str):
    """The values to write: as they are for the types engine.io.quantize writes, else (MXFP4) the
    blocks gguf-py quantizes them to."""
    from gguf import GGMLQuantizationType
    from gguf import quants as gguf_quants

    from .io.quantize import quantizable_types

    if qtype in quantizable_types():
        return array
    return gguf_quants.quantize(np.asarray(array, np.float32), GGMLQuantizationType[qtype])


def write_model(
    path: str | os.PathLike[str],
    spec: SynthSpec,
    weights: dict[str, np.ndarray] | None = None,
    metadata: dict | None = None,
    stored: dict[str, tuple[np.ndarray, str]] | None = None,
) -> str:
    """Write a synthetic model file; returns its path. `weights`/`metadata` override the random ones;
    `stored` gives tensors as the bytes of a block type and that type ((rows, row bytes) uint8,
    `GGUFFile.raw`'s layout), written as they are: the types nothing here quantizes to (IQ4_NL,
    IQ4_XS)."""
    weights = weights if weights is not None else random_weights(spec)
    md = model_metadata(spec)
    md.update(metadata or {})
    tensors = {}
    for n, a in weights.items():
        if stored and n in stored:
            tensors[n] = stored[n]
            continue
        qt = _storage_type(n, a, spec)
        tensors[n] = (_stored(a, qt), qt)
    return write_gguf(path, spec.arch, md, tensors)


def adapter_metadata(arch: str, alpha: float) -> dict:
    return {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": float(alpha)}


def random_adapter(
    model, targets: list[str], rank: int = 4, seed: int = 0, std: float = 0.1
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Random non-zero LoRA pairs for the named tensors of a loaded `engine.model.Model`."""
    from .model.lora import lora_shapes  # local: lora imports ops only, but keep synth light to import

    rng = np.random.default_rng(seed)
    pairs = {}
    for name in targets:
        shape_a, shape_b = lora_shapes(name, model.tensors[name].shape, rank)
        pairs[name] = (
            (std * rng.standard_normal(shape_a)).astype(np.float32),
            (std * rng.standard_normal(shape_b)).astype(np.float32),
        )
    return pairs


def write_adapter(
    path: str | os.PathLike[str],
    arch: str,
    pairs: dict[str, tuple[np.ndarray, np.ndarray]],
    alpha: float,
    qtype: str = "F32",
    metadata: dict | None = None,
) -> str:
    """Write LoRA pairs (base name -> (A, B), NumPy layout) as a llama.cpp adapter GGUF."""
    md = adapter_metadata(arch, alpha)
    md.update(metadata or {})
    tensors = {}
    for base, (A, B) in pairs.items():
        tensors[base + ".lora_a"] = (A, qtype)
        tensors[base + ".lora_b"] = (B, qtype)
    return write_gguf(path, arch, md, tensors)


def random_experts(
    rng: np.random.Generator,
    N: int,
    C: int,
    F: int,
    E: int,
    K: int,
    r: int,
    *,
    w_scale: float,
    lora_scale: float,
    s: float,
    renorm: bool,
):
    """A random routed-expert layer with LoRA on gate, up and down, for the expert ops' tests and
    benchmarks: (x (N, C), routing (K of E experts per token, their weights renormalized when
    `renorm`), (w_gate, w_up (E, F, C), w_down (E, C, F)) of scale `w_scale`, the three LoraTerm
    (rank r, factors of scale `lora_scale`, effective scale `s`), dy (N, C)), drawn from `rng` in that
    order."""
    from .kernels.linear import LoraTerm  # local: keep this module light to import
    from .kernels.moe import route_forward_ref

    x = rng.standard_normal((N, C), dtype=np.float32)
    routing, _ = route_forward_ref(rng.standard_normal((N, E)).astype(np.float32), K, renorm)
    w_gate, w_up = (rng.standard_normal((E, F, C), dtype=np.float32) * w_scale for _ in range(2))
    w_down = rng.standard_normal((E, C, F), dtype=np.float32) * w_scale

    def lora(n_out: int, n_in: int) -> LoraTerm:
        A = rng.standard_normal((E, r, n_in), dtype=np.float32) * lora_scale
        return LoraTerm(A, rng.standard_normal((E, n_out, r), dtype=np.float32) * lora_scale, s)

    loras = (lora(F, C), lora(F, C), lora(C, F))
    dy = rng.standard_normal((N, C), dtype=np.float32)
    return x, routing, (w_gate, w_up, w_down), loras, dy
