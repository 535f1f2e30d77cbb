"""After writing an export: reload the file and compare its logits with the model in memory.

`verify_export(request, adapter, path, base=model)` -> `VerifyReport`: base + reloaded adapter
against base + source adapter, or the merged model alone against base + adapter, on a few short
chat prompts; max |Δ| per prompt and a verdict against the tolerance of the type written. The base
model in memory is used when it is given (an engine session's), else loaded (quantized at rest:
loading costs a header read).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ExportError, TemplateError
from ..io.gguf_file import GGUFFile
from ..model.lora import LoraAdapter
from ..model.model import Model
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import Tokenizer
from .check import ExportRequest

VERIFY_PROMPTS = ("Hello! Who are you?", "Name three colours.", "What is 2 + 3?")
# Largest max |Δ| of the logits, relative to the largest reference logit (at least 1), that a file
# written in each type may show; measured on synthetic models with strong adapters, with headroom.
TOLERANCE = {
    "F32": 1e-5,
    "F16": 5e-3,
    "BF16": 3e-2,
    "Q8_0": 5e-2,
    "Q6_K": 5e-2,
    "Q5_0": 1e-1,
    "Q5_1": 1e-1,
    "Q5_K": 1e-1,
    "Q4_0": 2e-1,
    "Q4_1": 2e-1,
    "Q4_K": 2e-1,
}
_LEVELS = (
    ("within float32 rounding", 1e-5),
    ("within F16 tolerance", 5e-3),
    ("within Q8_0 tolerance", 5e-2),
    ("within 4-bit tolerance", 2e-1),
)


@dataclass(frozen=True)
class PromptResult:
    prompt: str
    n_tokens: int
    max_abs: float  # max |Δ| of the logits over every position and token
    max_ref: float  # largest |logit| of the reference
    n_off: int = 0  # positions whose max |Δ| is beyond the tolerance
    max_abs_rest: float = 0.0  # max |Δ| over the other positions

    @property
    def scale(self) -> float:
        return max(1.0, self.max_ref)

    @property
    def rel(self) -> float:
        return self.max_abs / self.scale


@dataclass
class VerifyReport:
    """Logits of the reloaded file against the model in memory, per prompt, and what they mean.

    On a mixture-of-experts model a rounding can flip the top-k expert choice of a token whose
    router scores are nearly tied; that token's logits then move far although the file is right.
    A few such positions (at most 5 %, at least one allowed) are reported, not failed; on a dense
    model every position must be within the tolerance.
    """

    path: str
    merge: bool
    rows: list[PromptResult]
    written_type: str  # the least precise type among the tensors that changed
    tolerance: float  # allowed max |Δ| relative to the largest logit (0: must be identical)
    moe: bool = False  # the model routes tokens to experts
    notes: list[str] = field(default_factory=list)

    @property
    def max_abs(self) -> float:
        return max((r.max_abs for r in self.rows), default=0.0)

    @property
    def rel(self) -> float:
        return max((r.rel for r in self.rows), default=0.0)

    @property
    def n_positions(self) -> int:
        return sum(r.n_tokens for r in self.rows)

    @property
    def n_off(self) -> int:
        return sum(r.n_off for r in self.rows)

    @property
    def rel_rest(self) -> float:
        """max |Δ| relative to the largest logit over the positions within the tolerance."""
        return max((r.max_abs_rest / r.scale for r in self.rows), default=0.0)

    @property
    def routing_flips(self) -> bool:
        """Positions beyond the tolerance that a flipped expert choice explains (see the class doc)."""
        return self.moe and 0 < self.n_off <= max(1, self.n_positions // 20)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and (self.n_off == 0 or self.routing_flips)

    @property
    def level(self) -> str:
        """identical, within float32 rounding, within F16 / Q8_0 / 4-bit tolerance, or differs."""
        if self.max_abs == 0.0:
            return "identical"
        if not self.ok:
            return "differs"
        rel = self.rel_rest if self.n_off else self.rel
        for name, tol in _LEVELS:
            if rel <= tol:
                return name
        return "differs"

    def verdict(self) -> str:
        n = len(self.rows)
        what = "The merged model" if self.merge else "The reloaded adapter"
        if self.max_abs == 0.0:
            return f"{what} gives identical logits on {n} prompts (max |Δ| = 0)."
        allowed = "identical logits" if self.tolerance == 0 else f"{self.tolerance:.0e} of the largest logit"
        if not self.ok:
            return (
                f"{what} differs: max |Δ| = {self.max_abs:.3g} ({self.rel:.1e} of the largest logit) at "
                f"{self.n_off} of {self.n_positions} positions, where {self.written_type} allows {allowed}. "
                "Do not use this file; export again as F32 and report the problem."
            )
        if self.n_off == 0:
            return (
                f"{what} gives logits {self.level} on {n} prompts: max |Δ| = {self.max_abs:.3g} "
                f"({self.rel:.1e} of the largest logit; {self.written_type} allows {allowed})."
            )
        rest = max(r.max_abs_rest for r in self.rows)
        return (
            f"{what} gives logits {self.level} at {self.n_positions - self.n_off} of {self.n_positions} "
            f"positions: max |Δ| = {rest:.3g} ({self.rel_rest:.1e} of the largest logit; "
            f"{self.written_type} allows {allowed}). At {self.n_off} position{'s' if self.n_off > 1 else ''} "
            f"the logits moved by up to {self.max_abs:.3g}: a near tie in this mixture-of-experts "
            f"model's expert choice flipped, which rounding the weights to {self.written_type} can do."
        )


def _prompt_ids(tok: Tokenizer, template: ChatTemplate, prompt: str) -> np.ndarray:
    try:
        text = template.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = tok.encode(text, add_special=False, parse_special=True)
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id, *ids]
    except TemplateError:
        ids = tok.encode(prompt, add_special=True, parse_special=False)
    return np.asarray(ids, dtype=np.int64)


def _worst(types: Iterable[str]) -> str:
    return max(types, key=lambda t: TOLERANCE.get(t, 0.5), default="F32")


def verify_export(
    request: ExportRequest,
    adapter: LoraAdapter,
    path: str,
    *,
    base: Model | None = None,
    tokenizer: Tokenizer | None = None,
    template: ChatTemplate | None = None,
    prompts: Sequence[str] = VERIFY_PROMPTS,
) -> VerifyReport:
    """Reload `path` and compare its logits with base + `adapter` on `prompts` (see the module docstring).

    `base` (and its `tokenizer`): the model in memory, else `request.base` is loaded.
    """
    if base is None:
        if not request.base:
            raise ExportError("open the base model on the Model page: the logits are compared on it")
        base = Model.load(request.base)
    tok = tokenizer or Tokenizer.from_metadata(base.metadata, base.path)
    template = template or ChatTemplate.from_metadata(base.metadata)
    seqs = [(p, _prompt_ids(tok, template, p)) for p in prompts]
    terms = adapter.terms(request.scale if request.merge else 1.0)
    refs = [base.forward(ids, lora=terms) for _, ids in seqs]
    moe = any(name.endswith("ffn_gate_inp.weight") for name in base.tensors)
    written = GGUFFile(path)
    notes = []
    if request.merge:
        types = [written.tensors[n].qtype for n in adapter.pairs if n in written.tensors]
        for key in ("tokenizer.ggml.tokens", "tokenizer.chat_template"):
            if key in base.metadata and written.metadata.get(key) != base.metadata[key]:
                notes.append(f"{key} differs from the base model's")
        if not notes:
            notes.append("tokenizer and chat template copied from the base model")
        written.close()
        merged = Model.load(path)
        outs = [merged.forward(ids) for _, ids in seqs]
        tolerance = TOLERANCE.get(_worst(types), 0.5)
    else:
        types = [t.qtype for t in written.tensors.values()]
        written.close()
        back = LoraAdapter.load(path, base)
        notes.append(f"{len(back.pairs)} adapted tensors reload and fit the base model")
        outs = [base.forward(ids, lora=back.terms()) for _, ids in seqs]
        worst = _worst(types)
        tolerance = 0.0 if worst == "F32" else TOLERANCE.get(worst, 0.5)
    rows = [_compare(p, ref, out, tolerance) for (p, _), ref, out in zip(seqs, refs, outs, strict=True)]
    return VerifyReport(path, request.merge, rows, _worst(types), tolerance, moe, notes)


def _compare(prompt: str, ref: np.ndarray, out: np.ndarray, tolerance: float) -> PromptResult:
    """Logits (T, V) of the reloaded file against the reference, per position."""
    per_pos = np.max(np.abs(out - ref), axis=-1)  # (T,)
    max_ref = float(np.max(np.abs(ref)))
    off = per_pos > tolerance * max(1.0, max_ref)
    rest = per_pos[~off]
    return PromptResult(
        prompt,
        int(ref.shape[0]),
        float(per_pos.max()),
        max_ref,
        int(off.sum()),
        float(rest.max()) if rest.size else 0.0,
    )
