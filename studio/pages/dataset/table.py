"""The dataset being edited, as a Qt table model over a `DatasetDocument`.

`SamplesModel` adapts a document (one row per sample, in dataset order) for views: position, file
line, shape, first words, reward, token counts and problems. It observes the document and turns
its notifications into Qt's begin/end row signals; changes go to the document, never to the
model. Token counts come from `engine.encode_samples` with the open model's tokenizer and chat
template: made by a background counter (the page's loader thread) when there is one, a slice at
a time on the UI thread otherwise, and for a row on show at once; only the counts are kept per row
(the token view's tokens are encoded when asked). Totals are kept as rows change, so a
hundred-thousand-row table answers `stats()` at once. `rebuild_sample` (samples.py) makes an edited copy of a
frozen `Sample` and validates it.

What this module is not: it holds no samples of its own, reads and writes no files and keeps no
undo history (`studio.dataset_document.DatasetDocument` does all three); sorting and searching
are `studio.pages.dataset.proxy.SamplesFilterModel`'s. The rows themselves are rows.py's, the
samples' helpers samples.py's; the module is one Qt model class (about 540 lines) on purpose: its
counting, its running totals and its notifications change the same rows together.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import QApplication, QStyle

from engine import (
    ChatTemplate,
    Encoded,
    EncodeOptions,
    Problem,
    Sample,
    Tokenizer,
    encode_samples,
)

from ...dataset_document import DatasetChange, DatasetDocument
from ...weak_listener import listen_while_alive
from ...widgets import roles
from ...widgets.theme import is_dark
from .rows import (
    DatasetStats,
    PreparedRows,
    RowCounts,
    SampleRow,
    count_row,
    dense_ranks,
)
from .samples import sample_preview

SortRole = roles.USER + 1  # a value that sorts (numbers as numbers, None first)
NO_VALUE = "–"
ROLES = ("system", "user", "assistant", "tool")
# (light, dark) text colours of the table, each readable on its palette's base
TEXT_COLOURS = {
    "error": ("#b03a2e", "#ff8a80"),
    "warning": ("#8a5a00", "#ffcc80"),
    "new": ("#1f6fa8", "#7fb8ea"),  # the line of a sample not saved yet
}
SHAPE_HELP = {
    "messages": "a conversation: a list of turns with roles",
    "prompt": "a prompt and its response",
    "text": "plain text (every token is trained)",
    "preference": "a prompt with a chosen and a rejected answer (DPO / ORPO; SFT trains the chosen one)",
}


_ROLES = frozenset(
    {roles.DISPLAY, SortRole, roles.TOOLTIP, roles.ALIGNMENT, roles.FOREGROUND, roles.DECORATION, roles.FONT}
)  # fmt: skip
_RIGHT = Qt.AlignRight | Qt.AlignVCenter
_LEFT = Qt.AlignLeft | Qt.AlignVCenter


def _dark() -> bool:
    app = QApplication.instance()
    return app is not None and is_dark(QApplication.palette())


# -- the table model ---------------------------------------------------------------------------


# A background counter: counter(generation, samples) starts counting them off the UI thread, handing
# the results to `SamplesModel.take_counts(generation, results)` and then `counting_done(generation)`;
# False when it declines (few samples: the model counts them a slice at a time itself).
Counter = Callable[[int, list[Sample]], bool]


class SamplesModel(QAbstractTableModel):
    """A Qt table over a `DatasetDocument` (a new, empty one when none is given): the document is
    the data, this only adapts it and keeps token counts. `sig_changed` fires after any change to
    samples, problems or token counts.

    Token counts are made by a background `counter` when the page gives one (`set_counter`), else
    a slice at a time on the UI thread; a row that is shown before it is counted is counted then.
    Totals (`stats`) are kept as rows change, so that they cost nothing to read.
    """

    COLUMNS = ("#", "Line", "Shape", "First words", "Reward", "Tokens", "Trained", "Problems")
    COL_INDEX, COL_LINE, COL_SHAPE, COL_WORDS, COL_REWARD, COL_TOKENS, COL_TRAINED, COL_PROBLEMS = range(8)
    HEADER_TIPS = (
        "Position of the sample in the dataset (click to sort in file order)",
        "Line of the sample in the file as last read or saved ('new' for samples added since)",
        "Shape of the sample: messages (a conversation), prompt (prompt/response), text, or preference (a "
        "prompt with a chosen and a rejected answer)",
        "The start of the first user turn, prompt or text",
        "The sample's reward (or score); empty when it has none. Training clips rewards to [-1, 1]",
        "Tokens after the chat template, with the open model's tokenizer (cut at n_ctx)",
        "Tokens the model learns to produce (assistant replies and their end-of-turn token)",
        "Problems found when reading or encoding the sample; hover for the first one",
    )
    COUNT_COLUMNS = (COL_TOKENS, COL_TRAINED, COL_PROBLEMS)

    sig_changed = Signal()

    def __init__(self, document: DatasetDocument | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.document = document if document is not None else DatasetDocument()
        self._rows: list[SampleRow] = []
        self._by_sample: dict[int, SampleRow] = {}  # id(sample) -> its row (the counter's results find it)
        self._tokenizer: Tokenizer | None = None
        self._template: ChatTemplate | None = None
        self._options: EncodeOptions | None = None
        self._gen = 0  # counts of rows with another count_gen are stale
        self._counter: Counter | None = None
        self._counting = False  # the counter is at work for this generation
        self._prepared: PreparedRows | None = None  # rows a loader made
        self._encoded: dict[int, tuple[Sample, Encoded | None]] = {}  # the token view's last samples
        self._looks: dict[tuple[str, str], Any] = {}  # brushes, icons and the font, made once
        self._word_ranks: np.ndarray | None = None  # how the rows sort by first words (made ahead)
        # totals over the rows: read problems and errors, rewards; counted rows, their tokens, problems
        self._read = [0, 0, 0]  # problems, errors, with reward
        self._counted = [0, 0, 0, 0, 0]  # rows, tokens, trained, problems, errors
        self._fill_timer = QTimer(self)
        self._fill_timer.setInterval(0)
        self._fill_timer.timeout.connect(self._fill_some)
        self._set_rows([SampleRow(s, self.document.problems_for(s)) for s in self.document])
        listen_while_alive(self, self.document, SamplesModel._document_changed)

    # --- reading ------------------------------------------------------------------------------
    @property
    def samples(self) -> list[Sample]:
        """A copy of the sample list, in dataset order."""
        return [r.sample for r in self._rows]

    def sample(self, row: int) -> Sample:
        return self._rows[row].sample

    def row_object(self, row: int) -> SampleRow:
        return self._rows[row]

    def rows(self) -> list[SampleRow]:
        """The rows in dataset order (the list itself: read it, do not change it)."""
        return self._rows

    def row_of(self, obj: SampleRow) -> int:
        """Current position of a row object, -1 if it is not in the dataset."""
        for i, r in enumerate(self._rows):
            if r is obj:
                return i
        return -1

    def problems(self, row: int) -> list[Problem]:
        """Reading/validation problems, then encoding problems (when a model is open)."""
        r = self._rows[row]
        self._ensure_counted(r)
        return self._all_problems(r)

    def known_problems(self, row: int) -> list[Problem]:
        """Like `problems`, without counting the sample's tokens when they are not counted yet."""
        return self._all_problems(self._rows[row])

    def _all_problems(self, r: SampleRow) -> list[Problem]:
        return [*r.problems, *r.encode_problems] if r.count_gen == self._gen else list(r.problems)

    def has_encoder(self) -> bool:
        return self._tokenizer is not None and self._options is not None

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self._tokenizer

    @property
    def template(self) -> ChatTemplate | None:
        return self._template

    @property
    def options(self) -> EncodeOptions | None:
        return self._options

    @property
    def generation(self) -> int:
        """Changes whenever the counts become stale (another tokenizer, template or settings)."""
        return self._gen

    def encoded(self, row: int) -> Encoded | None:
        """Tokens and trained mask of a sample (None without a model or when it cannot be encoded);
        encoded when asked (the token view's), the last few kept."""
        if not self.has_encoder():
            return None
        sample = self._rows[row].sample
        hit = self._encoded.get(id(sample))
        if hit is not None and hit[0] is sample:
            return hit[1]
        encoded, problems = self._encode(sample)
        if len(self._encoded) >= 8:
            self._encoded.clear()
        self._encoded[id(sample)] = (sample, encoded)
        self._set_counts(self._rows[row], count_row(sample, encoded, problems, 0))
        return encoded

    def encode_all(self) -> None:
        """Count every sample now (normally done in the background, or a slice at a time)."""
        for r in self._rows:
            self._ensure_counted(r)
        self._fill_timer.stop()

    def fully_counted(self) -> bool:
        return not self.has_encoder() or self._counted[0] >= len(self._rows)

    def stats(self) -> DatasetStats:
        rows, counted, tokens, trained, enc_problems, enc_errors = len(self._rows), *self._counted
        full = self.has_encoder() and counted >= rows
        return DatasetStats(
            samples=rows,
            with_reward=self._read[2],
            problems=self._read[0] + enc_problems,
            errors=self._read[1] + enc_errors,
            tokens=tokens if full else None,
            trained=trained if full else None,
            counted=counted,
        )

    def sort_key(self, row: int, col: int) -> Any:
        """What `SortRole` gives for a row."""
        return self._value(row, col, self._rows[row], sort=True)

    def sort_keys(self, col: int) -> np.ndarray:
        """Every row's sort key for a column, as an array that sorts like them (strings by rank);
        token counts not known yet sort first."""
        rows = self._rows
        n = len(rows)
        if col == self.COL_INDEX:
            return np.arange(n)
        if col == self.COL_LINE:
            return np.fromiter((r.sample.line for r in rows), dtype=np.int64, count=n)
        if col == self.COL_REWARD:
            return np.fromiter(
                (-1e300 if r.sample.reward is None else r.sample.reward for r in rows),
                dtype=np.float64,
                count=n,
            )
        if col == self.COL_SHAPE:
            kinds = {kind: i for i, kind in enumerate(sorted({r.sample.kind for r in rows}))}
            return np.fromiter((kinds[r.sample.kind] for r in rows), dtype=np.int64, count=n)
        if col == self.COL_WORDS:
            if self._word_ranks is None or len(self._word_ranks) != n:
                self._word_ranks = dense_ranks([r.words_key() for r in rows])
            return self._word_ranks
        gen, ok = self._gen, self.has_encoder()
        if col == self.COL_TOKENS:
            values = (r.n_tokens if ok and r.count_gen == gen else -1 for r in rows)
        elif col == self.COL_TRAINED:
            values = (
                (r.n_trained if r.n_tokens >= 0 else -1) if ok and r.count_gen == gen else -1 for r in rows
            )
        else:
            values = (len(r.problems) + (len(r.encode_problems) if r.count_gen == gen else 0) for r in rows)
        return np.fromiter(values, dtype=np.int64, count=n)

    def search_text(self, row: int) -> str:
        return self._rows[row].search_text()

    # --- counting -----------------------------------------------------------------------------
    def set_counter(self, counter: Counter | None) -> None:
        """Count tokens with `counter` in the background (None: a slice at a time on the UI thread)."""
        self._counter = counter

    def set_encoder(
        self, tokenizer: Tokenizer | None, template: ChatTemplate | None, options: EncodeOptions | None
    ) -> None:
        """Use this tokenizer, template and options for token counts (None: no model, no counts)."""
        self._tokenizer, self._template, self._options = tokenizer, template, options
        self._gen += 1  # every count is stale
        self._counted = [0, 0, 0, 0, 0]
        self._counting = False
        self._encoded.clear()
        self._columns_changed(*self.COUNT_COLUMNS)
        self._start_fill()
        self.sig_changed.emit()

    def take_counts(self, generation: int, results: Sequence[RowCounts]) -> None:
        """Counts a background counter made for `generation` (stale ones are dropped)."""
        if generation != self._gen:
            return
        for c in results:
            r = self._by_sample.get(id(c.sample))
            if r is not None and r.sample is c.sample and r.count_gen != self._gen:
                self._set_counts(r, c)
        if self._rows and results:
            self._columns_changed(*self.COUNT_COLUMNS)
        if self.fully_counted():
            self._counting = False
        self.sig_changed.emit()

    def counting_done(self, generation: int) -> None:
        """The background counter stopped (finished or not): count what is left on the UI thread."""
        if generation == self._gen:
            self._counting = False
            self._start_fill()

    def _encode(self, sample: Sample) -> tuple[Encoded | None, list[Problem]]:
        assert self._tokenizer is not None and self._options is not None
        try:
            encoded, problems = encode_samples([sample], self._tokenizer, self._template, self._options)
        except Exception as exc:  # noqa: BLE001 - a sample the engine chokes on is a problem, not a crash
            return None, [Problem(sample.line, f"cannot be encoded: {exc}", "error")]
        return (encoded[0] if encoded else None), problems

    def _ensure_counted(self, r: SampleRow) -> None:
        if r.count_gen == self._gen or not self.has_encoder():
            return
        encoded, problems = self._encode(r.sample)
        self._set_counts(r, count_row(r.sample, encoded, problems, 0))

    def _set_counts(self, r: SampleRow, c: RowCounts) -> None:
        if r.count_gen == self._gen:
            self._account_counts(r, -1)
        r.n_tokens, r.n_trained, r.truncated = c.n_tokens, c.n_trained, c.truncated
        r.encode_problems = list(c.problems)
        r.count_gen = self._gen
        self._account_counts(r, +1)

    def _account_counts(self, r: SampleRow, sign: int) -> None:
        t = self._counted
        t[0] += sign
        if r.n_tokens >= 0:
            t[1] += sign * r.n_tokens
            t[2] += sign * r.n_trained
        t[3] += sign * len(r.encode_problems)
        t[4] += sign * sum(1 for p in r.encode_problems if p.severity == "error")

    def _account_read(self, r: SampleRow, sign: int) -> None:
        t = self._read
        if r.problems:
            t[0] += sign * len(r.problems)
            t[1] += sign * sum(1 for p in r.problems if p.severity == "error")
        if r.sample.reward is not None:
            t[2] += sign

    def _start_fill(self) -> None:
        if not self.has_encoder() or self.fully_counted():
            return
        if self._counting:
            return
        if self._counter is not None:
            # none counted yet (a file just opened, a new model): every row, in the document's order,
            # copied at C speed (picking them out of 100,000 rows held the UI thread 17 ms)
            none = self._counted[0] == 0 and len(self.document) == len(self._rows)
            stale = (
                self.document.samples()
                if none
                else [r.sample for r in self._rows if r.count_gen != self._gen]
            )
            if self._counter(self._gen, stale):
                self._counting = True
                return
        self._fill_timer.start()

    def _fill_some(self) -> None:
        """Count rows for ~20 ms, then let the event loop run; sig_changed when all are counted."""
        deadline = time.perf_counter() + 0.02
        first = last = -1
        for i, r in enumerate(self._rows):
            if r.count_gen == self._gen:
                continue
            self._ensure_counted(r)
            first = i if first < 0 else first
            last = i
            if time.perf_counter() > deadline:
                break
        if first >= 0:
            self.dataChanged.emit(self.index(first, self.COL_TOKENS), self.index(last, self.COL_PROBLEMS))
        if self.fully_counted():
            self._fill_timer.stop()
            self.sig_changed.emit()

    # --- following the document ---------------------------------------------------------------
    def prepare_rows(self, prepared: PreparedRows) -> None:
        """Rows a loader made for the samples the document is about to hold (used at its next reset
        when it holds exactly those samples: the UI thread then makes none)."""
        self._prepared = prepared

    def _set_rows(self, rows: list[SampleRow]) -> None:
        self._rows = rows
        self._word_ranks = None
        self._by_sample = {id(r.sample): r for r in rows}
        self._read = [0, 0, 0]
        self._counted = [0, 0, 0, 0, 0]
        for r in rows:
            self._account_read(r, +1)
            if r.count_gen == self._gen:
                self._account_counts(r, +1)
        self._counting = False

    def _adopt_rows(self, prepared: PreparedRows) -> None:
        """`_set_rows` of rows made ahead (none counted), without a pass over them."""
        self._rows = prepared.rows
        self._by_sample = prepared.by_sample
        self._read = list(prepared.read)
        self._counted = [0, 0, 0, 0, 0]
        self._counting = False
        self._word_ranks = prepared.word_ranks

    def _new_row(self, sample: Sample) -> SampleRow:
        r = SampleRow(sample, self.document.problems_for(sample))
        self._by_sample[id(sample)] = r
        self._account_read(r, +1)
        return r

    def _drop_row(self, r: SampleRow) -> None:
        self._account_read(r, -1)
        if r.count_gen == self._gen:
            self._account_counts(r, -1)
        if self._by_sample.get(id(r.sample)) is r:
            del self._by_sample[id(r.sample)]

    def _document_changed(self, change: DatasetChange) -> None:
        """Mirror a change of the document in the rows (with the begin/end calls views need)."""
        doc, kind = self.document, change.kind
        if kind in ("inserted", "removed", "moved", "changed"):
            self._word_ranks = None
        if kind == "reset":
            prepared, self._prepared = self._prepared, None
            self.beginResetModel()
            if prepared is not None and _same_objects(prepared.samples, doc):
                self._adopt_rows(prepared)
            else:
                self._set_rows([SampleRow(s, doc.problems_for(s)) for s in doc])
            self.endResetModel()
        elif kind == "inserted":
            first, last = change.row, change.row + change.count - 1
            rows = [self._new_row(s) for s in map(doc.sample, range(first, last + 1))]
            self.beginInsertRows(QModelIndex(), first, last)
            self._rows[first:first] = rows
            self.endInsertRows()
            self._index_changed(first)
        elif kind == "removed":
            self.beginRemoveRows(QModelIndex(), change.row, change.row + change.count - 1)
            for r in self._rows[change.row : change.row + change.count]:
                self._drop_row(r)
            del self._rows[change.row : change.row + change.count]
            self.endRemoveRows()
            self._index_changed(change.row)
        elif kind == "moved":
            src, dst = change.row, change.dest
            # Qt wants the destination as "insert before this row" in the old numbering
            self.beginMoveRows(QModelIndex(), src, src, QModelIndex(), dst + 1 if dst > src else dst)
            self._rows.insert(dst, self._rows.pop(src))
            self.endMoveRows()
            self._index_changed(min(src, dst))
        elif kind == "changed":
            first, last = change.row, change.row + change.count - 1
            for i in range(first, last + 1):
                self._follow_sample(i)
            self.dataChanged.emit(self.index(first, 0), self.index(last, self.columnCount() - 1))
        else:
            return
        self._start_fill()
        self.sig_changed.emit()

    def _follow_sample(self, row: int) -> None:
        r, new = self._rows[row], self.document.sample(row)
        if new is r.sample:
            return
        self._drop_row(r)
        if replace(r.sample, line=new.line) == new:  # only its line in the file changed (a save)
            r.encode_problems = [replace(p, line=new.line) for p in r.encode_problems]
        else:
            r.count_gen = -1
            r.text = r.words = r.key = None
        r.sample, r.problems = new, self.document.problems_for(new)
        self._by_sample[id(new)] = r
        self._account_read(r, +1)
        if r.count_gen == self._gen:
            self._account_counts(r, +1)

    def _index_changed(self, first: int) -> None:
        if first < len(self._rows):
            self.dataChanged.emit(self.index(first, 0), self.index(len(self._rows) - 1, 0))

    def _columns_changed(self, *columns: int) -> None:
        if self._rows:
            self.dataChanged.emit(self.index(0, min(columns)), self.index(len(self._rows) - 1, max(columns)))

    # --- Qt model -----------------------------------------------------------------------------
    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802, B008
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802, B008
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole) -> Any:  # noqa: N802
        if orientation == Qt.Horizontal and 0 <= section < len(self.COLUMNS):
            if role == roles.DISPLAY:
                return self.COLUMNS[section]
            if role == roles.TOOLTIP:
                return self.HEADER_TIPS[section]
        elif orientation == Qt.Vertical and role == roles.DISPLAY and 0 <= section < len(self._rows):
            return section + 1
        return None

    def flags(self, index: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.NoItemFlags
        return Qt.ItemIsSelectable | Qt.ItemIsEnabled

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.DisplayRole) -> Any:
        # A view asks for a dozen roles per cell: the ones answered here are few, and the answers are
        # made once (brushes, icons, the font) so that a repaint of the rows in sight stays cheap.
        if role not in _ROLES or not index.isValid():
            return None
        return self.cell(index.row(), index.column(), role)

    def cell(self, row: int, col: int, role: int) -> Any:
        """`data` of the cell at (row, col), without an index (the filter model asks this way)."""
        if role not in _ROLES or not 0 <= row < len(self._rows):
            return None
        r = self._rows[row]
        if role == roles.DISPLAY or role == SortRole:
            return self._value(row, col, r, sort=role == SortRole)
        if role == roles.ALIGNMENT:
            return _RIGHT if col in self._RIGHT_COLUMNS else _LEFT
        if role == roles.TOOLTIP:
            return self._tooltip(col, r)
        if role == roles.FOREGROUND:
            if col == self.COL_PROBLEMS:
                severity = self._severity(r)
                return self._look("brush", severity) if severity else None
            if col == self.COL_LINE and not r.sample.line:
                return self._look("brush", "new")
            return None
        if role == roles.DECORATION:
            if col == self.COL_PROBLEMS:
                severity = self._severity(r)
                return self._look("icon", severity) if severity else None
            return None
        if role == roles.FONT and col == self.COL_SHAPE:
            return self._look("font", "italic")
        return None

    _RIGHT_COLUMNS = frozenset({0, 1, 4, 5, 6})  # index, line, reward, tokens, trained

    def _severity(self, r: SampleRow) -> str:
        """ "error", "warning" or "" for a row's problems (counting it first)."""
        self._ensure_counted(r)
        problems = self._all_problems(r)
        if not problems:
            return ""
        return "error" if any(p.severity == "error" for p in problems) else "warning"

    def _look(self, kind: str, name: str) -> Any:
        """A brush, icon or font made once (again after the palette changes: `forget_looks`)."""
        key = (kind, name)
        found = self._looks.get(key)
        if found is None:
            if kind == "brush":
                found = QBrush(QColor(TEXT_COLOURS[name][_dark()]))
            elif kind == "icon":
                if QApplication.instance() is None:
                    return None
                icon = QStyle.SP_MessageBoxCritical if name == "error" else QStyle.SP_MessageBoxWarning
                found = QApplication.style().standardIcon(icon)
            else:
                found = QFont()
                found.setItalic(True)
            self._looks[key] = found
        return found

    def forget_looks(self) -> None:
        """The palette or style changed: make brushes and icons again."""
        self._looks.clear()
        if self._rows:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self._rows) - 1, self.columnCount() - 1))

    def _value(self, row: int, col: int, r: SampleRow, *, sort: bool) -> Any:
        s = r.sample
        if col == self.COL_INDEX:
            return row + 1
        if col == self.COL_LINE:
            return s.line if sort else (str(s.line) if s.line else "new")
        if col == self.COL_SHAPE:
            return s.kind
        if col == self.COL_WORDS:
            return r.words_key() if sort else r.first_words()
        if col == self.COL_REWARD:
            if s.reward is None:
                return -1e300 if sort else ""
            return s.reward if sort else f"{s.reward:g}"
        if col in (self.COL_TOKENS, self.COL_TRAINED):
            if not self.has_encoder():
                return -1 if sort else NO_VALUE
            self._ensure_counted(r)
            if r.n_tokens < 0:
                return -1 if sort else NO_VALUE
            n = r.n_tokens if col == self.COL_TOKENS else r.n_trained
            if sort:
                return n
            return f"{n:,}" + (" ✂" if col == self.COL_TOKENS and r.truncated else "")
        if col == self.COL_PROBLEMS:
            self._ensure_counted(r)
            n = len(self._all_problems(r))
            return n if sort else (str(n) if n else "")
        return None

    def _tooltip(self, col: int, r: SampleRow) -> str | None:
        s = r.sample
        if col == self.COL_PROBLEMS:
            self._ensure_counted(r)
            problems = self._all_problems(r)
            if not problems:
                return "No problems found"
            more = f"\n(and {len(problems) - 1} more: see the Problems list)" if len(problems) > 1 else ""
            return f"{problems[0].severity}: {problems[0].message}{more}"
        if col in (self.COL_TOKENS, self.COL_TRAINED):
            if not self.has_encoder():
                return "Open a model on the Model page to count tokens"
            self._ensure_counted(r)
            if r.n_tokens < 0:
                return "This sample cannot be encoded: see its problems"
            if r.truncated and self._options is not None:
                return f"Cut to n_ctx = {self._options.n_ctx} tokens (✂): raise n_ctx or shorten the sample"
            return self.HEADER_TIPS[col]
        if col == self.COL_SHAPE:
            turns = f" ({len(s.messages)} turns)" if s.kind == "messages" else ""
            return f"{s.kind}{turns}: {SHAPE_HELP.get(s.kind, '')}"
        if col == self.COL_REWARD and s.reward is not None:
            clipped = min(1.0, max(-1.0, s.reward))
            note = "" if clipped == s.reward else f" (training clips it to {clipped:g})"
            return f"Reward {s.reward:g}{note}"
        if col == self.COL_WORDS:
            return sample_preview(s)
        return self.HEADER_TIPS[col]


def _same_objects(samples: list[Sample], doc: DatasetDocument) -> bool:
    return len(samples) == len(doc) and all(map(operator.is_, samples, doc.iter_samples()))


__all__ = [
    "Counter",
    "NO_VALUE",
    "ROLES",
    "SamplesModel",
    "SortRole",
]
