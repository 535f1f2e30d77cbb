"""The record of a run: what was trained, how far it got, how the loss went, what it wrote.

A `RunRecord` is written as `run.json` into the run's checkpoint folder (or beside its adapter,
`<adapter stem>.run.json`, when it has no checkpoint folder), atomically, when the run starts, at
each checkpoint, when it pauses and when it ends. `find_runs(folders)` reads every record under
some folders, newest first, so the app's run history and a person with a file browser see the same
runs; `latest_finished` picks what Rewards and Export should start from (a stopped two-step run
never replaces a finished one).

Only host data: names, numbers, paths. Reading a broken or foreign `run.json` skips it (logged),
never raises: the history must open whatever is in the folder.
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone

from ..io.files import atomic_write

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
STATUSES = ("running", "paused", "finished", "stopped", "failed")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Curve(Sequence):
    """A curve of a run, its (step, value) points, held as two arrays: 16 bytes a point where a list of
    `[step, value]` lists took about 100, so the app can keep the records of hundreds of runs (the Runs
    page, the adapter choices) without their loss histories growing the process by tens of MiB
    (`bench/soak.py app`: about 14 KB of Python objects per 150-step run listed). Reads as a sequence
    of `(step, value)` tuples; equal to any sequence of the same pairs; written as `[[step, value]]`."""

    __slots__ = ("_steps", "_values")

    def __init__(self, points: Iterable[Sequence[float]] = ()):
        self._steps = array("q")
        self._values = array("d")
        for point in points:
            self.append(point)

    def append(self, point: Sequence[float]) -> None:
        step, value = point
        self._steps.append(int(step))
        self._values.append(float(value))

    def __len__(self) -> int:
        return len(self._steps)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return Curve(zip(self._steps[i], self._values[i], strict=True))
        return (self._steps[i], self._values[i])

    def __iter__(self) -> Iterator[tuple[int, float]]:
        return zip(self._steps, self._values, strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Curve):
            return self._steps == other._steps and self._values == other._values
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(
                tuple(a) == tuple(b) for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    def __reduce__(self):  # pickles and copies as its points
        return (Curve, (list(self),))

    __hash__ = None  # type: ignore[assignment]  (mutable, like the lists it replaces)

    def __repr__(self) -> str:
        return f"Curve({[list(p) for p in self]!r})"

    def to_json(self) -> list[list[float]]:
        return [[s, v] for s, v in self]


@dataclass
class RunRecord:
    """One training run or reward session, as the history shows it."""

    name: str  # readable: "<dataset stem>-<date-time>", or the rewards session's folder
    kind: str = "training"  # "training" | "rewards"
    model: str = ""  # base model path
    dataset: str = ""  # dataset path, or "N samples (edited)" when the editor's samples were trained
    targets: list[str] = field(default_factory=list)  # adapted tensor kinds, e.g. ["attn_q", "ffn_up_exps"]
    n_targets: int = 0  # adapted tensors
    full: list[str] = field(default_factory=list)  # tensors trained in full
    rank: int = 0
    alpha: float = 0.0
    steps_planned: int = 0
    steps_done: int = 0
    status: str = "running"  # one of STATUSES
    message: str = ""  # why it failed
    final_loss: float | None = None  # mean cross-entropy of the last step
    best_loss: float | None = None  # lowest mean cross-entropy of any step
    best_val_loss: float | None = None
    adapter: str | None = None  # the adapter file it wrote (or will write)
    checkpoints: str | None = None  # its checkpoint folder
    last_checkpoint: str | None = None
    started: str = field(default_factory=now_iso)
    updated: str = field(default_factory=now_iso)
    losses: Curve = field(default_factory=Curve)  # (step, mean cross-entropy)
    val_losses: Curve = field(default_factory=Curve)  # (step, validation loss)
    config: dict = field(default_factory=dict)  # the TrainConfig (or reward settings) as JSON
    sample_answers: list[list] = field(default_factory=list)  # [step, prompt, answer] (SampleAnswers)
    path: str = field(default="", compare=False)  # where this record was read from / written to

    @property
    def label(self) -> str:
        """One line for people: name, status and how far."""
        what = "rating rounds" if self.kind == "rewards" else "steps"
        at = f" at step {self.steps_done}" if self.status in ("stopped", "failed", "paused") else ""
        state = self.status + at
        return f"{self.name} — {state}, {self.steps_done}/{self.steps_planned or '?'} {what}"

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    def add_loss(self, step: int, loss: float) -> None:
        if not math.isfinite(loss):
            return
        self.losses.append((step, loss))
        self.final_loss = float(loss)
        self.best_loss = float(loss) if self.best_loss is None else min(self.best_loss, float(loss))
        self.steps_done = max(self.steps_done, int(step))

    def add_val_loss(self, step: int, loss: float) -> None:
        if not math.isfinite(loss):
            return
        self.val_losses.append((step, loss))
        self.best_val_loss = (
            float(loss) if self.best_val_loss is None else min(self.best_val_loss, float(loss))
        )

    def add_sample_answers(self, step: int, prompts: list[str], answers: list[str]) -> None:
        self.sample_answers.extend([int(step), p, a] for p, a in zip(prompts, answers, strict=True))

    def cut_at(self, step: int) -> None:
        """Forget what came after `step` (a run resumed from the checkpoint of that step goes on
        from there: its curves and sample answers after it are taken again)."""
        self.losses = Curve(x for x in self.losses if x[0] <= step)
        self.val_losses = Curve(x for x in self.val_losses if x[0] <= step)
        self.sample_answers = [x for x in self.sample_answers if x[0] <= step]

    def __post_init__(self) -> None:
        for name in ("losses", "val_losses"):  # records made from JSON (lists) or by hand
            if not isinstance(getattr(self, name), Curve):
                setattr(self, name, Curve(getattr(self, name)))

    def to_json(self) -> dict:
        d = asdict(replace(self, losses=Curve(), val_losses=Curve()))
        d.pop("path")
        d["losses"], d["val_losses"] = self.losses.to_json(), self.val_losses.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict, path: str = "") -> RunRecord:
        known = {f.name for f in fields(cls)} - {"path"}
        rec = cls(**{k: v for k, v in d.items() if k in known})
        rec.path = path
        return rec

    def write(self, path: str | None = None) -> str:
        """Write atomically (temporary file, then rename); returns the path. OSError propagates."""
        path = path or self.path
        if not path:
            raise ValueError("a run record needs a path")
        self.updated = now_iso()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with atomic_write(path) as f:
            json.dump(self.to_json(), f, indent=1, allow_nan=False)
        self.path = path
        return path


def tensor_kinds(names: Iterable[str]) -> list[str]:
    """The kinds of some tensor names, sorted: blk.3.attn_q.weight -> attn_q."""
    return sorted({re.sub(r"^blk\.\d+\.", "", n).removesuffix(".weight") for n in names})


def record_path(checkpoint_dir: str | None, adapter: str | None) -> str | None:
    """Where a run's record goes: its checkpoint folder, else beside its adapter; None without either."""
    if checkpoint_dir:
        return os.path.join(checkpoint_dir, RUN_FILE)
    if adapter:
        stem = adapter[:-5] if adapter.endswith(".gguf") else adapter
        return stem + ".run.json"
    return None


