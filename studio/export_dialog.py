"""The export dialog: write a LoRA adapter GGUF (F32, F16, Q8_0) or a merged model GGUF, check before
writing, show progress, and after writing reload the file and compare its logits with the model in
memory.

The work is in plain functions without Qt, which the dialog runs off the UI thread and the Export
page reuses:

- `check_export(request)` -> `CheckReport`: the source adapter reads; the base model reads; the
  architecture matches; every adapted tensor exists in the base with shapes that fit; the target
  folder exists and is writable; there is enough free disk space for the estimated size; the output
  name ends in .gguf and overwrites neither the base model nor the source adapter.
- `write_export(request, adapter, on_progress, should_stop)` writes atomically (the engine writes a
  temporary file and renames it): `engine.export_adapter` or `engine.export_merged`.
- `verify_export(request, adapter, path)` -> `VerifyReport`: reloads the written file and compares
  logits on a few short chat prompts: base + reloaded adapter against base + source adapter, or the
  merged model alone against base + adapter; max |Δ| per prompt and a verdict against the tolerance
  of the type written.
- `find_checkpoints(folders)` lists the trainer's `<run>-checkpoints/ckpt-NNNNNN/adapter.gguf`.

`ExportDialog` is the window around them; `ExportWorker` runs one of them in a QThread (a worker
object moved to the thread, never a QThread subclass, never terminated: a merge stops between
tensors when asked, leaving the target as it was). This module does not train or generate.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot
from PySide6.QtGui import QColor, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QComboBox,
    QDialog,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QTableWidget,
    QTableWidgetItem,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import (
    ChatTemplate,
    EngineError,
    ExportError,
    GGUFFile,
    LoraAdapter,
    Model,
    TemplateError,
    Tokenizer,
    adapter_tensor_types,
    export_adapter,
    export_merged,
    export_size,
    fit_problems,
    human_bytes,
    merged_tensor_types,
)

from .project import ModelInfo, Project
from .tasks import return_to_ui_thread, start_in_thread

ADAPTER_TYPES = ("F32", "F16", "Q8_0")
MERGE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q4_K")  # offered for merged tensors
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
_DISK_MARGIN = 1 << 20  # bytes kept free beyond the estimate
_CKPT = re.compile(r"^ckpt-(\d+)$")
OK_MARK, BAD_MARK = "✓", "✗"
GREEN, RED = "#1e7a34", "#b03a2e"


# --- requests, checks ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportRequest:
    """What to write: `source` adapter file, `out` path, `base` model; `merge` for a whole model.

    qtype: for an adapter one of ADAPTER_TYPES; for a merged model None (each merged tensor keeps
    its type) or the type of every merged matrix. scale: the adapter's weight in a merge.
    """

    source: str
    out: str
    base: str | None
    merge: bool = False
    qtype: str | None = "F32"
    scale: float = 1.0

    @property
    def kind(self) -> str:
        return "merged model" if self.merge else f"{self.qtype} adapter"


@dataclass(frozen=True)
class CheckItem:
    ok: bool
    label: str  # what was checked, e.g. "Architecture matches the base model"
    detail: str  # what was found, or what is wrong and what to do

    def text(self) -> str:
        return f"{OK_MARK if self.ok else BAD_MARK} {self.label}"


@dataclass
class CheckReport:
    request: ExportRequest
    items: list[CheckItem]
    notes: list[str] = field(default_factory=list)  # facts worth knowing that do not block the export
    size: int = 0  # estimated bytes of the file
    adapter: LoraAdapter | None = field(default=None, repr=False)  # the source, as read by the check

    @property
    def ok(self) -> bool:
        return bool(self.items) and all(i.ok for i in self.items)

    def failures(self) -> list[CheckItem]:
        return [i for i in self.items if not i.ok]

    def summary(self) -> str:
        bad = self.failures()
        if not bad:
            return f"All {len(self.items)} checks passed."
        return "Not ready: " + "; ".join(f"{i.label.lower()}: {i.detail}" for i in bad)


def estimate_size(request: ExportRequest, adapter: LoraAdapter, base: GGUFFile | None) -> int:
    """Bytes the written file will take, about (header included)."""
    if request.merge:
        return export_size(adapter, qtype=request.qtype, base=base)
    return export_size(adapter, qtype=request.qtype or "F32")


def _same_file(a: str, b: str | None) -> bool:
    if not b:
        return False
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


def check_export(request: ExportRequest) -> CheckReport:
    """Every check before writing; see the module docstring. Reads headers and the adapter only."""
    items: list[CheckItem] = []
    notes: list[str] = []
    adapter: LoraAdapter | None = None
    base: GGUFFile | None = None
    # the source adapter
    label = "Source adapter reads"
    if not request.source:
        items.append(CheckItem(False, label, "choose the adapter to export"))
    else:
        try:
            adapter = LoraAdapter.load(request.source)
            ranks = sorted({adapter.rank(n) for n in adapter.pairs})
            items.append(
                CheckItem(
                    True,
                    label,
                    f"{os.path.basename(request.source)}: {len(adapter.pairs)} adapted tensors, "
                    f"rank {'/'.join(map(str, ranks)) or '-'}, alpha {adapter.alpha:g}",
                )
            )
            if not adapter.pairs:
                items[-1] = CheckItem(False, label, "the adapter has no tensors; nothing to export")
        except (EngineError, OSError) as exc:
            items.append(CheckItem(False, label, str(exc)))
    # the base model
    label = "Base model reads"
    if not request.base:
        items.append(CheckItem(False, label, "no model is open: open the base model on the Model page"))
    else:
        try:
            base = GGUFFile(request.base)
            if base.get("general.type") == "adapter":
                items.append(CheckItem(False, label, f"{request.base} is an adapter, not a model"))
                base = None
            else:
                items.append(
                    CheckItem(
                        True,
                        label,
                        f"{os.path.basename(request.base)}: {base.get('general.architecture')}, "
                        f"{len(base.tensors)} tensors",
                    )
                )
        except (EngineError, OSError) as exc:
            items.append(CheckItem(False, label, str(exc)))
    # architecture, names, shapes
    label = "Architecture matches the base model"
    if adapter is None or base is None:
        items.append(CheckItem(False, label, "needs a readable adapter and base model"))
    else:
        arch = str(base.get("general.architecture", ""))
        if not adapter.arch:
            ok = request.merge  # a merge can go by the tensors; llama.cpp needs it in an adapter file
            items.append(
                CheckItem(
                    ok,
                    label,
                    "the adapter names no architecture"
                    + ("; its tensors are checked below" if ok else "; llama.cpp refuses such an adapter"),
                )
            )
        elif adapter.arch != arch:
            items.append(
                CheckItem(
                    False,
                    label,
                    f"the adapter is for {adapter.arch!r}, the base model is {arch!r}: "
                    "choose the model it was trained on",
                )
            )
        else:
            items.append(CheckItem(True, label, f"both are {arch}"))
    label = "Every adapted tensor exists with matching shapes"
    if adapter is None or base is None:
        items.append(CheckItem(False, label, "needs a readable adapter and base model"))
    else:
        problems = fit_problems(adapter, base, check_arch=False)  # architecture has its own line
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            items.append(CheckItem(False, label, "; ".join(problems[:3]) + more))
        else:
            items.append(CheckItem(True, label, f"all {len(adapter.pairs)} found in the base model"))
    # the target
    out = request.out
    folder = os.path.dirname(os.path.abspath(out)) if out else ""
    label = "Target folder exists and is writable"
    if not out:
        items.append(CheckItem(False, label, "choose where to write"))
    elif not os.path.isdir(folder):
        items.append(CheckItem(False, label, f"folder {folder} does not exist: create it or choose another"))
    elif not os.access(folder, os.W_OK | os.X_OK):
        items.append(CheckItem(False, label, f"folder {folder} is not writable: choose another"))
    else:
        items.append(CheckItem(True, label, folder))
    label = "Enough free disk space"
    if adapter is None or (request.merge and base is None) or not os.path.isdir(folder):
        items.append(CheckItem(False, label, "needs the adapter, the base model and the target folder"))
        size = 0
    else:
        size = estimate_size(request, adapter, base)
        free = shutil.disk_usage(folder).free
        need = size + _DISK_MARGIN
        detail = f"needs about {human_bytes(size)}, {human_bytes(free)} free"
        items.append(CheckItem(free >= need, label, detail if free >= need else f"{detail}: free some space"))
    label = "Output name"
    name_problem = None
    if not out:
        name_problem = "choose a file name"
    elif not out.lower().endswith(".gguf"):
        name_problem = "the file name must end in .gguf"
    elif os.path.isdir(out):
        name_problem = f"{out} is a folder: give a file name ending in .gguf"
    elif _same_file(out, request.base):
        name_problem = "that is the base model itself: write to another file"
    elif _same_file(out, request.source):
        name_problem = "that is the source adapter itself: write to another file"
    if name_problem:
        items.append(CheckItem(False, label, name_problem))
    elif os.path.exists(out):
        items.append(CheckItem(True, label, f"{os.path.basename(out)} exists and will be replaced"))
    else:
        items.append(CheckItem(True, label, f"{os.path.basename(out)} (a new file)"))
    # notes on the type
    if adapter is not None and not request.merge:
        qtype = request.qtype or "F32"
        types = adapter_tensor_types(adapter, qtype)
        fallback = [n for n, t in types.items() if t != qtype]
        if qtype == "Q8_0":
            notes.append(
                "A Q8_0 adapter loads with llama-cli --lora; llama-export-lora merges only F16 and F32 "
                "adapters."
            )
            if fallback:
                notes.append(
                    f"{len(fallback)} of {len(types)} tensors have rows that are not a multiple of 32 "
                    "and are written as F16."
                )
        elif qtype == "F16":
            notes.append("F16 halves the size; the logits move by about 1e-3 of their size.")
    elif adapter is not None and base is not None:
        types = merged_tensor_types(adapter, base, request.qtype)
        changed = {n: t for n, t in types.items() if t != base.tensors[n].qtype}
        if changed:
            example = next(iter(changed))
            notes.append(
                f"{len(changed)} of {len(types)} merged tensors change type "
                f"(e.g. {example}: {base.tensors[example].qtype} -> {changed[example]})."
            )
        if request.scale != 1.0:
            notes.append(f"The adapter is merged at scale {request.scale:g}.")
    if base is not None:
        base.close()
    return CheckReport(request, items, notes, size, adapter)


# --- writing ---------------------------------------------------------------------------------------


def write_export(
    request: ExportRequest,
    adapter: LoraAdapter,
    on_progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> str:
    """Write the file atomically; returns its path. ExportError when cancelled (nothing changed)."""
    if request.merge:
        if not request.base:
            raise ExportError("open the base model on the Model page before merging")
        report = export_merged(
            request.base,
            adapter,
            request.out,
            scale=request.scale,
            qtype=request.qtype,
            on_progress=on_progress,
            should_stop=should_stop,
        )
        return report.path
    path = export_adapter(adapter, request.out, qtype=request.qtype or "F32")
    if on_progress is not None:
        on_progress(1, 1)
    return path


# --- verifying -------------------------------------------------------------------------------------


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
    template: ChatTemplate | None = None,
    prompts: Sequence[str] = VERIFY_PROMPTS,
) -> VerifyReport:
    """Reload `path` and compare its logits with base + `adapter` on `prompts` (see the module docstring).

    Loads the base model, and for a merged file the merged model after the base is released.
    """
    if not request.base:
        raise ExportError("open the base model on the Model page: the logits are compared on it")
    base = Model.load(request.base)
    tok = Tokenizer.from_metadata(base.metadata, base.path)
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
        del base, terms
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


# --- checkpoints and names -------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointEntry:
    path: str  # .../<run>-checkpoints/ckpt-NNNNNN/adapter.gguf
    run: str  # <run>
    step: int
    mtime: float

    def label(self) -> str:
        return f"Checkpoint · step {self.step} · {self.run}"


def checkpoint_roots(folders: Iterable[str | None]) -> list[str]:
    """`<run>-checkpoints` folders: the given ones that are such folders, and those inside the others."""
    roots: dict[str, str] = {}
    for folder in folders:
        if not folder or not os.path.isdir(folder):
            continue
        found = (
            [folder]
            if folder.rstrip(os.sep).endswith("-checkpoints")
            else sorted(glob.glob(os.path.join(glob.escape(folder), "*-checkpoints")))
        )
        for root in found:
            if os.path.isdir(root):
                roots.setdefault(os.path.realpath(root), root)
    return list(roots.values())


def find_checkpoints(folders: Iterable[str | None], prefer_run: str | None = None) -> list[CheckpointEntry]:
    """Every `ckpt-NNNNNN/adapter.gguf` under the checkpoint folders of `folders` (see
    `checkpoint_roots`): the run `prefer_run` first, then the most recent runs; the last step first."""
    out = []
    for root in checkpoint_roots(folders):
        run = os.path.basename(root.rstrip(os.sep))[: -len("-checkpoints")]
        for name in os.listdir(root):
            m = _CKPT.match(name)
            path = os.path.join(root, name, "adapter.gguf")
            if m and os.path.isfile(path):
                out.append(CheckpointEntry(path, run, int(m.group(1)), os.path.getmtime(path)))
    newest: dict[str, float] = {}
    for c in out:
        newest[c.run] = max(newest.get(c.run, 0.0), c.mtime)
    out.sort(key=lambda c: (c.run != prefer_run, -newest[c.run], c.run, -c.step))
    return out


def _run_of(adapter_path: str | None) -> str | None:
    if not adapter_path:
        return None
    return os.path.splitext(os.path.basename(adapter_path))[0]


def suggest_out(source: str, merge: bool, qtype: str | None) -> str:
    """A name beside the source: run.f16.gguf, run.merged.gguf, run-step40.q8_0.gguf (checkpoints go
    beside their run's folder)."""
    parent = os.path.dirname(source)
    m = _CKPT.match(os.path.basename(parent))
    root = os.path.dirname(parent)
    if m and root.endswith("-checkpoints"):
        folder = os.path.dirname(root)
        stem = f"{os.path.basename(root)[: -len('-checkpoints')]}-step{int(m.group(1))}"
    else:
        folder, stem = parent, os.path.splitext(os.path.basename(source))[0]
        for suffix in (*(f".{t.lower()}" for t in ADAPTER_TYPES), ".merged"):
            stem = stem.removesuffix(suffix)
    kind = ("merged" if qtype is None else f"merged-{qtype.lower()}") if merge else (qtype or "F32").lower()
    return os.path.join(folder, f"{stem}.{kind}.gguf")


# --- the worker ------------------------------------------------------------------------------------


class ExportWorker(QObject):
    """Runs fn(on_progress, should_stop) once; host data only crosses its signals."""

    sig_progress = Signal(int, int)  # done, total
    sig_done = Signal(object)
    sig_error = Signal(str)
    sig_finished = Signal()

    def __init__(self, fn: Callable[[Callable[[int, int], None], Callable[[], bool]], object], stop):
        super().__init__()
        self.fn = fn
        self.stop = stop  # threading.Event owned by the caller

    @Slot()
    def run(self) -> None:
        try:
            self.sig_done.emit(self.fn(self.sig_progress.emit, self.stop.is_set))
        except MemoryError:
            self.sig_error.emit("out of memory: close other programs, or export an adapter instead")
        except Exception as exc:  # noqa: BLE001 - every failure reaches the window
            self.sig_error.emit(str(exc) or type(exc).__name__)
        finally:
            return_to_ui_thread(self)  # deleted there (see studio.tasks)
            self.sig_finished.emit()


def start_worker(fn, stop: threading.Event, on_done, on_error, on_progress=None) -> QThread:
    """An ExportWorker in its own QThread (studio.tasks.start_in_thread), connected and started."""
    worker = ExportWorker(fn, stop)
    thread = start_in_thread(worker, "tune-studio-export", start=False)
    worker.sig_done.connect(on_done)
    worker.sig_error.connect(on_error)
    if on_progress is not None:
        worker.sig_progress.connect(on_progress)
    thread.start()
    return thread


# --- the dialog ------------------------------------------------------------------------------------


class ExportDialog(QDialog):
    """Choose a source and what to write, check, export with progress, verify; see the module docstring.

    Signals: sig_checked(CheckReport), sig_exported(path), sig_verified(VerifyReport), sig_failed(message)
    (a cancelled merge reports sig_failed too, with `cancelled` True).
    """

    sig_checked = Signal(object)
    sig_exported = Signal(str)
    sig_verified = Signal(object)
    sig_failed = Signal(str)

    def __init__(
        self,
        project: Project,
        adapter_path: str | None = None,
        parent: QWidget | None = None,
        info: ModelInfo | None = None,
    ):
        super().__init__(parent)
        self.project = project
        self.info = info
        self.adapter_path = adapter_path or None
        self.report: CheckReport | None = None
        self.verify_report: VerifyReport | None = None
        self.written: tuple[ExportRequest, LoraAdapter, str] | None = None
        self.cancelled = False
        self._busy = False  # a worker is at work (its thread may still be ending after it reports)
        self._phase = ""
        self._stop = threading.Event()
        self._close_when_done = False
        self._writing: tuple[ExportRequest, LoraAdapter] | None = None
        self._out_auto = True
        self.setWindowTitle("Export")
        self.setAcceptDrops(True)  # drop an adapter .gguf to export it
        self.resize(800, 760)
        self._build()
        self.refresh_sources()
        self._suggest()
        self._set_status("Press Check (Ctrl+K) to run the checks; Export is enabled when they pass.")

    # --- building ------------------------------------------------------------------------------
    def _build(self) -> None:
        layout = QVBoxLayout(self)

        src_box = QGroupBox("Source")
        self.source_combo = QComboBox()
        self.source_combo.setToolTip(
            "The adapter to export: the last training run's, one of its checkpoints, or any adapter file"
        )
        self.source_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        browse = QPushButton("Choose file…")
        browse.setToolTip("Export any LoRA adapter (.gguf)")
        browse.clicked.connect(self._choose_source)
        row = QHBoxLayout()
        row.addWidget(self.source_combo, 1)
        row.addWidget(browse)
        self.source_label = QLabel()
        self.source_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.source_label.setStyleSheet("QLabel { color: #5f6368; }")
        self.base_label = QLabel()
        self.base_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.base_label.setStyleSheet("QLabel { color: #5f6368; }")
        src_form = QFormLayout(src_box)
        src_form.addRow("Adapter:", row)
        src_form.addRow("", self.source_label)
        src_form.addRow("Base model:", self.base_label)
        layout.addWidget(src_box)

        kind_box = QGroupBox("What to write")
        self.adapter_radio = QRadioButton("&Adapter GGUF — for llama-cli --lora and llama-export-lora")
        self.merged_radio = QRadioButton("&Merged model GGUF — the base model with the adapter folded in")
        self.adapter_radio.setChecked(True)
        self.kind_group = QButtonGroup(self)
        self.kind_group.addButton(self.adapter_radio)
        self.kind_group.addButton(self.merged_radio)
        self.type_combo = QComboBox()
        for t, tip in (
            ("F32", "exact (default)"),
            ("F16", "half the size; llama-export-lora merges it"),
            ("Q8_0", "about a quarter; llama-cli --lora only, F16 where rows are not a multiple of 32"),
        ):
            self.type_combo.addItem(f"{t} — {tip}", t)
        self.type_combo.setToolTip(
            "Tensor type of the adapter file. Default F32. llama-export-lora merges only F16 and F32 "
            "adapters; Q8_0 writes F16 for tensors whose rows are not a multiple of 32."
        )
        self.scale_spin = QDoubleSpinBox()
        self.scale_spin.setRange(-10.0, 10.0)
        self.scale_spin.setSingleStep(0.1)
        self.scale_spin.setDecimals(3)
        self.scale_spin.setValue(1.0)
        self.scale_spin.setToolTip("How strongly the adapter is merged: W + scale·alpha/r·B·A. Default 1.")
        self.merge_type_combo = QComboBox()
        self.merge_type_combo.addItem("Keep each tensor's type (default)", None)
        for t in MERGE_TYPES:
            self.merge_type_combo.addItem(t, t)
        self.merge_type_combo.setToolTip(
            "Type of the merged tensors. Default: each keeps the base model's type (re-quantized after "
            "merging). Tensors that are not merged are copied byte for byte."
        )
        adapter_opts, merged_opts = QWidget(), QWidget()
        f1 = QFormLayout(adapter_opts)
        f1.setContentsMargins(0, 0, 0, 0)
        f1.addRow("Type:", self.type_combo)
        f2 = QFormLayout(merged_opts)
        f2.setContentsMargins(0, 0, 0, 0)
        f2.addRow("Scale:", self.scale_spin)
        f2.addRow("Tensor type:", self.merge_type_combo)
        self.adapter_options, self.merged_options = adapter_opts, merged_opts
        merged_opts.hide()
        self.note_label = QLabel()
        self.note_label.setWordWrap(True)
        self.note_label.setStyleSheet("QLabel { color: #5f6368; }")
        kind_layout = QVBoxLayout(kind_box)
        kind_layout.addWidget(self.adapter_radio)
        kind_layout.addWidget(self.merged_radio)
        kind_layout.addWidget(adapter_opts)
        kind_layout.addWidget(merged_opts)
        kind_layout.addWidget(self.note_label)
        layout.addWidget(kind_box)

        out_box = QGroupBox("Write to")
        self.out_edit = QLineEdit()
        self.out_edit.setToolTip(
            "The file to write (.gguf). It is written to a temporary name and renamed into place, so a "
            "failed or cancelled export leaves an existing file as it was."
        )
        out_browse = QPushButton("Choose…")
        out_browse.clicked.connect(self._choose_out)
        out_row = QHBoxLayout(out_box)
        out_row.addWidget(self.out_edit, 1)
        out_row.addWidget(out_browse)
        layout.addWidget(out_box)

        check_box = QGroupBox("Checks")
        self.check_tree = QTreeWidget()
        self.check_tree.setColumnCount(2)
        self.check_tree.setHeaderLabels(["Check", "Result"])
        self.check_tree.setRootIsDecorated(False)
        self.check_tree.setWordWrap(True)
        self.check_tree.setSelectionMode(QAbstractItemView.NoSelection)
        self.check_tree.header().setSectionResizeMode(0, QHeaderView.ResizeToContents)
        self.check_tree.header().setStretchLastSection(True)
        self.check_tree.setMinimumHeight(190)
        cl = QVBoxLayout(check_box)
        cl.addWidget(self.check_tree)
        layout.addWidget(check_box, 1)

        self.progress = QProgressBar()
        self._bar("idle")
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        layout.addWidget(self.progress)
        layout.addWidget(self.status_label)

        verify_box = QGroupBox("Verification: the written file reloaded, logits compared")
        self.verify_table = QTableWidget(0, 5)
        self.verify_table.setHorizontalHeaderLabels(
            ["Prompt", "Tokens", "max |Δ|", "of largest logit", "Beyond tolerance"]
        )
        self.verify_table.horizontalHeaderItem(4).setToolTip(
            "Positions whose logits moved more than the written type allows"
        )
        self.verify_table.verticalHeader().hide()
        self.verify_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.verify_table.setSelectionMode(QAbstractItemView.NoSelection)
        self.verify_table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        for c in (1, 2, 3, 4):
            self.verify_table.horizontalHeader().setSectionResizeMode(c, QHeaderView.ResizeToContents)
        self.verify_table.verticalHeader().setDefaultSectionSize(24)
        rows = len(VERIFY_PROMPTS)
        self.verify_table.setFixedHeight(
            self.verify_table.horizontalHeader().sizeHint().height() + 24 * rows + 4
        )
        self.verdict_label = QLabel("Not verified yet: export first.")
        self.verdict_label.setWordWrap(True)
        self.verdict_label.setAlignment(Qt.AlignLeft | Qt.AlignTop)
        self.verdict_label.setMinimumHeight(self.verdict_label.fontMetrics().lineSpacing() * 4 + 4)
        self.verdict_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        vl = QVBoxLayout(verify_box)
        vl.addWidget(self.verify_table)
        vl.addWidget(self.verdict_label)
        layout.addWidget(verify_box)

        self.check_button = QPushButton("&Check")
        self.check_button.setShortcut(QKeySequence("Ctrl+K"))
        self.check_button.setToolTip("Run the checks before writing (Ctrl+K)")
        self.check_button.clicked.connect(self.check)
        self.export_button = QPushButton("&Export")
        self.export_button.setShortcut(QKeySequence("Ctrl+E"))
        self.export_button.setToolTip("Write the file, then reload it and compare logits (Ctrl+E)")
        self.export_button.clicked.connect(self.export)
        self.verify_button = QPushButton("&Verify")
        self.verify_button.setToolTip("Reload the written file and compare its logits again")
        self.verify_button.clicked.connect(self.verify)
        self.cancel_button = QPushButton("Ca&ncel")
        self.cancel_button.setToolTip("Stop a merge between tensors; the target is left as it was")
        self.cancel_button.clicked.connect(self.cancel)
        self.close_button = QPushButton("Close")
        self.close_button.clicked.connect(self.reject)
        buttons = QHBoxLayout()
        for b in (self.check_button, self.export_button, self.verify_button, self.cancel_button):
            b.setAutoDefault(False)
            buttons.addWidget(b)
        buttons.addStretch(1)
        self.close_button.setAutoDefault(False)
        buttons.addWidget(self.close_button)
        layout.addLayout(buttons)

        self.source_combo.currentIndexChanged.connect(self._source_changed)
        self.adapter_radio.toggled.connect(self._kind_changed)
        self.type_combo.currentIndexChanged.connect(self._settings_changed)
        self.merge_type_combo.currentIndexChanged.connect(self._settings_changed)
        self.scale_spin.valueChanged.connect(self._settings_changed)
        self.out_edit.textEdited.connect(self._out_edited)
        self.out_edit.textChanged.connect(lambda _: self._invalidate())

    # --- sources ---------------------------------------------------------------------------------
    def refresh_sources(self) -> None:
        """Fill the source list: the current adapter, the run's checkpoints, files chosen before."""
        current = self.source_path()
        chosen = [
            self.source_combo.itemData(i)
            for i in range(self.source_combo.count())
            if self.source_combo.itemText(i).startswith("File ·")
        ]
        self.source_combo.blockSignals(True)
        self.source_combo.clear()
        if self.adapter_path:
            self.source_combo.addItem(
                f"Current adapter · {os.path.basename(self.adapter_path)}", self.adapter_path
            )
        cfg = self.project.config
        run_ckpts = os.path.splitext(self.adapter_path)[0] + "-checkpoints" if self.adapter_path else None
        self.checkpoints = find_checkpoints(
            [run_ckpts, cfg.checkpoint_dir, self.project.output_folder()], _run_of(self.adapter_path)
        )
        for c in self.checkpoints:
            self.source_combo.addItem(c.label(), c.path)
        for path in chosen:
            self.source_combo.addItem(f"File · {os.path.basename(path)}", path)
        for i in range(self.source_combo.count()):
            self.source_combo.setItemData(i, self.source_combo.itemData(i), Qt.ToolTipRole)
        if self.source_combo.count() == 0:
            self.source_combo.addItem("No adapter yet: train one, or choose a file", "")
        i = self.source_combo.findData(current) if current else 0
        self.source_combo.setCurrentIndex(max(0, i))
        self.source_combo.blockSignals(False)
        self._source_changed()

    def set_adapter(self, path: str | None) -> None:
        """The current adapter (the last run's): listed first with its run's checkpoints, and selected."""
        self.adapter_path = path or None
        self.refresh_sources()
        if path:
            self.set_source(path)

    def source_path(self) -> str:
        data = self.source_combo.currentData() if self.source_combo.count() else None
        return str(data) if data else ""

    def set_source(self, path: str) -> None:
        """Select `path` as the source (added to the list when it is not there)."""
        i = self.source_combo.findData(path)
        if i < 0:
            if self.source_combo.count() == 1 and not self.source_combo.itemData(0):
                self.source_combo.clear()
            self.source_combo.addItem(f"File · {os.path.basename(path)}", path)
            i = self.source_combo.count() - 1
            self.source_combo.setItemData(i, path, Qt.ToolTipRole)
        self.source_combo.setCurrentIndex(i)
        self._source_changed()

    def _choose_source(self) -> None:
        start = os.path.dirname(self.source_path()) or self.project.output_folder()
        path, _ = QFileDialog.getOpenFileName(self, "Choose adapter", start, "GGUF adapters (*.gguf)")
        if path:
            self.set_source(path)

    def _source_changed(self, *_: object) -> None:
        self.source_label.setText(self.source_path() or "—")
        base = self.project.model_path
        self.base_label.setText(base or "none open: open the base model on the Model page")
        self._settings_changed()

    # --- settings --------------------------------------------------------------------------------
    def request(self) -> ExportRequest:
        merge = self.merged_radio.isChecked()
        return ExportRequest(
            source=self.source_path(),
            out=self.out_edit.text().strip(),
            base=self.project.model_path,
            merge=merge,
            qtype=self.merge_type_combo.currentData() if merge else self.type_combo.currentData(),
            scale=float(self.scale_spin.value()) if merge else 1.0,
        )

    def set_kind(self, merge: bool) -> None:
        (self.merged_radio if merge else self.adapter_radio).setChecked(True)

    def _kind_changed(self, *_: object) -> None:
        merge = self.merged_radio.isChecked()
        self.adapter_options.setVisible(not merge)
        self.merged_options.setVisible(merge)
        self._settings_changed()

    def _settings_changed(self, *_: object) -> None:
        merge = self.merged_radio.isChecked()
        if merge:
            self.note_label.setText(
                "A whole model file: every metadata key, the tokenizer and the chat template are copied; "
                "tensors the adapter does not touch are copied byte for byte."
            )
        else:
            notes = {
                "F32": "Exact. llama-export-lora and llama-cli --lora both read it.",
                "F16": "Half the size. llama-export-lora and llama-cli --lora both read it.",
                "Q8_0": "About a quarter of F32. llama-cli --lora reads it; llama-export-lora merges only "
                "F16/F32 adapters. Tensors whose rows are not a multiple of 32 are written as F16.",
            }
            self.note_label.setText(notes.get(self.type_combo.currentData(), ""))
        self._suggest()
        self._invalidate()

    def _suggest(self) -> None:
        src = self.source_path()
        if self._out_auto and src:
            req = self.request()
            self.out_edit.setText(suggest_out(src, req.merge, req.qtype))

    def _out_edited(self, _text: str) -> None:
        self._out_auto = False

    def _choose_out(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export to", self.out_edit.text(), "GGUF (*.gguf)")
        if path:
            self._out_auto = False
            self.out_edit.setText(path)

    def _invalidate(self) -> None:
        if self.report is not None and self.report.request != self.request():
            self.report = None
            self.check_tree.setEnabled(False)
            self.status_label.setStyleSheet("")
            self.status_label.setText("The settings changed: check again (Ctrl+K) before exporting.")
        self._update_buttons()

    # --- state -----------------------------------------------------------------------------------
    def is_busy(self) -> bool:
        """A check, export or verification is running (the buttons that start one are disabled)."""
        return self._busy

    def _update_buttons(self) -> None:
        busy = self.is_busy()
        ready = self.report is not None and self.report.ok and self.report.request == self.request()
        self.check_button.setEnabled(not busy)
        self.export_button.setEnabled(not busy and ready)
        self.verify_button.setEnabled(not busy and self.written is not None)
        self.cancel_button.setEnabled(busy and self._phase == "export" and self.request().merge)
        for w in (
            self.source_combo,
            self.adapter_radio,
            self.merged_radio,
            self.adapter_options,
            self.merged_options,
            self.out_edit,
        ):
            w.setEnabled(not busy)

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status_label.setStyleSheet(f"QLabel {{ color: {RED}; }}" if error else "")
        self.status_label.setText(text)
        self._update_buttons()

    def _run(self, phase: str, fn, on_done, progress: bool = False) -> None:
        self._phase = phase
        self._stop.clear()
        self.cancelled = False
        self._busy = True
        start_worker(fn, self._stop, on_done, self._failed, self._progress if progress else None)
        self._update_buttons()

    def _end_phase(self) -> bool:
        """The worker has reported: idle again. True when a requested close happened."""
        self._busy = False
        self._phase = ""
        self._update_buttons()
        if self._close_when_done:
            self._close_when_done = False
            super().reject()
            return True
        return False

    def _bar(self, mode: str, done: int = 0, total: int = 1, text: str = "") -> None:
        """The progress bar: idle (empty), busy (indeterminate), tensors (done of total), done."""
        bar = self.progress
        if mode == "busy":
            bar.setRange(0, 0)
            bar.setTextVisible(False)
        elif mode == "tensors":
            bar.setRange(0, max(1, total))
            bar.setValue(done)
            bar.setFormat("%v of %m tensors")
            bar.setTextVisible(total > 1)
        else:
            bar.setRange(0, 1)
            bar.setValue(1 if mode == "done" else 0)
            bar.setFormat(text)
            bar.setTextVisible(bool(text))

    @Slot(int, int)
    def _progress(self, done: int, total: int) -> None:
        self._bar("tensors", done, total)
        if self.request().merge and done < total:
            self.status_label.setText(f"Merging: tensor {done} of {total}…")

    @Slot(str)
    def _failed(self, message: str) -> None:
        self._bar("idle")
        if self._phase == "export" and self._stop.is_set():
            self.cancelled = True
            self._set_status(
                f"Cancelled: nothing was written; {os.path.basename(self.request().out)} is as it was."
            )
        else:
            what = {"check": "The checks could not run", "export": "Export failed", "verify": "Verify failed"}
            hint = {
                "export": " Check again (Ctrl+K); the target is left as it was.",
                "verify": " The file was written; export again as F32 if this persists.",
            }
            self._set_status(
                f"{what.get(self._phase, 'Failed')}: {message}.{hint.get(self._phase, '')}", True
            )
        self._end_phase()
        self.sig_failed.emit(message)

    # --- check -----------------------------------------------------------------------------------
    def check(self) -> None:
        """Run the checks in a worker; sig_checked(CheckReport) when they are done."""
        if self.is_busy():
            return
        req = self.request()
        self.report = None
        self.check_tree.clear()
        self.status_label.setStyleSheet("")
        self.status_label.setText("Checking…")
        self._bar("busy")
        self._run("check", lambda progress, stop: check_export(req), self._checked)

    @Slot(object)
    def _checked(self, report: CheckReport) -> None:
        self._bar("idle")
        self.report = report
        self.check_tree.setEnabled(True)
        self.check_tree.clear()
        for item in report.items:
            row = QTreeWidgetItem([item.text(), item.detail])
            row.setForeground(0, QColor(GREEN if item.ok else RED))
            row.setToolTip(0, item.detail)
            row.setToolTip(1, item.detail)
            self.check_tree.addTopLevelItem(row)
        if report.ok:
            size = f" (about {human_bytes(report.size)})" if report.size else ""
            notes = "".join(f"\nNote: {n}" for n in report.notes)
            what = f"Export writes the {report.request.kind}{size}."
            self._set_status(f"All {len(report.items)} checks passed. {what}{notes}")
        else:
            bad = report.failures()
            # one wrapped paragraph: the label has room for wrapping, not for extra lines
            lines = "; ".join(f"{BAD_MARK} {i.label}: {i.detail}" for i in bad)
            what = "1 check failed; fix it" if len(bad) == 1 else f"{len(bad)} checks failed; fix them"
            self._set_status(f"{what} and check again — {lines}", True)
        self._end_phase()
        self.sig_checked.emit(report)

    def check_texts(self) -> list[str]:
        """The rows of the check list as shown: "✓ label — detail" (notes are in the status line)."""
        out = []
        for i in range(self.check_tree.topLevelItemCount()):
            row = self.check_tree.topLevelItem(i)
            out.append(f"{row.text(0)} — {row.text(1)}")
        return out

    # --- export ----------------------------------------------------------------------------------
    def export(self) -> None:
        """Write the file in a worker (the checks must have passed), then verify it."""
        if self.is_busy() or self.report is None or not self.report.ok or self.report.adapter is None:
            return
        req, adapter = self.report.request, self.report.adapter
        if req != self.request():
            self._invalidate()
            return
        self.written = None
        self.verify_table.setRowCount(0)
        self.verdict_label.setStyleSheet("")
        self.verdict_label.setText("Not verified yet.")
        if req.merge:
            self._bar("tensors", 0, 1)
            self.status_label.setText("Merging…")
        else:
            self._bar("busy")  # indeterminate: one write
            self.status_label.setText(f"Writing the {req.kind}…")
        self.status_label.setStyleSheet("")

        def work(progress, should_stop):
            return write_export(req, adapter, progress, should_stop)

        self._writing = (req, adapter)
        self._run("export", work, self._exported, progress=True)

    @Slot(object)
    def _exported(self, path: str) -> None:
        self._bar("done", text="Written")
        req, adapter = self._writing
        self.written = (req, adapter, path)
        size = human_bytes(os.path.getsize(path)) if os.path.exists(path) else "?"
        self.status_label.setText(f"Wrote {path} ({size}). Verifying…")
        closed = self._end_phase()
        self.sig_exported.emit(path)
        if not closed:
            self.verify()

    def cancel(self) -> None:
        """Ask a running merge to stop between tensors; the target stays as it was."""
        if self.is_busy() and self._phase == "export":
            self._stop.set()
            self.status_label.setText("Cancelling…")
            self.cancel_button.setEnabled(False)

    # --- verify ----------------------------------------------------------------------------------
    def verify(self) -> None:
        """Reload the written file and compare logits in a worker; sig_verified(VerifyReport)."""
        if self.is_busy() or self.written is None:
            return
        req, adapter, path = self.written
        template = self.info.template if self.info is not None and self.info.path == req.base else None
        self._bar("busy")
        self.verdict_label.setStyleSheet("")
        self.verdict_label.setText("Verifying: reloading the file and comparing logits…")
        self._run(
            "verify",
            lambda progress, stop: verify_export(req, adapter, path, template=template),
            self._verified,
        )

    @Slot(object)
    def _verified(self, report: VerifyReport) -> None:
        self._bar("done", text="Written and verified")
        self.verify_report = report
        self.verify_table.setRowCount(len(report.rows))
        for r, row in enumerate(report.rows):
            off = f"{row.n_off} of {row.n_tokens}; others ≤ {row.max_abs_rest:.3g}" if row.n_off else "none"
            rel = f"{row.rel:.1e}" if row.max_abs else "0"
            cells = (row.prompt, str(row.n_tokens), f"{row.max_abs:.3g}", rel, off)
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c:
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.verify_table.setItem(r, c, item)
        mark = OK_MARK if report.ok else BAD_MARK
        notes = f" ({'; '.join(report.notes)})" if report.notes else ""
        self.verdict_label.setStyleSheet(f"QLabel {{ color: {GREEN if report.ok else RED}; }}")
        self.verdict_label.setText(f"{mark} {report.verdict()}{notes}")
        self._set_status(f"Wrote and verified {report.path}.", error=not report.ok)
        self._end_phase()
        self.sig_verified.emit(report)

    # --- drag and drop -------------------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt's name
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        if len(urls) == 1 and urls[0].toLocalFile().lower().endswith(".gguf") and not self.is_busy():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt's name
        """A dropped .gguf adapter becomes the source."""
        self.set_source(event.mimeData().urls()[0].toLocalFile())
        event.acceptProposedAction()

    # --- closing ---------------------------------------------------------------------------------
    def reject(self) -> None:
        """Close; while a worker runs, stop a merge and close when it has ended (never kill a thread)."""
        if self.is_busy():
            self._close_when_done = True
            self.cancel()
            self.status_label.setText("Closing when the current step ends…")
            return
        super().reject()


__all__ = [
    "ADAPTER_TYPES",
    "CheckItem",
    "CheckReport",
    "CheckpointEntry",
    "ExportDialog",
    "ExportRequest",
    "ExportWorker",
    "MERGE_TYPES",
    "PromptResult",
    "TOLERANCE",
    "VERIFY_PROMPTS",
    "VerifyReport",
    "check_export",
    "estimate_size",
    "find_checkpoints",
    "suggest_out",
    "verify_export",
    "write_export",
]
