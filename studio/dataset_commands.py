"""Undoable changes to the dataset: add, remove, move and edit samples (QUndoCommand subclasses).

Each command changes a `SamplesModel` through its methods and can be undone and redone any
number of times. `EditSampleCommand`s on the same field of the same sample, pushed one after the
other in one editing session, merge into one (typing a word is one undo step). `on_apply` is
called with the dataset rows a command touched, so the page can select them.

What this module is not: it builds no samples from widgets (the editor does) and shows nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QUndoCommand

from engine import Problem, Sample

from .dataset_model import SampleRow, SamplesModel

Focus = Callable[[list[int]], None]

EDIT_ID = 4101


def _noop(rows: list[int]) -> None:
    pass


class InsertSamplesCommand(QUndoCommand):
    """Insert samples at a position (add, duplicate, import)."""

    def __init__(
        self, model: SamplesModel, row: int, samples: list[Sample], text: str, on_apply: Focus = _noop
    ):
        super().__init__(text)
        self.model, self.row, self.samples, self.on_apply = model, row, list(samples), on_apply
        self._rows: list[SampleRow] | None = None  # the row objects, kept across undo/redo

    def redo(self) -> None:
        if self._rows is None:
            self._rows = self.model.insert_samples(self.row, self.samples)
        else:
            self.model.insert_rows(self.row, self._rows)
        self.on_apply(list(range(self.row, self.row + len(self.samples))))

    def undo(self) -> None:
        self.model.take_rows(self.row, len(self.samples))
        self.on_apply([min(self.row, self.model.rowCount() - 1)] if self.model.rowCount() else [])


class RemoveSamplesCommand(QUndoCommand):
    """Remove samples at some positions (not necessarily next to each other)."""

    def __init__(self, model: SamplesModel, rows: list[int], text: str, on_apply: Focus = _noop):
        super().__init__(text)
        self.model, self.rows, self.on_apply = model, sorted(set(rows)), on_apply
        self._taken: list[tuple[int, SampleRow]] = []

    def redo(self) -> None:
        self._taken = []
        for row in reversed(self.rows):
            self._taken.append((row, self.model.take_rows(row, 1)[0]))
        n = self.model.rowCount()
        self.on_apply([min(self.rows[0], n - 1)] if n else [])

    def undo(self) -> None:
        for row, obj in reversed(self._taken):
            self.model.insert_rows(row, [obj])
        self.on_apply(list(self.rows))


class MoveSampleCommand(QUndoCommand):
    """Move one sample from one position to another."""

    def __init__(self, model: SamplesModel, src: int, dst: int, text: str, on_apply: Focus = _noop):
        super().__init__(text)
        self.model, self.src, self.dst, self.on_apply = model, src, dst, on_apply

    def redo(self) -> None:
        self.model.move_sample(self.src, self.dst)
        self.on_apply([self.dst])

    def undo(self) -> None:
        self.model.move_sample(self.dst, self.src)
        self.on_apply([self.src])


class EditSampleCommand(QUndoCommand):
    """Replace one sample by an edited copy. Merges with the next edit of the same `key`
    (sample position, field and editing session), so that typing is one undo step."""

    def __init__(
        self,
        model: SamplesModel,
        row: int,
        old: Sample,
        new: Sample,
        problems: list[Problem] | None,
        key: tuple,
        text: str,
        on_apply: Focus = _noop,
    ):
        super().__init__(text)
        self.model, self.row, self.old, self.new = model, row, old, new
        self.problems, self.key, self.on_apply = problems, key, on_apply
        self._old_problems = list(model.row_object(row).problems)

    def id(self) -> int:
        return EDIT_ID

    def mergeWith(self, other: QUndoCommand) -> bool:  # noqa: N802 - Qt override
        if not isinstance(other, EditSampleCommand) or other.key != self.key or other.row != self.row:
            return False
        self.new, self.problems = other.new, other.problems
        self.setObsolete(self.new == self.old)
        return True

    def redo(self) -> None:
        self.model.set_sample(self.row, self.new, self.problems)
        self.on_apply([self.row])

    def undo(self) -> None:
        self.model.set_sample(self.row, self.old, self._old_problems)
        self.on_apply([self.row])


__all__ = ["EditSampleCommand", "InsertSamplesCommand", "MoveSampleCommand", "RemoveSamplesCommand"]
