"""Norms of a LoRA adapter: how large each factor and each weight update is.

For every adapted tensor: ‖A‖_F, ‖B‖_F and ‖ΔW‖_F with ΔW = s·B A (s = scale·alpha/r,
as `engine.lora.effective_scale`), and, given the base model, ‖ΔW‖_F / ‖W‖_F, the
relative size of the update. ΔW is never formed: with the r×r Gram matrices,

    ‖B A‖_F² = trace((BᵀB)(A Aᵀ))        W (n_out, n_in): A (r, n_in), B (n_out, r)
    ‖A Bᵀ‖_F² = trace((AᵀA)(BᵀB))        token_embd (V, C): A (V, r), B (C, r)

so the cost is O(r²·(n_in + n_out)) and no (n_out, n_in) array is allocated. Expert
stacks (E, n_out, n_in) get one ‖ΔW_e‖ per expert and their Frobenius aggregate over
the stack. ‖W‖ is read one tensor at a time from the base file (dequantized), never
from a whole loaded model. Aggregates per tensor kind (the name without "blk.N.")
and per layer are the square root of the summed squares of ‖ΔW‖, and the mean of
the tensors' ratios. The same quantities as llama.cpp's LoRA norm checks, for any
adapter that `LoraAdapter.load` reads (F32, F16, Q8_0 factors are dequantized).
This module measures; it does not change adapters or decide what is too large.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelError
from ..export.write import fit_problems
from ..io.gguf_file import GGUFFile
from ..io.quants import dequantize
from ..model.lora import LoraAdapter, effective_scale
from ..ranges import check_number

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
_CHUNK = 1 << 22  # values per chunk when summing squares of a base tensor


@dataclass(frozen=True)
class TensorNorms:
    """Norms of one adapted tensor."""

    name: str  # base tensor name, e.g. "blk.0.attn_q.weight"
    kind: str  # name without "blk.N.", e.g. "attn_q.weight"; the full name outside blocks
    layer: int | None  # N of "blk.N.", None for token_embd, output...
    rank: int  # r
    norm_a: float  # ‖A‖_F (over the whole expert stack for 3-D)
    norm_b: float  # ‖B‖_F
    norm_delta: float  # ‖ΔW‖_F = s·‖B A‖_F (Frobenius over the stack for 3-D)
    norm_w: float | None  # ‖W‖_F of the dequantized base tensor, when a base was given
    ratio: float | None  # norm_delta / norm_w (None without base, or when ‖W‖ = 0)
    per_expert_delta: tuple[float, ...] | None  # ‖ΔW_e‖_F for each expert e of a 3-D adapter

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        if self.per_expert_delta is not None:
            d["per_expert_delta"] = list(self.per_expert_delta)
        return d


@dataclass(frozen=True)
class NormsReport:
    """Per-tensor norms and their aggregates."""

    tensors: tuple[TensorNorms, ...]  # in the adapter's order
    by_kind: dict[str, float]  # kind -> sqrt(sum ‖ΔW‖²) over the layers
    by_layer: dict[int, float]  # layer -> sqrt(sum ‖ΔW‖²) over the kinds (block tensors only)
    ratio_by_kind: dict[str, float] = field(default_factory=dict)  # kind -> mean ratio (with a base)
    ratio_by_layer: dict[int, float] = field(default_factory=dict)  # layer -> mean ratio (with a base)
    scale: float = 1.0  # adapter scale the deltas were computed at
    alpha: float = 0.0  # adapter.lora.alpha

    @property
    def total_delta(self) -> float:
        """sqrt(sum ‖ΔW‖²) over every tensor."""
        return float(np.sqrt(sum(t.norm_delta**2 for t in self.tensors)))

    def to_dict(self) -> dict:
        """Plain JSON-ready data (layer keys as strings)."""
        return {
            "alpha": self.alpha,
            "scale": self.scale,
            "total_delta": self.total_delta,
            "tensors": [t.to_dict() for t in self.tensors],
            "by_kind": dict(self.by_kind),
            "by_layer": {str(k): v for k, v in self.by_layer.items()},
            "ratio_by_kind": dict(self.ratio_by_kind),
            "ratio_by_layer": {str(k): v for k, v in self.ratio_by_layer.items()},
        }


def kind_and_layer(name: str) -> tuple[str, int | None]:
    """("attn_q.weight", 3) for "blk.3.attn_q.weight"; (name, None) outside the blocks."""
    m = _LAYER.match(name)
    return (m.group(2), int(m.group(1))) if m else (name, None)


def delta_norms_squared(name: str, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """‖B A‖_F² (per expert for a 3-D stack; ‖A Bᵀ‖_F² for token_embd) from r×r Gram matrices, float64.

    A scalar for 2-D factors, a vector (E,) for expert stacks. The scale s is not applied.
    """
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    if name == "token_embd.weight":
        ga = A.T @ A  # (r, r)
        gb = B.T @ B  # (r, r)
    else:
        ga = A @ np.swapaxes(A, -1, -2)  # (..., r, r) = A Aᵀ
        gb = np.swapaxes(B, -1, -2) @ B  # (..., r, r) = BᵀB
    # trace(X Y) = sum(X * Yᵀ); both Gram matrices are symmetric
    sq = np.sum(ga * gb, axis=(-2, -1))
    return np.maximum(sq, 0.0)  # rounding can leave -0 for a zero factor


def _frobenius(x: np.ndarray) -> float:
    return float(np.sqrt(np.sum(np.square(np.asarray(x, dtype=np.float64)))))


def _weight_norm(f: GGUFFile, name: str) -> float:
    """‖W‖_F of a base tensor, dequantized a block of rows at a time, summed in float64."""
    info = f.tensors[name]
    raw = f.raw(name).reshape(-1, f.raw(name).shape[-1])  # (rows, row bytes or values)
    rows = max(1, _CHUNK // max(1, info.shape[-1]))
    total = 0.0
    for i in range(0, raw.shape[0], rows):
        c = dequantize(raw[i : i + rows], info.qtype).reshape(-1).astype(np.float64)
        total += float(c @ c)
    return float(np.sqrt(total))


def _open_base(base: str | os.PathLike[str] | GGUFFile, adapter: LoraAdapter) -> GGUFFile:
    f = base if isinstance(base, GGUFFile) else GGUFFile(base)
    problems = fit_problems(adapter, f)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ModelError(f"the adapter does not fit the base model: {problems[0]}{more}")
    return f


def lora_norms(
    adapter: LoraAdapter, *, scale: float = 1.0, base: str | os.PathLike[str] | GGUFFile | None = None
) -> NormsReport:
    """Norms of every tensor of `adapter` at `scale`; with `base` (a model path or open GGUFFile),
    also ‖W‖ and ‖ΔW‖/‖W‖. ModelError when the adapter does not fit the base."""
    check_number("adapter_scale", scale, label="adapter scale")
    f = _open_base(base, adapter) if base is not None else None
    rows = []
    for name, (A, B) in adapter.pairs.items():
        r = int(np.shape(B)[-1])
        s = abs(effective_scale(adapter.alpha, r, scale))
        sq = delta_norms_squared(name, A, B)
        per_expert = None
        if np.ndim(sq) == 1:
            per_expert = tuple(float(s * np.sqrt(v)) for v in sq)
        norm_delta = float(s * np.sqrt(np.sum(sq)))
        norm_w = ratio = None
        if f is not None:
            norm_w = _weight_norm(f, name)
            ratio = norm_delta / norm_w if norm_w > 0 else None
        kind, layer = kind_and_layer(name)
        rows.append(
            TensorNorms(
                name, kind, layer, r, _frobenius(A), _frobenius(B), norm_delta, norm_w, ratio, per_expert
            )
        )
    sq_kind: dict[str, list[float]] = {}
    sq_layer: dict[int, list[float]] = {}
    ratio_kind: dict[str, list[float]] = {}
    ratio_layer: dict[int, list[float]] = {}
    for t in rows:
        sq_kind.setdefault(t.kind, []).append(t.norm_delta**2)
        if t.ratio is not None:
            ratio_kind.setdefault(t.kind, []).append(t.ratio)
        if t.layer is not None:
            sq_layer.setdefault(t.layer, []).append(t.norm_delta**2)
            if t.ratio is not None:
                ratio_layer.setdefault(t.layer, []).append(t.ratio)
    return NormsReport(
        tensors=tuple(rows),
        by_kind={k: float(np.sqrt(sum(v))) for k, v in sorted(sq_kind.items())},
        by_layer={k: float(np.sqrt(sum(v))) for k, v in sorted(sq_layer.items())},
        ratio_by_kind={k: float(np.mean(v)) for k, v in sorted(ratio_kind.items())},
        ratio_by_layer={k: float(np.mean(v)) for k, v in sorted(ratio_layer.items())},
        scale=float(scale),
        alpha=float(adapter.alpha),
    )
