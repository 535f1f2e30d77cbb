"""Before and after writing an export: the checks, the file names, the checkpoints a run left.

- `check_export(request)` -> `CheckReport`: the source adapter reads; the base model reads; the
  architecture matches; every adapted tensor exists in the base with shapes that fit; the target
  folder exists and is writable; there is enough free disk space for the estimated size; the output
  name ends in .gguf and overwrites neither the base model nor the source adapter. Reads headers
  and the adapter only.
- `write_export(request, adapter, on_progress, should_stop)` writes atomically
  (`export_adapter` or `export_merged`: a temporary file, then a rename).
- `find_checkpoints(folders)` lists the trainer's `<run>-checkpoints/ckpt-NNNNNN/adapter.gguf`;
  `suggest_out` names an export beside its source.

The reload-and-compare check after writing is `engine.export.verify` (it needs the model). The
studio's export dialog and `tune-engine export --check` both use this module.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..errors import ConfigError, EngineError, ExportError
from ..io.files import check_outputs
from ..io.gguf_file import GGUFFile
from ..model.generate import SamplingConfig
from ..model.lora import LoraAdapter
from ..model.summary import human_bytes
from ..ranges import check_number
from .modelfile import ModelfilePlan, modelfile_conflict, modelfile_path, plan_modelfile, write_modelfile
from .write import (
    ADAPTER_TYPES,
    FLOAT_TYPES,
    adapter_tensor_types,
    export_adapter,
    export_merged,
    export_size,
    fit_problems,
    merged_tensor_types,
)

MERGE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q4_K")  # offered for merged tensors, besides the
# default (None: a type that keeps the update) and "base" (re-quantized to the base's own types)
MIN_EFFECT_KEPT = 0.5  # engine.export.verify's: a merged file keeping less of the fine-tune fails
_DISK_MARGIN = 1 << 20  # bytes kept free beyond the estimate
_CKPT = re.compile(r"^ckpt-(\d+)$")
OK_MARK, BAD_MARK = "✓", "✗"


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
    modelfile: bool = False  # also write an Ollama Modelfile beside `out` (when the template translates)
    sampling: SamplingConfig | None = None  # the Modelfile's PARAMETERs (None: the Chat page's defaults)

    def __post_init__(self) -> None:
        check_number("adapter_scale", self.scale, label="adapter scale", error=ExportError)

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
    modelfile: ModelfilePlan | None = None  # what the Modelfile will say; None: none will be written
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
        # checks that failed only because an earlier one did ("needs a readable adapter ...") add nothing
        first = [i for i in bad if not i.detail.startswith("needs ")] or bad
        return "Cannot export: " + "; ".join(i.detail for i in first) + "."


def estimate_size(request: ExportRequest, adapter: LoraAdapter, base: GGUFFile | None) -> int:
    """Bytes the written file will take, about (header included)."""
    if request.merge:
        return export_size(adapter, qtype=request.qtype, base=base)
    return export_size(adapter, qtype=request.qtype or "F32")


def check_export_paths(request: ExportRequest) -> None:
    """ConfigError when the output, or the Modelfile written beside it, is the base model or the
    source adapter (or a link to either): the rule every command's outputs follow
    (engine.io.files.check_outputs)."""
    outputs = {"output": request.out}
    if request.modelfile and request.out:
        outputs["Modelfile"] = modelfile_path(request.out)
    check_outputs(
        outputs, {"base model": request.base, "source adapter": request.source},
        kinds={"output": "model" if request.merge else "adapter"},
    )  # fmt: skip
    conflict = modelfile_conflict(request.out) if request.modelfile and request.out else None
    if conflict:  # never written over without a word: the person decides what becomes of it
        raise ConfigError(
            f"{conflict}: it is kept. Delete or rename it, export under another name, or export "
            "without the Modelfile"
        )


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
        items.append(CheckItem(False, label, "no base model given: open it (Model page) or pass --model"))
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
        items.append(
            CheckItem(False, label, f"the folder {folder} does not exist: create it or choose another folder")
        )
    elif not os.access(folder, os.W_OK | os.X_OK):
        items.append(CheckItem(False, label, f"the folder {folder} is not writable: choose another folder"))
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
        short = f"not enough disk space in {folder}: the file needs about {human_bytes(size)}, "
        short += f"{human_bytes(free)} are free: free some space or choose another folder"
        items.append(CheckItem(free >= need, label, detail if free >= need else short))
    label = "Output name"
    name_problem = None
    if not out:
        name_problem = "choose a file name"
    elif not out.lower().endswith(".gguf"):
        name_problem = "the file name must end in .gguf"
    elif os.path.isdir(out):
        name_problem = f"{out} is a folder: give a file name ending in .gguf"
    else:
        try:
            check_export_paths(request)
        except ConfigError as exc:
            name_problem = str(exc)
    if name_problem:
        items.append(CheckItem(False, label, name_problem))
    elif os.path.exists(out):
        items.append(CheckItem(True, label, f"{os.path.basename(out)} exists and will be replaced"))
    else:
        items.append(CheckItem(True, label, f"{os.path.basename(out)} (a new file)"))
    plan = _modelfile_check(request, base, out, items, notes)
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
        notes.extend(merge_notes(request, adapter, base, size))
        if request.scale != 1.0:
            notes.append(f"The adapter is merged at scale {request.scale:g}.")
    if base is not None:
        base.close()
    return CheckReport(request, items, notes, size, modelfile=plan, adapter=adapter)


def _modelfile_check(
    request: ExportRequest, base: GGUFFile | None, out: str, items: list[CheckItem], notes: list[str]
) -> ModelfilePlan | None:
    """The Modelfile's plan, when asked for and the template translates; a note says why not.

    An untranslatable template does not block the export (a note); a Modelfile path that names an
    input is refused with the export's own name ("Output name": `check_export_paths`)."""
    if not request.modelfile:
        return None
    if base is None:
        return None
    try:
        plan = plan_modelfile(base.metadata, request.sampling)
    except EngineError as exc:
        notes.append(f"No Ollama Modelfile will be written: {exc}.")
        return None
    stops = ", ".join(plan.stops) or "none"
    path = modelfile_path(out)
    name = os.path.basename(path)
    if os.path.exists(path) and modelfile_conflict(out) is None:
        name += ", replacing the one an earlier export of this file wrote"
    notes.append(
        f"An Ollama Modelfile will be written beside it ({name}; {plan.format.family} template, "
        f"stop {stops}): ollama create NAME -f {path}"
    )
    if plan.format.system == "none":
        notes.append("The model's template takes no system message: Ollama's system prompt is left out.")
    return plan


