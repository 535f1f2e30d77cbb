"""After writing an export: reload the file and compare its logits with the model in memory.

`verify_export(request, adapter, path, base=model)` -> `VerifyReport`: base + reloaded adapter
against base + source adapter, or the merged model alone against base + adapter, on a few short
chat prompts (the run's own, when the caller has them); max |Δ| per prompt and a verdict against
the tolerance of the type written. The base model in memory is used when it is given (an engine
session's), else loaded (quantized at rest: loading costs a header read).

A merged model is also measured against what the fine-tune did: the adapter's effect on the logits
is E = z(base + adapter) - z(base), and the share of it the file keeps is <z(merged) - z(base), E> /
|E|² over every position of every prompt (1: all of it; 0: the file answers as the base model).
Re-quantizing adapted tensors to a small type can round the update away while the logits still
look close to the reference (the effect is small beside the logits): below `MIN_EFFECT_KEPT` the
file fails, whatever its max |Δ|. `quarantine(report)` renames a file that failed to
`<name>.failed.gguf`, so that nothing loads it by mistake.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ExportError, TemplateError
from ..io.gguf_file import GGUFFile
from ..model.lora import LoraAdapter
from ..model.model import Model
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import Tokenizer
from .check import MIN_EFFECT_KEPT, ExportRequest

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
WARN_EFFECT_KEPT = 0.9  # below this the verdict says how much of the fine-tune was lost
_EFFECT_FLOOR = 1e-6  # an adapter whose effect is below this share of the logits has none to keep
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
    effect_sq: float = 0.0  # merges: |E|², E = z(base + adapter) - z(base), over every position
    effect_dot: float = 0.0  # merges: <z(merged) - z(base), E>
    error_sq: float = 0.0  # merges: |z(merged) - z(base + adapter)|²

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
    failed_path: str | None = None  # where `quarantine` moved a file that failed

    @property
    def effect_kept(self) -> float | None:
        """Merges: the share of the adapter's effect on the logits the file keeps (see the module
        docstring); None for adapters, and when the adapter changes the logits too little to tell."""
        if not self.merge:
            return None
        sq = sum(r.effect_sq for r in self.rows)
        scale = max((r.scale for r in self.rows), default=1.0)
        n = max(1, self.n_positions)
        # no effect to speak of, or one far smaller than the file's own rounding noise (which is
        # uncorrelated with it, so the projection stays near 1 until then)
        if sq <= (_EFFECT_FLOOR * scale) ** 2 * n or sq < 0.01 * sum(r.error_sq for r in self.rows):
            return None
        return sum(r.effect_dot for r in self.rows) / sq

    @property
    def effect_lost(self) -> bool:
        kept = self.effect_kept
        return kept is not None and kept < MIN_EFFECT_KEPT

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
        return bool(self.rows) and (self.n_off == 0 or self.routing_flips) and not self.effect_lost

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
        text = self._verdict()
        if self.failed_path:
            text += (
                f" The file was renamed to {os.path.basename(self.failed_path)} so that nothing loads it by "
                "mistake."
            )
        return text

    def _kept_text(self) -> str:
        kept = self.effect_kept
        if kept is None:
            return ""
        if kept < WARN_EFFECT_KEPT:
            return (
                f" It keeps only {kept:.0%} of the fine-tune's effect on the logits: writing the adapted "
                f"tensors as {self.written_type} rounds part of the update away; the default type (F16 "
                "for quantized tensors) keeps it."
            )
        return f" It keeps {min(kept, 9.999):.1%} of the fine-tune's effect on the logits."

    def _verdict(self) -> str:
        n = len(self.rows)
        what = "The merged model" if self.merge else "The reloaded adapter"
        if self.effect_lost:
            return (
                f"{what} lost the fine-tune: it keeps {self.effect_kept:.0%} of the adapter's effect on the "
                f"logits, because writing the adapted tensors as {self.written_type} rounds the update away "
                f"(max |Δ| = {self.max_abs:.3g} against base + adapter). Do not use this file; export with "
                "the default type (F16 for quantized tensors) to keep the fine-tune."
            )
        if self.max_abs == 0.0:
            return f"{what} gives identical logits on {n} prompts (max |Δ| = 0).{self._kept_text()}"
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
                + self._kept_text()
            )
        rest = max(r.max_abs_rest for r in self.rows)
        return (
            f"{what} gives logits {self.level} at {self.n_positions - self.n_off} of {self.n_positions} "
            f"positions: max |Δ| = {rest:.3g} ({self.rel_rest:.1e} of the largest logit; "
            f"{self.written_type} allows {allowed}). At {self.n_off} position{'s' if self.n_off > 1 else ''} "
            f"the logits moved by up to {self.max_abs:.3g}: a near tie in this mixture-of-experts "
            f"model's expert choice flipped, which rounding the weights to {self.written_type} can do."
            + self._kept_text()
        )


def _prompt_ids(tok: Tokenizer, template: ChatTemplate, prompt: str | Sequence[dict]) -> np.ndarray:
    """The ids of `prompt` (a user's text, or the turns of a conversation) rendered with the chat
    template and its generation prompt; without a usable template, the last turn's text as it is."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    try:
        text = template.render(messages, add_generation_prompt=True)
        ids = tok.encode(text, add_special=False, parse_special=True)
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id, *ids]
    except TemplateError:
        ids = tok.encode(str(messages[-1]["content"]), add_special=True, parse_special=False)
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
        bases = [base.forward(ids) for _, ids in seqs]  # the adapter's effect is measured against these
        tolerance = TOLERANCE.get(_worst(types), 0.5)
    else:
        types = [t.qtype for t in written.tensors.values()]
        written.close()
        back = LoraAdapter.load(path, base)
        notes.append(f"{len(back.pairs)} adapted tensors reload and fit the base model")
        outs = [base.forward(ids, lora=back.terms()) for _, ids in seqs]
        worst = _worst(types)
        tolerance = 0.0 if worst == "F32" else TOLERANCE.get(worst, 0.5)
        bases = [None] * len(seqs)
    rows = [
        _compare(p, ref, out, tolerance, z0)
        for (p, _), ref, out, z0 in zip(seqs, refs, outs, bases, strict=True)
    ]
    return VerifyReport(path, request.merge, rows, _worst(types), tolerance, moe, notes)


