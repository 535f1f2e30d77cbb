"""The dataset being edited, as plain Python that pages observe: samples, file, history, dirty flag.

A `DatasetDocument` holds the list of engine `Sample`s (frozen) in dataset order, the file they
were read from or last saved to, what reading that file found, an undo/redo history and a dirty
flag. Every change goes through it: `insert`, `remove`, `move` and `edit` are undoable steps
(`undo`, `redo`); `open` and `reset` replace everything and start a new history; `save` writes
the file with the engine's `save_jsonl` (atomic: a failed save leaves the file, the samples and
the dirty flag as they were). The document is dirty when it differs from its file: undoing back
to the state last opened or saved makes it clean again.

Observers (`subscribe(callback)`) hear each change as a `DatasetChange` right after it happened:
rows inserted, removed, moved or changed, a reset, the file path, the history (with the positions
a step touched, so that a view can select them) and the dirty flag.

Consecutive edits of the same sample with the same `key` (a field and an editing session) merge
into one step, so that typing a word is one undo, except across the saved state, which stays
reachable by undo (as Qt's QUndoStack does).

What this module is not: no Qt (`studio.dataset_model.SamplesModel` adapts a document for views),
no token counting, no questions to the person (the Dataset page asks before discarding changes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from engine import (
    DatasetError,
    EngineError,
    Problem,
    Sample,
    check_outputs,
    load_jsonl,
    parse_sample,
    sample_to_json,
    save_jsonl,
)

ChangeKind = Literal["reset", "inserted", "removed", "moved", "changed", "path", "history", "dirty"]


@dataclass(frozen=True)
class DatasetChange:
    """What changed in a `DatasetDocument`; observers get one per change, after it happened.

    reset: everything was replaced (open, reset). inserted / removed / changed: `count` rows from
    `row`. moved: the sample at `row` now is at `dest`. path: the file changed. history: a step
    was done, undone or redone (`rows`: the positions it touched), or the history was cleared.
    dirty: the dirty flag flipped (read `document.dirty`)."""

    kind: ChangeKind
    row: int = 0  # first row (inserted, removed, changed) or the source row (moved)
    count: int = 0  # rows inserted, removed or changed
    dest: int = 0  # moved: where the sample is now
    rows: tuple[int, ...] = ()  # history: positions the step touched, to select them


Listener = Callable[[DatasetChange], None]


# -- undoable steps ------------------------------------------------------------------------------


class DatasetCommand:
    """One undoable step. `do` and `undo` change the document through its row primitives and
    return the positions they touched; `merge` may absorb the next step (then it is not kept)."""

    text = ""
    obsolete = False  # after a merge: the step changes nothing any more and leaves the history

    def do(self, doc: DatasetDocument) -> list[int]:
        raise NotImplementedError

    def undo(self, doc: DatasetDocument) -> list[int]:
        raise NotImplementedError

    def merge(self, other: DatasetCommand) -> bool:
        return False


def _near(doc: DatasetDocument, row: int) -> list[int]:
    """The position to select after rows around `row` went away."""
    return [min(row, len(doc) - 1)] if len(doc) else []


class InsertSamplesCommand(DatasetCommand):
    """Insert samples at a position (add, duplicate, import)."""

    def __init__(self, row: int, samples: Sequence[Sample], text: str):
        self.row, self.samples, self.text = row, list(samples), text

    def do(self, doc: DatasetDocument) -> list[int]:
        doc._insert(self.row, self.samples)
        return list(range(self.row, self.row + len(self.samples)))

    def undo(self, doc: DatasetDocument) -> list[int]:
        # keep them as they are now (a save in between renumbered their lines), for redo
        self.samples = doc._take(self.row, len(self.samples))
        return _near(doc, self.row)


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct positions as (start, count) runs of neighbours."""
    runs: list[tuple[int, int]] = []
    for r in rows:
        if runs and runs[-1][0] + runs[-1][1] == r:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((r, 1))
    return runs