def merge_notes(request: ExportRequest, adapter: LoraAdapter, base: GGUFFile, size: int) -> list[str]:
    """What a merge writes, in words: which adapted tensors change type and why, what it costs in
    size, and for a re-quantizing merge that what survives is measured after writing."""
    types = merged_tensor_types(adapter, base, request.qtype)
    changed = {n: t for n, t in types.items() if t != base.tensors[n].qtype}
    base_size = os.path.getsize(base.path)
    grown = f"{human_bytes(base_size)} -> about {human_bytes(size)}" if size else ""
    stored = sorted({base.tensors[n].qtype for n in changed})
    lossy = sorted({t for t in types.values() if t not in FLOAT_TYPES})
    notes = []
    if request.qtype is None and changed:
        notes.append(
            f"{len(changed)} of {len(types)} adapted tensors are stored as {'/'.join(stored)} in the base "
            "and are written as F16, so that the fine-tune survives the merge (re-quantizing W + ΔW rounds "
            f"most of a LoRA update away); the other tensors keep their type. Size: {grown}."
        )
    elif changed:
        example = next(iter(changed))
        notes.append(
            f"{len(changed)} of {len(types)} merged tensors change type "
            f"(e.g. {example}: {base.tensors[example].qtype} -> {changed[example]}). Size: {grown}."
        )
    if lossy and request.qtype is not None:
        notes.append(
            f"Re-quantizing adapted tensors to {'/'.join(lossy)} can round the fine-tune away: after "
            "writing, the share of the adapter's effect on the logits that the file keeps is measured, "
            f"and a file keeping less than {MIN_EFFECT_KEPT:.0%} fails (renamed *.failed.gguf)."
        )
    return notes


# --- writing ---------------------------------------------------------------------------------------


def write_export(
    request: ExportRequest,
    adapter: LoraAdapter,
    on_progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> str:
    """Write the file atomically; returns its path. ExportError when cancelled (nothing changed),
    ConfigError when the output (or its Modelfile) is one of the inputs (nothing written). The
    Modelfile is written by `export_modelfile` once the file has passed its verification."""
    check_export_paths(request)
    return _write_file(request, adapter, on_progress, should_stop)


def export_modelfile(request: ExportRequest) -> str | None:
    """Write the Modelfile of a written export (`request.modelfile`); its path, or None when not
    asked for or the model's template cannot be translated (the check's note says why).
    ConfigError when the Modelfile would replace an input (`check_export_paths`)."""
    if not request.modelfile or not request.base:
        return None
    check_export_paths(request)
    with GGUFFile(request.base) as base:
        metadata = base.metadata
    try:
        plan = plan_modelfile(metadata, request.sampling)
    except EngineError:
        return None
    return write_modelfile(plan, request.out, merged=request.merge, base=request.base)


def _write_file(
    request: ExportRequest,
    adapter: LoraAdapter,
    on_progress: Callable[[int, int], None] | None,
    should_stop: Callable[[], bool] | None,
) -> str:
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


def run_of(adapter_path: str | None) -> str | None:
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