def _compare(
    prompt: str, ref: np.ndarray, out: np.ndarray, tolerance: float, base: np.ndarray | None = None
) -> PromptResult:
    """Logits (T, V) of the reloaded file against the reference, per position; with the base model's
    logits, the adapter's effect and how much of it the file keeps."""
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    per_pos = np.max(np.abs(out - ref), axis=-1)  # (T,)
    max_ref = float(np.max(np.abs(ref)))
    off = per_pos > tolerance * max(1.0, max_ref)
    rest = per_pos[~off]
    effect_sq = effect_dot = error_sq = 0.0
    if base is not None:
        base = np.asarray(base, np.float64)
        effect = ref - base  # (T, V): what the adapter does
        effect_sq = float(np.sum(effect * effect))
        effect_dot = float(np.sum((out - base) * effect))
        error_sq = float(np.sum((out - ref) ** 2))
    return PromptResult(
        prompt,
        int(ref.shape[0]),
        float(per_pos.max()),
        max_ref,
        int(off.sum()),
        float(rest.max()) if rest.size else 0.0,
        effect_sq,
        effect_dot,
        error_sq,
    )


def failed_name(path: str) -> str:
    """Where a file that failed its check is kept: X.gguf -> X.failed.gguf."""
    stem = path[:-5] if path.lower().endswith(".gguf") else path
    return stem + ".failed.gguf"


def quarantine(report: VerifyReport) -> VerifyReport:
    """A report that failed: rename its file to `<name>.failed.gguf` (replacing an older one) and say so
    in the report (`failed_path`). A report that passed is returned as it is."""
    if report.ok or report.failed_path or not os.path.exists(report.path):
        return report
    target = failed_name(report.path)
    os.replace(report.path, target)
    report.failed_path = target
    return report