def read_run(path: str) -> RunRecord | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or "name" not in data:
            raise ValueError("not a run record")
        return RunRecord.from_json(data, path)
    except (OSError, ValueError, TypeError) as exc:
        log.warning("%s: skipped (%s)", path, exc)
        return None


def find_runs(
    folders: Iterable[str | None], read: Callable[[str], RunRecord | None] = read_run
) -> list[RunRecord]:
    """Every run record in `folders` (and one level of sub-folders: checkpoint folders), newest first.
    read: how a record file is read (`read_run`; the app passes one that keeps unchanged records)."""
    seen: dict[str, RunRecord] = {}
    for folder in folders:
        if not folder or not os.path.isdir(folder):
            continue
        patterns = (RUN_FILE, "*.run.json", f"*/{RUN_FILE}", "*/*.run.json")  # a run's folder, or beside
        pattern = [os.path.join(glob.escape(folder), p) for p in patterns]
        for path in (p for pat in pattern for p in glob.glob(pat)):
            real = os.path.realpath(path)
            if real in seen:
                continue
            rec = read(path)
            if rec is not None:
                seen[real] = rec
    return sorted(seen.values(), key=lambda r: (r.updated, r.started), reverse=True)


def latest_finished(runs: Iterable[RunRecord], kind: str | None = None) -> RunRecord | None:
    """The newest run that finished and wrote an adapter (of `kind` when given)."""
    for r in runs:  # newest first
        if r.finished and r.adapter and os.path.exists(r.adapter) and (kind is None or r.kind == kind):
            return r
    return None


__all__ = [
    "RUN_FILE", "STATUSES", "Curve", "RunRecord", "find_runs", "latest_finished", "read_run", "record_path",
    "tensor_kinds",
]  # fmt: skip


def run_from_events(path: str) -> RunRecord | None:
    """The record of a run as its events file tells it (a run started by hand, on other machines:
    `tune-engine train ... --events FILE`), read again whole; None when the file holds no run yet.
    Its `path` is the events file; `updated` is the file's modification time."""
    from .events import (
        Checkpoint,
        Eval,
        Failed,
        Finished,
        Paused,
        SampleAnswers,
        Started,
        Step,
        follow_events,
    )

    events, _ = follow_events(path)
    starts = [i for i, e in enumerate(events) if isinstance(e, Started)]
    if not starts:
        return None
    plan = events[starts[-1]].plan  # a resumed run appends a new start: its curve goes on
    stem = os.path.basename(path)
    for suffix in (".jsonl", ".json", "-events", ".events"):
        stem = stem.removesuffix(suffix)
    rec = RunRecord(
        name=stem, model=plan.model, dataset=plan.dataset, targets=tensor_kinds(plan.lora_targets),
        n_targets=len(plan.lora_targets), full=list(plan.full_tensors), steps_planned=plan.total_steps,
        rank=plan.lora_rank, alpha=plan.lora_alpha,
        steps_done=plan.start_step,
    )  # fmt: skip
    for e in events:
        if isinstance(e, Started):
            rec.cut_at(e.plan.start_step)
            rec.status, rec.message = "running", ""
        elif isinstance(e, Step):
            rec.add_loss(e.step, e.mean_ce)
        elif isinstance(e, Eval):
            rec.add_val_loss(e.step, e.mean_ce)
        elif isinstance(e, SampleAnswers):
            rec.add_sample_answers(e.step, e.prompts, e.answers)
        elif isinstance(e, Checkpoint):
            rec.last_checkpoint = e.path
            rec.checkpoints = os.path.dirname(e.path)
        elif isinstance(e, Paused):
            rec.status = "paused"
        elif isinstance(e, Finished):
            rec.status = "stopped" if e.stopped else "finished"
            rec.adapter = e.adapter_path or rec.adapter
            rec.last_checkpoint = e.checkpoint_path or rec.last_checkpoint
        elif isinstance(e, Failed):
            rec.status, rec.message = "failed", e.message
            rec.last_checkpoint = e.checkpoint_path or rec.last_checkpoint
    rec.path = path
    try:
        rec.updated = datetime.fromtimestamp(os.path.getmtime(path), timezone.utc).isoformat()
        rec.started = rec.updated
    except OSError:
        pass
    return rec