class RemoveSamplesCommand(DatasetCommand):
    """Remove samples at some positions (not necessarily next to each other)."""

    def __init__(self, rows: Sequence[int], text: str):
        self.rows, self.text = sorted(set(rows)), text
        self._taken: list[tuple[int, list[Sample]]] = []

    def do(self, doc: DatasetDocument) -> list[int]:
        # from the last run back, so that the earlier positions still hold
        self._taken = [(start, doc._take(start, count)) for start, count in reversed(_runs(self.rows))]
        return _near(doc, self.rows[0])

    def undo(self, doc: DatasetDocument) -> list[int]:
        for start, samples in reversed(self._taken):
            doc._insert(start, samples)
        return list(self.rows)


class MoveSampleCommand(DatasetCommand):
    """Move one sample from one position to another."""

    def __init__(self, src: int, dst: int, text: str):
        self.src, self.dst, self.text = src, dst, text

    def do(self, doc: DatasetDocument) -> list[int]:
        doc._move(self.src, self.dst)
        return [self.dst]

    def undo(self, doc: DatasetDocument) -> list[int]:
        doc._move(self.dst, self.src)
        return [self.src]


def _same_but_line(a: Sample, b: Sample) -> bool:
    return a == b or replace(a, line=b.line) == b


class EditSampleCommand(DatasetCommand):
    """Replace one sample by an edited copy (its line in the file stays). Merges with the next
    edit of the same position and `key` (None: never), so that typing is one undo step."""

    def __init__(self, row: int, old: Sample, new: Sample, key: object, text: str):
        self.row, self.old, self.new, self.key, self.text = row, old, new, key, text

    def do(self, doc: DatasetDocument) -> list[int]:
        doc._set(self.row, self.new)
        return [self.row]

    def undo(self, doc: DatasetDocument) -> list[int]:
        doc._set(self.row, self.old)
        return [self.row]

    def merge(self, other: DatasetCommand) -> bool:
        if (
            not isinstance(other, EditSampleCommand)
            or self.key is None
            or other.key != self.key
            or other.row != self.row
        ):
            return False
        self.new = other.new
        self.obsolete = _same_but_line(self.new, self.old)
        return True


# -- the document --------------------------------------------------------------------------------


