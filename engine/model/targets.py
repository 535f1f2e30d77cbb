"""Which tensors train: LoRA targets and full-weight tensors chosen by presets, patterns and layers.

A target is a GGUF tensor name (`blk.3.attn_q.weight`, `blk.0.ffn_up_exps.weight`,
`output.weight`, ...). `lora_candidates` lists every tensor of a model with whether it can take a
LoRA adapter (2-D and 3-D weights can; norms, biases and RoPE factors cannot, with the reason; nor can
the weights llama.cpp's graph multiplies without their adapter, `Candidate.ignored_by_llamacpp`, such
as deepseek2's MLA projections), and `select_targets` resolves a `TargetSpec` against them. Presets:

- attention: attn_q, attn_k, attn_v, attn_output
- mlp: dense ffn_gate/ffn_up/ffn_down and the shared expert's
- experts: the routed expert stacks ffn_{gate,up,down}_exps (3-D adapters, one A/B per expert)
- router: ffn_gate_inp
- all: every 2-D/3-D weight inside the layers (attention, mlp, experts, router)
- none: nothing (patterns only)

Patterns are shell globs over full names (`blk.*.attn_*.weight`), or a bare kind (`attn_q`,
`ffn_up_exps`, `output`, `token_embd`) that matches that kind in every layer. A pattern that
matches nothing is an error, never silently ignored.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ModelError
from ..io.gguf_file import TensorInfo
from .archs import ARCHS
from .lora import lora_shapes

PRESETS: dict[str, tuple[str, ...]] = {
    "attention": ("attn_q", "attn_k", "attn_v", "attn_output"),
    "mlp": ("ffn_gate", "ffn_up", "ffn_down", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"),
    "experts": ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
    "router": ("ffn_gate_inp",),
    "all": (
        "attn_q", "attn_k", "attn_v", "attn_output",
        "ffn_gate", "ffn_up", "ffn_down", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
        "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_inp",
    ),
    "none": (),
}  # fmt: skip

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)\.(weight|bias)$")


@dataclass(frozen=True)
class Candidate:
    """One tensor of the model, as the target picker shows it."""

    name: str  # GGUF name
    kind: str  # "attn_q", "ffn_up_exps", "token_embd", "output", "attn_norm", ...
    layer: int | None  # block index, None for global tensors
    shape: tuple[int, ...]  # NumPy shape
    qtype: str  # stored type
    lora_ok: bool  # can take a LoRA adapter
    reason: str  # why not, when lora_ok is False
    ignored_by_llamacpp: bool = False  # a weight llama.cpp's graph multiplies without its adapter


def split_name(name: str) -> tuple[int | None, str]:
    """(layer, kind) of a name: blk.3.attn_q.weight -> (3, "attn_q"); output.weight -> (None, "output")."""
    m = _LAYER.match(name)
    if m:
        kind = m.group(2) + ("" if m.group(3) == "weight" else ".bias")
        return int(m.group(1)), kind
    return None, name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name


# A tensor only multi-head latent attention has: its graph (deepseek2) is the one with unadapted kinds.
_MLA_MARK = "attn_kv_a_mqa"


def llamacpp_unadapted_kinds(tensors: Mapping[str, TensorInfo], arch: str | None = None) -> frozenset[str]:
    """Tensor kinds that llama.cpp's graph for this model multiplies without their LoRA adapter
    (ggml_mul_mat, not build_lora_mm): an adapter there loads but changes nothing, so the engine
    neither offers nor applies one. deepseek2: attn_q, attn_q_a/b, attn_kv_a_mqa, attn_k_b,
    attn_v_b and output. `arch` (general.architecture) when known, else told by the tensor names."""
    if arch is None:
        mla = any(split_name(n)[1] == _MLA_MARK for n in tensors)
        arch = "deepseek2" if mla else ""
    spec = ARCHS.get(arch)
    return frozenset(spec.no_lora) if spec is not None else frozenset()


def lora_candidates(tensors: Mapping[str, TensorInfo], arch: str | None = None) -> list[Candidate]:
    """Every tensor with whether it can take a LoRA adapter, and why not (see the module docstring)."""
    unadapted = llamacpp_unadapted_kinds(tensors, arch)
    out = []
    for name, info in tensors.items():
        layer, kind = split_name(name)
        if kind in unadapted:
            why = "llama.cpp does not apply LoRA here (its graph multiplies this tensor without the adapter)"
            out.append(Candidate(name, kind, layer, info.shape, info.qtype, False, why, True))
            continue
        if name.endswith(".bias"):
            ok, why = False, "a bias vector: train it in full instead"
        elif len(info.shape) < 2:
            ok, why = False, "a vector (norm or gate weights): train it in full instead"
        elif kind == "rope_freqs":
            ok, why = False, "RoPE frequency factors are not a weight matrix"
        elif len(info.shape) > 3:
            ok, why = False, f"{len(info.shape)}-D tensors cannot take LoRA"
        else:
            ok, why = True, ""
        out.append(Candidate(name, kind, layer, info.shape, info.qtype, ok, why))
    return out


def parse_layers(text: str | None, n_layers: int) -> set[int] | None:
    """'0-3,7' -> {0, 1, 2, 3, 7}; None or '' -> None (all layers). ModelError on a bad range."""
    if not text:
        return None
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        m = re.fullmatch(r"(-?\d+)(?:-(\d+))?", part)
        if not m:
            raise ModelError(f"layer range {text!r}: {part!r} is not N or A-B")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if a < 0 or b >= n_layers or a > b:
            raise ModelError(f"layer range {text!r}: {part!r} is outside 0..{n_layers - 1}")
        out.update(range(a, b + 1))
    return out


@dataclass(frozen=True)
class TargetSpec:
    """What to adapt: a preset and/or patterns, optionally restricted to some layers."""

    preset: str = "attention"  # one of PRESETS
    patterns: tuple[str, ...] = ()  # extra names/globs/kinds (embedding and output only this way)
    layers: str | None = None  # e.g. "0-11" or "0,2,4"; None = every layer (global tensors unaffected)
    exclude: tuple[str, ...] = ()  # names/globs/kinds removed from the selection


def _matches(pattern: str, c: Candidate) -> bool:
    """A bare kind ("attn_q", "attn_q.bias", "output") or a glob over full names ("blk.*.attn_*.weight")."""
    return c.kind == pattern or fnmatch.fnmatchcase(c.name, pattern)


def select_targets(
    tensors: Mapping[str, TensorInfo], spec: TargetSpec, n_layers: int, arch: str | None = None
) -> list[str]:
    """Names of the tensors that get LoRA adapters, in file order; ModelError if a part matches nothing."""
    if spec.preset not in PRESETS:
        raise ModelError(f"unknown target preset {spec.preset!r}; presets: {', '.join(PRESETS)}")
    layers = parse_layers(spec.layers, n_layers)
    cands = lora_candidates(tensors, arch)
    chosen: dict[str, Candidate] = {}
    kinds = set(PRESETS[spec.preset])
    for c in cands:
        if c.kind in kinds and c.lora_ok:
            chosen[c.name] = c
    for pattern in spec.patterns:
        hits = [c for c in cands if _matches(pattern, c)]
        if not hits:
            raise ModelError(f"target pattern {pattern!r} matches no tensor of this model")
        bad = [c for c in hits if not c.lora_ok]
        if bad and len(bad) == len(hits):
            raise ModelError(
                f"target pattern {pattern!r} matches only tensors that cannot take LoRA: "
                f"{bad[0].name} is {bad[0].reason}"
            )
        chosen.update((c.name, c) for c in hits if c.lora_ok)
    for pattern in spec.exclude:
        for name in [n for n, c in chosen.items() if _matches(pattern, c)]:
            del chosen[name]
    if layers is not None:
        chosen = {n: c for n, c in chosen.items() if c.layer is None or c.layer in layers}
    if not chosen:
        raise ModelError(
            f"no tensor selected (preset {spec.preset!r}, patterns {list(spec.patterns)}, "
            f"layers {spec.layers!r}); "
            "this model has: " + ", ".join(sorted({c.kind for c in cands if c.lora_ok}))
        )
    return [c.name for c in cands if c.name in chosen]


def select_full(
    tensors: Mapping[str, TensorInfo], patterns: tuple[str, ...], n_layers: int, layers: str | None = None
) -> list[str]:
    """Tensors trained in full (float32 master copies), by names, globs or kinds ('attn_norm', ...)."""
    if not patterns:
        return []
    sel = parse_layers(layers, n_layers)
    cands = lora_candidates(tensors)
    out: dict[str, Candidate] = {}
    for pattern in patterns:
        if pattern == "all":
            hits = [c for c in cands if c.kind != "rope_freqs"]
        else:
            hits = [c for c in cands if _matches(pattern, c)]
        if not hits:
            raise ModelError(f"full-weight pattern {pattern!r} matches no tensor of this model")
        out.update((c.name, c) for c in hits)
    return [c.name for c in cands if c.name in out and (sel is None or c.layer is None or c.layer in sel)]


def lora_param_count(tensors: Mapping[str, TensorInfo], names: list[str], rank: int) -> int:
    """Trainable parameters of rank-`rank` LoRA pairs on the named tensors (A and B together)."""
    total = 0
    for name in names:
        shape_a, shape_b = lora_shapes(name, tensors[name].shape, rank)
        total += math.prod(shape_a) + math.prod(shape_b)
    return total
