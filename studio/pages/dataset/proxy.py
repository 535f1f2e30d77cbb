"""Sorting and searching the samples table, fast on a hundred thousand rows.

`SamplesFilterModel` shows the rows of a `SamplesModel` in an order and a subset held as arrays:
sorting takes one array of keys from the model (`SamplesModel.sort_keys`, made in one pass and
sorted by NumPy, stable, as Qt sorts) and searching tests each row's casefolded text once (typing
more letters only looks again at the rows that matched), `SEARCH_SLICE` rows per turn of the
event loop: the table shows the last result until the new one is complete (`sig_searched`).
Qt's `QSortFilterProxyModel` asks the model for every row and compares through Python callbacks,
seconds on such a table.

Changes of the layout (a sort, a search, rows added, removed or moved) keep the selection and
the current row: persistent indexes follow their row objects. The row being edited can be kept
visible whatever the search (`set_pinned`).

What this module is not: it has no data of its own and never changes the samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PySide6.QtCore import (
    QAbstractItemModel,
    QAbstractProxyModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    QTimer,
    Signal,
)

from ...widgets import roles
from .rows import SampleRow
from .table import SamplesModel

Index = QModelIndex | QPersistentModelIndex
_FLAGS = Qt.ItemIsSelectable | Qt.ItemIsEnabled
SEARCH_SLICE = 5_000  # rows a search tests per turn of the event loop (a few milliseconds)


class SamplesFilterModel(QAbstractProxyModel):
    """Sorts `SamplesModel` by its sort keys and keeps the rows whose text contains the search."""

    sig_searched = Signal()  # a search is complete: the rows shown match it

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._needle = ""
        self._search: tuple[str, np.ndarray, int, list[np.ndarray]] | None = None  # under way
        self._search_timer = QTimer(self)
        self._search_timer.setInterval(0)
        self._search_timer.setSingleShot(True)
        self._search_timer.timeout.connect(self._search_step)
        self._sorted: tuple[int, bool] | None = None  # (column, descending) the order was made for
        self._pinned: SampleRow | None = None
        self._column = -1  # sorted by this column (-1: dataset order)
        self._descending = False
        self._order = np.zeros(0, dtype=np.int64)  # proxy row -> source row
        self._where = np.zeros(0, dtype=np.int64)  # source row -> proxy row (-1: hidden)
        self._matches: np.ndarray | None = None  # per source row: contains the needle (None: no search)
        self._matched_needle = ""
        self._held: list[tuple[QPersistentModelIndex, SampleRow | None]] = []  # during a layout change
        self._connections: list[Any] = []
        self._source: SamplesModel | None = None

    # --- the source ---------------------------------------------------------------------------
    def setSourceModel(self, model: QAbstractItemModel) -> None:  # noqa: N802 - Qt override
        old = self.sourceModel()
        if old is not None:
            for signal, slot in self._connections:
                signal.disconnect(slot)
        self._connections = []
        self.beginResetModel()
        super().setSourceModel(model)
        self._source = model if isinstance(model, SamplesModel) else None
        if model is not None:
            for signal, slot in (
                (model.modelAboutToBeReset, self.beginResetModel),
                (model.modelReset, self._source_reset),
                (model.rowsAboutToBeInserted, lambda *_: self._hold()),
                (model.rowsInserted, self._rows_inserted),
                (model.rowsAboutToBeRemoved, lambda *_: self._hold()),
                (model.rowsRemoved, self._rows_removed),
                (model.rowsAboutToBeMoved, lambda *_: self._hold()),
                (model.rowsMoved, self._rows_moved),
                (model.dataChanged, self._data_changed),
                (model.headerDataChanged, self.headerDataChanged),
            ):
                signal.connect(slot)
                self._connections.append((signal, slot))
        self._matches = None
        self._recompute()
        self.endResetModel()

    def _model(self) -> SamplesModel | None:
        return self._source

    def _source_reset(self) -> None:
        self._matches = None
        self._sorted = None
        self._recompute()
        self.endResetModel()
        if self._needle:
            self._start_search()

    def _rows_inserted(self, parent: QModelIndex, first: int, last: int) -> None:
        if self._matches is not None:
            model = self._model()
            rows = model.rows()[first : last + 1] if model is not None else []
            new = np.fromiter((self._matched_needle in r.search_text() for r in rows), bool, len(rows))
            self._matches = np.concatenate((self._matches[:first], new, self._matches[first:]))
        self._restart_search()
        self._sorted = None
        self._relayout(held=True)

    def _rows_removed(self, parent: QModelIndex, first: int, last: int) -> None:
        if self._matches is not None:
            self._matches = np.delete(self._matches, np.arange(first, last + 1))
        self._restart_search()
        self._sorted = None
        self._relayout(held=True)

    def _rows_moved(self, parent: QModelIndex, first: int, last: int, dest: QModelIndex, row: int) -> None:
        if self._matches is not None:
            moved = self._matches[first : last + 1].copy()
            rest = np.delete(self._matches, np.arange(first, last + 1))
            at = row if row < first else row - (last - first + 1)
            self._matches = np.concatenate((rest[:at], moved, rest[at:]))
        self._restart_search()
        self._sorted = None
        self._relayout(held=True)

    def _data_changed(self, top_left: QModelIndex, bottom_right: QModelIndex, roles: Any = ()) -> None:
        first, last = top_left.row(), bottom_right.row()
        columns = range(top_left.column(), bottom_right.column() + 1)
        texts = SamplesModel.COL_WORDS in columns or SamplesModel.COL_SHAPE in columns
        if self._matches is not None and texts:  # the rows' text may have changed: test them again
            model = self._model()
            rows = model.rows()[first : last + 1] if model is not None else []
            self._matches[first : last + 1] = np.fromiter(
                (self._matched_needle in r.search_text() for r in rows), bool, len(rows)
            )
            self._restart_search()
        if self._column in columns:
            self._sorted = None
        if (self._needle and texts) or self._column in columns:
            self._relayout()
            return
        rows = self._where[first : last + 1]
        shown = rows[rows >= 0]
        if len(shown):
            self.dataChanged.emit(
                self.index(int(shown.min()), top_left.column()),
                self.index(int(shown.max()), bottom_right.column()),
                roles,
            )

    # --- sorting and searching ----------------------------------------------------------------
    @property
    def search(self) -> str:
        return self._needle

    def set_search(self, text: str) -> None:
        needle = text.strip().casefold()
        if needle == self._needle:
            return
        self._needle = needle
        self._pinned = None  # a new search shows what matches, the selected row included or not
        self._start_search()

    @property
    def searching(self) -> bool:
        """A search is under way (the rows shown are the last complete search's)."""
        return self._search is not None

    def _start_search(self) -> None:
        """Test the rows for the needle, a slice at a time; when done, show what matches."""
        model = self._model()
        needle = self._needle
        self._search_timer.stop()
        if model is None or not needle:
            self._search = None
            self._matches, self._matched_needle = None, ""
            self._relayout()
            self.sig_searched.emit()
            return
        n = model.rowCount()
        narrowing = (
            self._matches is not None and len(self._matches) == n and needle.startswith(self._matched_needle)
        )
        candidates = np.flatnonzero(self._matches) if narrowing else np.arange(n)  # typing on: fewer rows
        self._search = (needle, candidates, 0, [])
        self._search_step()

    def _restart_search(self) -> None:
        if self._search is not None:
            self._search = None
            self._matches = None
            self._start_search()

    def _search_step(self) -> None:
        if self._search is None:
            return
        model = self._model()
        needle, candidates, done, found = self._search
        if model is None:
            self._search = None
            return
        rows = model.rows()
        part = candidates[done : done + SEARCH_SLICE]
        keep = np.fromiter((needle in rows[i].search_text() for i in part.tolist()), bool, len(part))
        found.append(part[keep])
        done += len(part)
        if done < len(candidates):
            self._search = (needle, candidates, done, found)
            self._search_timer.start()
            return
        matches = np.zeros(len(rows), dtype=bool)
        matches[np.concatenate(found) if found else np.zeros(0, dtype=np.int64)] = True
        self._search = None
        self._matches, self._matched_needle = matches, needle
        self._relayout()
        self.sig_searched.emit()

    def sort(self, column: int, order: Qt.SortOrder = Qt.AscendingOrder) -> None:
        """Sort by a column (stable: equal keys keep the dataset's order); by # ascending is the
        dataset's own order."""
        descending = order == Qt.DescendingOrder
        if column == SamplesModel.COL_INDEX and not descending:
            column = -1
        if (column, descending) == (self._column, self._descending) and self._sorted == (column, descending):
            return  # sorted so already (the view asks twice: sortByColumn, then its header)
        self._column, self._descending = column, descending
        self._relayout()

    def sortColumn(self) -> int:  # noqa: N802 - Qt override
        return self._column

    def sortOrder(self) -> Qt.SortOrder:  # noqa: N802 - Qt override
        return Qt.DescendingOrder if self._descending else Qt.AscendingOrder

    def set_pinned(self, row: SampleRow | None, *, refilter: bool = False) -> None:
        """Keep this row visible whatever the search (the one being edited), until the search
        changes. `refilter`: show it now if it is hidden (otherwise it is only kept from hiding)."""
        self._pinned = row
        if refilter and row is not None and self._needle:
            self._relayout()

    def _visible(self, model: SamplesModel) -> np.ndarray:
        """Source rows that pass the last complete search (all without one), in dataset order."""
        n = model.rowCount()
        matches = self._matches
        if not self._needle or matches is None or len(matches) != n:
            return np.arange(n)
        shown = matches
        if self._pinned is not None:
            at = model.row_of(self._pinned)
            if at >= 0 and not matches[at]:
                shown = matches.copy()
                shown[at] = True
        return np.flatnonzero(shown)

    def _recompute(self) -> None:
        model = self._model()
        if model is None:
            self._order = self._where = np.zeros(0, dtype=np.int64)
            return
        order = self._visible(model)
        if self._column >= 0 and len(order):
            keys = model.sort_keys(self._column)[order]
            if self._descending:  # stable, equal keys in dataset order, as Qt's descending sort
                keys = -keys
            order = order[np.argsort(keys, kind="stable")]
        self._sorted = (self._column, self._descending)
        self._order = order
        where = np.full(model.rowCount(), -1, dtype=np.int64)
        where[order] = np.arange(len(order))
        self._where = where

    def _hold(self) -> None:
        """Before the layout changes: say so, and note which row object each persistent index is on."""
        self.layoutAboutToBeChanged.emit()
        model = self._model()
        held = []
        for index in self.persistentIndexList():
            row = index.row()
            obj = (
                model.row_object(int(self._order[row]))
                if model is not None and 0 <= row < len(self._order)
                else None
            )
            held.append((QPersistentModelIndex(index), obj))
        self._held = held

    def _relayout(self, *, held: bool = False) -> None:
        """Recompute the rows shown and their order; persistent indexes follow their rows."""
        if not held:
            self._hold()
        self._recompute()
        model = self._model()
        old, new = [], []
        if model is not None and len(self._held) > 4:  # many: one pass over the rows finds them all
            at = {id(r): i for i, r in enumerate(model.rows())}
            row_of = lambda obj: at.get(id(obj), -1)  # noqa: E731
        else:
            row_of = model.row_of if model is not None else (lambda obj: -1)
        for index, obj in self._held:
            old.append(QModelIndex(index))
            source = row_of(obj) if obj is not None else -1
            row = int(self._where[source]) if 0 <= source < len(self._where) else -1
            new.append(self.index(row, index.column()) if row >= 0 else QModelIndex())
        self._held = []
        self.changePersistentIndexList(old, new)
        self.layoutChanged.emit()

    # --- Qt proxy -----------------------------------------------------------------------------
    def mapToSource(self, proxy_index: Index) -> QModelIndex:  # noqa: N802 - Qt override
        model = self.sourceModel()
        if model is None or not proxy_index.isValid() or not 0 <= proxy_index.row() < len(self._order):
            return QModelIndex()
        return model.index(int(self._order[proxy_index.row()]), proxy_index.column())

    def mapFromSource(self, source_index: Index) -> QModelIndex:  # noqa: N802 - Qt override
        if not source_index.isValid() or not 0 <= source_index.row() < len(self._where):
            return QModelIndex()
        row = int(self._where[source_index.row()])
        return self.index(row, source_index.column()) if row >= 0 else QModelIndex()

    def index(self, row: int, column: int, parent: Index = QModelIndex()) -> QModelIndex:  # noqa: B008
        if parent.isValid() or not 0 <= row < len(self._order) or not 0 <= column < self.columnCount():
            return QModelIndex()
        return self.createIndex(row, column)

    def parent(self, index: Index = QModelIndex()) -> QModelIndex:  # type: ignore[override]  # noqa: B008
        return QModelIndex()

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802, B008
        return 0 if parent.isValid() else len(self._order)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802, B008
        return 0 if parent.isValid() or self._model() is None else len(SamplesModel.COLUMNS)

    def hasChildren(self, parent: Index = QModelIndex()) -> bool:  # noqa: N802, B008
        return not parent.isValid() and len(self._order) > 0

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole) -> Any:  # noqa: N802
        model = self.sourceModel()
        if model is None:
            return None
        if orientation == Qt.Vertical:
            if role == roles.DISPLAY and 0 <= section < len(self._order):
                return section + 1
            return None
        return model.headerData(section, orientation, role)

    def sibling(self, row: int, column: int, index: Index) -> QModelIndex:
        return self.index(row, column)

    # A repaint asks for a dozen roles of every cell in sight: answered here in one call each, not
    # through mapToSource and the source's data (two calls and an index each).
    def data(self, index: Index, role: int = Qt.DisplayRole) -> Any:
        model = self._model()
        row = index.row()
        if model is None or not 0 <= row < len(self._order):
            return None
        return model.cell(int(self._order[row]), index.column(), role)

    def flags(self, index: Index) -> Qt.ItemFlag:
        return _FLAGS if index.isValid() else Qt.NoItemFlags


__all__ = ["SamplesFilterModel"]