class DatasetDocument:
    """The samples being edited, their file, an undo/redo history and a dirty flag; observable.

    Reading: `samples()` (a copy of the list), `sample(row)`, `len(doc)`, `path`, `problems`
    (what reading the file found), `skipped` (those on lines that gave no sample),
    `problems_for(sample)`, `dirty`. Changing: `insert`, `remove`, `move`, `edit` (undoable,
    each returns the positions it touched), `undo`, `redo`, `open`, `save`, `reset`.
    """

    def __init__(self, samples: Sequence[Sample] = (), path: str | os.PathLike[str] | None = None):
        self._samples: list[Sample] = []
        self._path: str | None = None
        self._problems: list[Problem] = []
        self._skipped: list[Problem] = []
        self._loaded: dict[int, Sample] = {}  # line -> the sample as read from (or saved to) the file
        self._problems_by_line: dict[int, list[Problem]] = {}
        self._history: list[DatasetCommand] = []
        self._index = 0  # steps of the history that are done
        self._clean: int | None = 0  # the index at which the document equals its file; None: never
        self._listeners: list[Listener] = []
        # the other files the app reads (what they are -> path), which a save must never replace:
        # the window sets it (the model, the chat template, the project file)
        self.protected: Callable[[], dict[str, str | None]] = dict
        self._replace(list(samples), _absolute(path), [], saved=True)

    # --- reading ----------------------------------------------------------------------------
    def samples(self) -> list[Sample]:
        """The samples in dataset order (a new list; the samples themselves are frozen)."""
        return list(self._samples)

    def sample(self, row: int) -> Sample:
        return self._samples[row]

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(list(self._samples))

    def iter_samples(self) -> Iterator[Sample]:
        """The samples in order, without copying the list (do not change the document meanwhile)."""
        return iter(self._samples)

    @property
    def path(self) -> str | None:
        """The file the samples were read from or last saved to (absolute); None for a new dataset."""
        return self._path

    @property
    def problems(self) -> list[Problem]:
        """What reading the file found (load_jsonl's problems), by line; [] for a new dataset."""
        return list(self._problems)

    @property
    def skipped(self) -> list[Problem]:
        """Problems on lines of the file that gave no sample (they are not in the list, and saving
        over the file drops them)."""
        return list(self._skipped)

    def problems_for(self, sample: Sample) -> list[Problem]:
        """What is wrong with a sample: what reading its line found while it is as read from the
        file, else what validating it finds (an edited or new sample)."""
        if sample.line:
            loaded = self._loaded.get(sample.line)
            if loaded is sample or (loaded is not None and loaded == sample):
                return list(self._problems_by_line.get(sample.line, ()))
        _, problems = parse_sample(sample_to_json(sample), sample.line)
        return problems

    @property
    def dirty(self) -> bool:
        """The samples differ from the file (or were never saved, once there are any)."""
        return self._clean is None or self._index != self._clean

    # --- observing --------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> None:
        """Call `listener(change)` after every change, in the order of subscription."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _notify(self, change: DatasetChange) -> None:
        for listener in list(self._listeners):
            listener(change)

    # --- undoable changes -------------------------------------------------------------------
    def insert(self, row: int, samples: Sequence[Sample], text: str = "Add samples") -> list[int]:
        """Insert samples before position `row` (len(doc): at the end)."""
        if not 0 <= row <= len(self._samples):
            raise IndexError(f"cannot insert at position {row}: the dataset has {len(self._samples)} samples")
        if not samples:
            return []
        return self.push(InsertSamplesCommand(row, samples, text))

    def remove(self, rows: Sequence[int], text: str = "Delete samples") -> list[int]:
        """Remove the samples at these positions."""
        self._check_rows(rows)
        if not rows:
            return []
        return self.push(RemoveSamplesCommand(rows, text))

    def move(self, src: int, dst: int, text: str = "Move sample") -> list[int]:
        """Move the sample at `src` so that it ends up at position `dst`."""
        self._check_rows([src, dst])
        if src == dst:
            return []
        return self.push(MoveSampleCommand(src, dst, text))

    def edit(self, row: int, new: Sample, text: str = "Edit sample", key: object = None) -> list[int]:
        """Replace the sample at `row` by `new` (it keeps its line in the file). Consecutive edits
        with the same `key` and position merge into one step (None: they never do)."""
        self._check_rows([row])
        old = self._samples[row]
        if _same_but_line(new, old):
            return []
        return self.push(EditSampleCommand(row, old, new, key, text))

    def push(self, command: DatasetCommand) -> list[int]:
        """Do a step and keep it in the history (merged into the last one when it accepts it, unless
        the last one is where the file was saved); the redo steps are dropped."""
        was_dirty = self.dirty
        rows = command.do(self)
        del self._history[self._index :]
        if self._clean is not None and self._clean > self._index:
            self._clean = None  # the saved state was in the steps just dropped
        top = self._history[-1] if self._history else None
        if top is not None and self._index != self._clean and top.merge(command):
            if top.obsolete:
                self._history.pop()
                self._index -= 1
        else:
            self._history.append(command)
            self._index += 1
        self._stepped(rows, was_dirty)
        return rows

    def undo(self) -> list[int]:
        """Undo the last step; the positions it touched ([] when there is nothing to undo)."""
        if not self._index:
            return []
        was_dirty = self.dirty
        rows = self._history[self._index - 1].undo(self)
        self._index -= 1
        self._stepped(rows, was_dirty)
        return rows

    def redo(self) -> list[int]:
        """Redo the step last undone; the positions it touched ([] when there is none)."""
        if self._index >= len(self._history):
            return []
        was_dirty = self.dirty
        rows = self._history[self._index].do(self)
        self._index += 1
        self._stepped(rows, was_dirty)
        return rows

    def can_undo(self) -> bool:
        return self._index > 0

    def can_redo(self) -> bool:
        return self._index < len(self._history)

    def undo_text(self) -> str:
        """What Undo would undo ("Delete 2 samples"); "" when nothing."""
        return self._history[self._index - 1].text if self._index else ""

    def redo_text(self) -> str:
        return self._history[self._index].text if self.can_redo() else ""

    def undo_count(self) -> int:
        """Steps that can be undone."""
        return self._index

    def redo_count(self) -> int:
        return len(self._history) - self._index

    def clear_history(self) -> None:
        """Forget every step (the samples stay; the document stays dirty or clean as it is)."""
        was_dirty = self.dirty
        self._history, self._index = [], 0
        self._clean = None if was_dirty else 0
        self._notify(DatasetChange("history"))

    def _stepped(self, rows: list[int], was_dirty: bool) -> None:
        self._notify(DatasetChange("history", rows=tuple(rows)))
        if self.dirty != was_dirty:
            self._notify(DatasetChange("dirty"))

    def _check_rows(self, rows: Sequence[int]) -> None:
        bad = [r for r in rows if not 0 <= r < len(self._samples)]
        if bad:
            raise IndexError(f"no sample at position {bad[0]}: the dataset has {len(self._samples)} samples")

    # --- row primitives (the steps use these; each tells the observers) --------------------------
    def _insert(self, row: int, samples: Sequence[Sample]) -> None:
        if samples:
            self._samples[row:row] = samples
            self._notify(DatasetChange("inserted", row=row, count=len(samples)))

    def _take(self, row: int, count: int) -> list[Sample]:
        taken = self._samples[row : row + count]
        if taken:
            del self._samples[row : row + count]
            self._notify(DatasetChange("removed", row=row, count=len(taken)))
        return taken

    def _move(self, src: int, dst: int) -> None:
        if src != dst:
            self._samples.insert(dst, self._samples.pop(src))
            self._notify(DatasetChange("moved", row=src, dest=dst))

    def _set(self, row: int, sample: Sample) -> None:
        line = self._samples[row].line
        self._samples[row] = sample if sample.line == line else replace(sample, line=line)
        self._notify(DatasetChange("changed", row=row, count=1))

    # --- files --------------------------------------------------------------------------------
    def open(self, path: str | os.PathLike[str]) -> list[Problem]:
        """Read a JSON Lines file (engine `load_jsonl`) in place of everything; a new history, clean.

        Returns what reading found (also in `problems`); DatasetError when the file cannot be read
        at all, and then nothing changed."""
        path = _absolute(path)
        assert path is not None
        samples, problems = load_jsonl(path)
        self._replace(samples, path, problems, saved=True)
        return list(problems)

    def reset(
        self,
        samples: Sequence[Sample] = (),
        path: str | os.PathLike[str] | None = None,
        *,
        saved: bool = True,
        problems: Sequence[Problem] = (),
        index: DocumentIndex | None = None,
    ) -> None:
        """Replace everything, with a new history. `saved`: the samples are what `path` holds (clean);
        False: they differ from it (dirty until saved; a recovered autosave). `problems`: what
        reading them found, by line (those on lines without a sample are `skipped`). `index`:
        `index_of(samples, problems)` made beforehand (on another thread, for a large file)."""
        self._replace(list(samples), _absolute(path), list(problems), saved=saved, index=index)

    def save(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write the samples to `path` (default: the document's file), which becomes its file.

        Atomic (engine `save_jsonl`: a temporary file renamed into place). Afterwards each
        sample's line is its position + 1, as in the file, and the document is clean. On failure
        (DatasetError, naming the file and why) the file, the samples, the path and the dirty flag
        are as they were."""
        target = _absolute(path) if path is not None else self._path
        if not target:
            raise DatasetError("the dataset has no file name yet: save it with Save As")
        try:
            check_outputs({"dataset": target}, self.protected())
        except EngineError as exc:
            raise DatasetError(str(exc)) from exc
        save_jsonl(target, self._samples)
        was_dirty, old_path = self.dirty, self._path
        changed = [i for i, s in enumerate(self._samples) if s.line != i + 1]
        problems_by_line: dict[int, list[Problem]] = {}
        renumbered: list[Sample] = []
        for i, s in enumerate(self._samples):
            found = self.problems_for(s)
            new = s if s.line == i + 1 else replace(s, line=i + 1)
            renumbered.append(new)
            if found:
                problems_by_line[i + 1] = [p if p.line == i + 1 else replace(p, line=i + 1) for p in found]
        self._samples = renumbered
        self._loaded = {s.line: s for s in renumbered}
        self._problems_by_line = problems_by_line
        self._problems = [p for line in sorted(problems_by_line) for p in problems_by_line[line]]
        self._skipped = []
        self._path = target
        self._clean = self._index
        if changed:
            self._notify(DatasetChange("changed", row=changed[0], count=changed[-1] - changed[0] + 1))
        if target != old_path:
            self._notify(DatasetChange("path"))
        if was_dirty:
            self._notify(DatasetChange("dirty"))
        return target

    def _replace(
        self,
        samples: list[Sample],
        path: str | None,
        problems: list[Problem],
        *,
        saved: bool,
        index: DocumentIndex | None = None,
    ) -> None:
        was_dirty, old_path = self.dirty, self._path
        if index is None or index.n_samples != len(samples) or index.n_problems != len(problems):
            index = index_of(samples, problems)
        self._samples = samples
        self._path = path
        self._problems = list(problems)
        self._skipped = index.skipped
        self._problems_by_line = index.problems_by_line
        self._loaded = index.loaded if saved else {}
        self._history, self._index = [], 0
        self._clean = 0 if saved else None
        self._notify(DatasetChange("reset"))
        if path != old_path:
            self._notify(DatasetChange("path"))
        self._notify(DatasetChange("history"))
        if self.dirty != was_dirty:
            self._notify(DatasetChange("dirty"))


