"""The Problems list of the Dataset page: every problem found in the file and in the samples.

`ProblemsModel` is a list model over the problems (a line that could not be read, a warning or an
error on a sample), sorted by line, new samples last; a list view shows only the rows in sight,
so a hundred thousand problems cost nothing until they are scrolled to. `ProblemsBuilder` gathers
them from the table's rows a slice of time at a time on the UI thread (a rebuild never holds it
for long) and hands the sorted list to the model.

What this module is not: it changes no sample; selecting a problem's sample is the page's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QObject, QPersistentModelIndex, Qt, QTimer
from PySide6.QtWidgets import QApplication, QStyle

from engine import Problem

from ...widgets import roles
from .rows import SampleRow
from .table import SamplesModel

SLICE_S = 0.008  # the longest one slice of a rebuild holds the UI thread
NEW = 10**12  # sorts new samples (no line) after every line


@dataclass(frozen=True)
class ProblemEntry:
    """One problem as listed: the sample it is about (None for a line that gave no sample)."""

    key: tuple[int, int]  # (line, or NEW + position for a new sample; position): the list's order
    problem: Problem
    row: SampleRow | None

    @property
    def line(self) -> int:
        return self.row.sample.line if self.row is not None else self.problem.line

    def where(self) -> str:
        if self.row is None:
            return f"line {self.problem.line}"
        return f"line {self.row.sample.line}" if self.row.sample.line else f"new sample #{self.key[1] + 1}"

    def text(self) -> str:
        p = self.problem
        return (
            f"{self.where()}: {p.message} (not in the table)"
            if self.row is None
            else f"{self.where()}: {p.message}"
        )


class ProblemsModel(QAbstractListModel):
    """The problems, one row each (with an icon by severity); a placeholder row when there are none."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._entries: list[ProblemEntry] = []
        self._placeholder = ""

    def set_entries(self, entries: list[ProblemEntry], placeholder: str) -> None:
        self.beginResetModel()
        self._entries, self._placeholder = entries, placeholder
        self.endResetModel()

    @property
    def entries(self) -> list[ProblemEntry]:
        return self._entries

    def entry(self, row: int) -> ProblemEntry | None:
        return self._entries[row] if 0 <= row < len(self._entries) else None

    def text(self, row: int) -> str:
        return self.index(row, 0).data() or ""

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802, B008
        if parent.isValid():
            return 0
        return len(self._entries) or (1 if self._placeholder else 0)

    def flags(self, index: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        if not index.isValid() or not self._entries:
            return Qt.NoItemFlags
        return Qt.ItemIsSelectable | Qt.ItemIsEnabled

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.DisplayRole) -> Any:
        if not index.isValid():
            return None
        if not self._entries:
            return self._placeholder if role == roles.DISPLAY and index.row() == 0 else None
        e = self._entries[index.row()] if index.row() < len(self._entries) else None
        if e is None:
            return None
        if role == roles.DISPLAY:
            return e.text()
        if role == roles.TOOLTIP:
            return f"{e.where()}: {e.problem.severity}: {e.problem.message}"
        if role == roles.DECORATION and QApplication.instance() is not None:
            error = e.problem.severity == "error"
            return QApplication.style().standardIcon(
                QStyle.SP_MessageBoxCritical if error else QStyle.SP_MessageBoxWarning
            )
        return None


class ProblemsBuilder(QObject):
    """Rebuilds a `ProblemsModel` from the skipped lines and the table's rows, a slice of time at
    a time; `rebuild()` (again) starts over, `finish()` does what is left at once."""

    def __init__(
        self,
        model: ProblemsModel,
        table: SamplesModel,
        skipped: Callable[[], list[Problem]],
        placeholder: Callable[[], str],
        done: Callable[[], None],
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.model, self.table, self._skipped, self._placeholder, self._done = (
            model,
            table,
            skipped,
            placeholder,
            done,
        )
        self._work: Iterator[None] | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self._step)

    @property
    def busy(self) -> bool:
        return self._work is not None

    def rebuild(self) -> None:
        self._work = self._gather()
        self._step()

    def finish(self) -> None:
        while self._work is not None:
            self._step(deadline=float("inf"))

    def _step(self, deadline: float | None = None) -> None:
        if self._work is None:
            self._timer.stop()
            return
        end = time.perf_counter() + SLICE_S if deadline is None else deadline
        try:
            while time.perf_counter() < end:
                next(self._work)
        except StopIteration:
            self._work = None
            self._timer.stop()
            self._done()
            return
        self._timer.start()

    def _gather(self) -> Iterator[None]:
        entries = [ProblemEntry((p.line, 0), p, None) for p in self._skipped()]
        rows = self.table.rows()
        known = self.table.known_problems
        for start in range(0, len(rows), 2048):
            for i in range(start, min(start + 2048, len(rows))):
                r = rows[i]
                if r.problems or r.encode_problems:
                    line = r.sample.line
                    for p in known(i):
                        entries.append(ProblemEntry((line if line else NEW + i, i), p, r))
            yield
        entries.sort(key=lambda e: e.key)
        yield
        self.model.set_entries(entries, self._placeholder())


__all__ = ["ProblemEntry", "ProblemsBuilder", "ProblemsModel"]