@dataclass(frozen=True)
class DocumentIndex:
    """What a document looks samples' problems up in, made from what reading a file gave (by
    `index_of`, on any thread)."""

    n_samples: int
    n_problems: int
    skipped: list[Problem]  # problems on lines that gave no sample
    problems_by_line: dict[int, list[Problem]]  # the others, by line
    loaded: dict[int, Sample]  # line -> the sample as read

    def problems_for(self, sample: Sample) -> list[Problem]:
        """What reading found about a sample as read (a copy)."""
        return list(self.problems_by_line.get(sample.line, ())) if sample.line else []


def index_of(samples: Sequence[Sample], problems: Sequence[Problem]) -> DocumentIndex:
    """The lookups a document holding `samples` (read with `problems`) keeps."""
    lines = {s.line for s in samples if s.line}
    by_line: dict[int, list[Problem]] = {}
    skipped = []
    for p in problems:
        if p.line in lines:
            by_line.setdefault(p.line, []).append(p)
        else:
            skipped.append(p)
    loaded = {s.line: s for s in samples if s.line}
    return DocumentIndex(len(samples), len(problems), skipped, by_line, loaded)


def _absolute(path: str | os.PathLike[str] | None) -> str | None:
    return os.path.abspath(os.fspath(path)) if path is not None and os.fspath(path) else None


__all__ = [
    "DatasetChange",
    "DatasetCommand",
    "DatasetDocument",
    "DocumentIndex",
    "EditSampleCommand",
    "InsertSamplesCommand",
    "MoveSampleCommand",
    "RemoveSamplesCommand",
    "index_of",
]
