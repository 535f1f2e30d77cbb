"""The dataset being edited, as a Qt table model over a `DatasetDocument`.

`SamplesModel` adapts a document (one row per sample, in dataset order) for views: position, file
line, shape, first words, reward, token counts and problems. It observes the document and turns
its notifications into Qt's begin/end row signals; changes go to the document, never to the
model. Token counts come from `engine.encode_samples` with the open model's tokenizer and chat
template, cached per row and recomputed when that sample or the model changes; without a model
they show "–". `SamplesFilterModel` sorts and searches it (all the text of a sample,
case-insensitive). `rebuild_sample` makes an edited copy of a frozen `Sample` and validates it.

What this module is not: it holds no samples of its own, reads and writes no files and keeps no
undo history (`studio.dataset_document.DatasetDocument` does all three).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QSortFilterProxyModel,
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
    chosen_text,
    encode_samples,
    parse_sample,
    sample_to_json,
)

from ...dataset_document import DatasetChange, DatasetDocument
from ...widgets.theme import is_dark

SortRole = Qt.UserRole + 1  # a value that sorts (numbers as numbers, None first)
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


def _dark() -> bool:
    app = QApplication.instance()
    return app is not None and is_dark(QApplication.palette())


# -- samples -----------------------------------------------------------------------------------


def rebuild_sample(sample: Sample, **changes: Any) -> tuple[Sample, list[Problem]]:
    """A copy of `sample` with `changes` (messages=, prompt=, response=, text=, reward=, rejected=) and
    what is wrong with it.

    The copy goes through `sample_to_json` and `parse_sample`, which validates it and recomputes
    its `group`. When it is not valid (an error problem, e.g. no assistant turn left) the
    unvalidated copy comes back with the problems, so that an edit in progress is never lost.
    """
    new = replace(sample, **changes)
    if new.kind == "prompt" and ("prompt" in changes or "response" in changes):
        new = replace(
            new,
            messages=(
                {"role": "user", "content": new.prompt},
                {"role": "assistant", "content": new.response},
            ),
        )
    parsed, problems = parse_sample(sample_to_json(new), new.line)
    return (parsed if parsed is not None else new), problems


def new_sample(kind: str = "messages") -> Sample:
    """An empty sample of one shape, ready to be filled in the editor."""
    if kind == "messages":
        obj: dict[str, Any] = {
            "messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
        }
    elif kind == "prompt":
        obj = {"prompt": "", "response": ""}
    elif kind == "text":
        obj = {"text": "-"}
    elif kind == "preference":
        obj = {"prompt": "", "chosen": "", "rejected": "-"}
    else:
        raise ValueError(f"sample kind {kind!r} is not one of messages, prompt, text, preference")
    sample, problems = parse_sample(obj, 0)
    assert sample is not None, problems
    if kind == "text":
        sample = replace(sample, text="")
    elif kind == "preference":
        sample = replace(sample, rejected="")
    return sample


def first_words(sample: Sample, limit: int = 90) -> str:
    """The start of the first user turn (or prompt, or text), on one line."""
    if sample.kind == "text":
        source = sample.text or ""
    elif sample.kind == "prompt":
        source = sample.prompt or ""
    else:
        users = [m.get("content") or "" for m in sample.messages if m.get("role") == "user"]
        source = users[0] if users else (sample.messages[0].get("content") or "" if sample.messages else "")
    words = " ".join(str(source).split())
    return words if len(words) <= limit else words[: limit - 1].rstrip() + "…"


def sample_text(sample: Sample) -> str:
    """All the text of a sample (roles and contents, reward), for searching."""
    parts = [sample.kind]
    if sample.kind == "text":
        parts.append(sample.text or "")
    else:
        for m in sample.messages:
            parts.append(str(m.get("role", "")))
            parts.append(str(m.get("content") or ""))
    if sample.rejected is not None:
        parts.append(sample.rejected)
    if sample.reward is not None:
        parts.append(f"{sample.reward:g}")
    return "\n".join(parts)


def sample_preview(sample: Sample, limit: int = 600) -> str:
    """A few lines showing the sample, for tooltips."""
    if sample.kind == "text":
        text = sample.text or ""
    else:
        text = "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in sample.messages)
        if sample.rejected is not None:  # a preference pair: its last turn is the chosen answer
            text = text.rsplit("\nassistant: ", 1)[0]
            text += f"\nchosen: {chosen_text(sample)}\nrejected: {sample.rejected}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- the table model ---------------------------------------------------------------------------


@dataclass(eq=False)
class SampleRow:
    """One row: a sample, what reading/validating it found, and its cached encoding."""

    sample: Sample
    problems: list[Problem] = field(default_factory=list)  # from loading or validating the sample
    encoded: Encoded | None = None
    encode_problems: list[Problem] = field(default_factory=list)
    encoded_ok: bool = False  # `encoded`/`encode_problems` are up to date
    keys: dict[int, Any] = field(default_factory=dict)  # sort key per column (cleared on change)

    def all_problems(self) -> list[Problem]:
        return [*self.problems, *self.encode_problems]


@dataclass(frozen=True)
class DatasetStats:
    samples: int
    with_reward: int
    problems: int  # on samples in the table (skipped lines are counted by the page)
    errors: int
    tokens: int | None  # None without a model or while counting
    trained: int | None
    counted: int  # rows whose tokens are known


class SamplesModel(QAbstractTableModel):
    """A Qt table over a `DatasetDocument` (a new, empty one when none is given): the document is
    the data, this only adapts it and caches token counts. `sig_changed` fires after any change to
    samples, problems or token counts.
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

    sig_changed = Signal()

    def __init__(self, document: DatasetDocument | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.document = document if document is not None else DatasetDocument()
        self._rows: list[SampleRow] = [SampleRow(s, self.document.problems_for(s)) for s in self.document]
        self._tokenizer: Tokenizer | None = None
        self._template: ChatTemplate | None = None
        self._options: EncodeOptions | None = None
        self._fill_timer = QTimer(self)
        self._fill_timer.setInterval(0)
        self._fill_timer.timeout.connect(self._fill_some)
        # a listener that does not keep the model alive, and leaves with it
        ref = weakref.ref(self)

        def listener(change: DatasetChange) -> None:
            model = ref()
            if model is not None:
                model._document_changed(change)

        document_ = self.document
        document_.subscribe(listener)
        self.destroyed.connect(lambda *_: document_.unsubscribe(listener))

    # --- reading ------------------------------------------------------------------------------
    @property
    def samples(self) -> list[Sample]:
        """A copy of the sample list, in dataset order."""
        return [r.sample for r in self._rows]

    def sample(self, row: int) -> Sample:
        return self._rows[row].sample

    def row_object(self, row: int) -> SampleRow:
        return self._rows[row]

    def row_of(self, obj: SampleRow) -> int:
        """Current position of a row object, -1 if it is not in the dataset."""
        for i, r in enumerate(self._rows):
            if r is obj:
                return i
        return -1

    def problems(self, row: int) -> list[Problem]:
        """Reading/validation problems, then encoding problems (when a model is open)."""
        r = self._rows[row]
        self._ensure_encoded(r)
        return r.all_problems()

    def known_problems(self, row: int) -> list[Problem]:
        """Like `problems`, without encoding the sample when its tokens are not counted yet."""
        return self._rows[row].all_problems()

    def has_encoder(self) -> bool:
        return self._tokenizer is not None and self._options is not None

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self._tokenizer

    @property
    def options(self) -> EncodeOptions | None:
        return self._options

    def encoded(self, row: int) -> Encoded | None:
        """Tokens and trained mask of a sample (None without a model or when it cannot be encoded)."""
        r = self._rows[row]
        self._ensure_encoded(r)
        return r.encoded

    def encode_all(self) -> None:
        """Encode every sample now (normally done a slice at a time in the background)."""
        for r in self._rows:
            self._ensure_encoded(r)
        self._fill_timer.stop()

    def fully_counted(self) -> bool:
        return not self.has_encoder() or all(r.encoded_ok for r in self._rows)

    def stats(self) -> DatasetStats:
        rows = self._rows
        problems = sum(len(r.all_problems()) for r in rows)
        errors = sum(1 for r in rows for p in r.all_problems() if p.severity == "error")
        counted = [r for r in rows if r.encoded_ok]
        tokens = trained = None
        if self.has_encoder() and len(counted) == len(rows):
            tokens = sum(len(r.encoded.tokens) for r in rows if r.encoded is not None)
            trained = sum(int(r.encoded.trained.sum()) for r in rows if r.encoded is not None)
        return DatasetStats(
            samples=len(rows),
            with_reward=sum(1 for r in rows if r.sample.reward is not None),
            problems=problems,
            errors=errors,
            tokens=tokens,
            trained=trained,
            counted=len(counted),
        )

    def sort_key(self, row: int, col: int) -> Any:
        """What `SortRole` gives, cached per row (sorting big datasets asks it n log n times)."""
        if col == self.COL_INDEX:
            return row
        r = self._rows[row]
        key = r.keys.get(col)
        if key is None:
            key = r.keys[col] = self._value(row, col, r, sort=True)
        return key

    def search_text(self, row: int) -> str:
        return sample_text(self._rows[row].sample).casefold()

    # --- encoding -----------------------------------------------------------------------------
    def set_encoder(
        self, tokenizer: Tokenizer | None, template: ChatTemplate | None, options: EncodeOptions | None
    ) -> None:
        """Use this tokenizer, template and options for token counts (None: no model, no counts)."""
        self._tokenizer, self._template, self._options = tokenizer, template, options
        for r in self._rows:
            r.encoded, r.encode_problems, r.encoded_ok = None, [], False
            r.keys.clear()
        self._columns_changed(self.COL_TOKENS, self.COL_PROBLEMS)
        self._start_fill()
        self.sig_changed.emit()

    def _ensure_encoded(self, r: SampleRow) -> None:
        if r.encoded_ok:
            return
        r.encoded_ok = True
        r.encoded, r.encode_problems = None, []
        r.keys.clear()
        if self._tokenizer is None or self._options is None:
            return
        try:
            encoded, problems = encode_samples([r.sample], self._tokenizer, self._template, self._options)
        except Exception as exc:  # noqa: BLE001 - a sample the engine chokes on is a problem, not a crash
            encoded, problems = [], [Problem(r.sample.line, f"cannot be encoded: {exc}", "error")]
        r.encoded = encoded[0] if encoded else None
        prefix = "sample 0: "
        r.encode_problems = [
            replace(p, message=p.message[len(prefix) :]) if p.message.startswith(prefix) else p
            for p in problems
        ]

    def _start_fill(self) -> None:
        if self.has_encoder() and not self.fully_counted():
            self._fill_timer.start()

    def _fill_some(self) -> None:
        """Encode rows for ~20 ms, then let the event loop run; sig_changed when all are counted."""
        deadline = time.perf_counter() + 0.02
        first = last = -1
        for i, r in enumerate(self._rows):
            if r.encoded_ok:
                continue
            self._ensure_encoded(r)
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
    def _document_changed(self, change: DatasetChange) -> None:
        """Mirror a change of the document in the rows (with the begin/end calls views need)."""
        doc, kind = self.document, change.kind
        if kind == "reset":
            self.beginResetModel()
            self._rows = [SampleRow(s, doc.problems_for(s)) for s in doc]
            self.endResetModel()
        elif kind == "inserted":
            first, last = change.row, change.row + change.count - 1
            rows = [SampleRow(s, doc.problems_for(s)) for s in map(doc.sample, range(first, last + 1))]
            self.beginInsertRows(QModelIndex(), first, last)
            self._rows[first:first] = rows
            self.endInsertRows()
            self._index_changed(first)
        elif kind == "removed":
            self.beginRemoveRows(QModelIndex(), change.row, change.row + change.count - 1)
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
        if replace(r.sample, line=new.line) == new:  # only its line in the file changed (a save)
            r.encode_problems = [replace(p, line=new.line) for p in r.encode_problems]
        else:
            r.encoded, r.encode_problems, r.encoded_ok = None, [], False
        r.sample, r.problems = new, self.document.problems_for(new)
        r.keys.clear()

    def _index_changed(self, first: int) -> None:
        if first < len(self._rows):
            self.dataChanged.emit(self.index(first, 0), self.index(len(self._rows) - 1, 0))

    def _columns_changed(self, first: int, last: int) -> None:
        if self._rows:
            self.dataChanged.emit(self.index(0, first), self.index(len(self._rows) - 1, last))

    # --- Qt model -----------------------------------------------------------------------------
    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802, B008
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802, B008
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole) -> Any:  # noqa: N802
        if orientation == Qt.Horizontal and 0 <= section < len(self.COLUMNS):
            if role == Qt.DisplayRole:
                return self.COLUMNS[section]
            if role == Qt.ToolTipRole:
                return self.HEADER_TIPS[section]
        elif orientation == Qt.Vertical and role == Qt.DisplayRole and 0 <= section < len(self._rows):
            return section + 1
        return None

    def flags(self, index: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.NoItemFlags
        return Qt.ItemIsSelectable | Qt.ItemIsEnabled

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.DisplayRole) -> Any:
        if not index.isValid() or not (0 <= index.row() < len(self._rows)):
            return None
        row, col = index.row(), index.column()
        r = self._rows[row]
        s = r.sample
        if role in (Qt.DisplayRole, SortRole):
            return self._value(row, col, r, sort=role == SortRole)
        if role == Qt.ToolTipRole:
            return self._tooltip(col, r)
        if role == Qt.TextAlignmentRole:
            if col in (self.COL_INDEX, self.COL_LINE, self.COL_REWARD, self.COL_TOKENS, self.COL_TRAINED):
                return Qt.AlignRight | Qt.AlignVCenter
            return Qt.AlignLeft | Qt.AlignVCenter
        if role == Qt.ForegroundRole and col == self.COL_PROBLEMS:
            self._ensure_encoded(r)
            if any(p.severity == "error" for p in r.all_problems()):
                return QBrush(QColor(TEXT_COLOURS["error"][_dark()]))
            if r.all_problems():
                return QBrush(QColor(TEXT_COLOURS["warning"][_dark()]))
        if role == Qt.ForegroundRole and col == self.COL_LINE and not s.line:
            return QBrush(QColor(TEXT_COLOURS["new"][_dark()]))
        if role == Qt.DecorationRole and col == self.COL_PROBLEMS:
            self._ensure_encoded(r)
            problems = r.all_problems()
            if problems and QApplication.instance() is not None:
                error = any(p.severity == "error" for p in problems)
                icon = QStyle.SP_MessageBoxCritical if error else QStyle.SP_MessageBoxWarning
                return QApplication.style().standardIcon(icon)
        if role == Qt.FontRole and col == self.COL_SHAPE:
            font = QFont()
            font.setItalic(True)
            return font
        return None

    def _value(self, row: int, col: int, r: SampleRow, *, sort: bool) -> Any:
        s = r.sample
        if col == self.COL_INDEX:
            return row + 1
        if col == self.COL_LINE:
            return s.line if sort else (str(s.line) if s.line else "new")
        if col == self.COL_SHAPE:
            return s.kind
        if col == self.COL_WORDS:
            words = first_words(s)
            return words.casefold() if sort else words
        if col == self.COL_REWARD:
            if s.reward is None:
                return -1e300 if sort else ""
            return s.reward if sort else f"{s.reward:g}"
        if col in (self.COL_TOKENS, self.COL_TRAINED):
            if not self.has_encoder():
                return -1 if sort else NO_VALUE
            self._ensure_encoded(r)
            if r.encoded is None:
                return -1 if sort else NO_VALUE
            n = len(r.encoded.tokens) if col == self.COL_TOKENS else int(r.encoded.trained.sum())
            if sort:
                return n
            return f"{n:,}" + (" ✂" if col == self.COL_TOKENS and r.encoded.truncated else "")
        if col == self.COL_PROBLEMS:
            self._ensure_encoded(r)
            n = len(r.all_problems())
            return n if sort else (str(n) if n else "")
        return None

    def _tooltip(self, col: int, r: SampleRow) -> str | None:
        s = r.sample
        if col == self.COL_PROBLEMS:
            self._ensure_encoded(r)
            problems = r.all_problems()
            if not problems:
                return "No problems found"
            more = f"\n(and {len(problems) - 1} more: see the Problems list)" if len(problems) > 1 else ""
            return f"{problems[0].severity}: {problems[0].message}{more}"
        if col in (self.COL_TOKENS, self.COL_TRAINED):
            if not self.has_encoder():
                return "Open a model on the Model page to count tokens"
            self._ensure_encoded(r)
            if r.encoded is None:
                return "This sample cannot be encoded: see its problems"
            if r.encoded.truncated and self._options is not None:
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


class SamplesFilterModel(QSortFilterProxyModel):
    """Sorts `SamplesModel` by its SortRole and keeps the rows whose text contains the search."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._needle = ""
        self._pinned: SampleRow | None = None
        self.setSortRole(SortRole)
        self.setDynamicSortFilter(True)

    @property
    def search(self) -> str:
        return self._needle

    def set_search(self, text: str) -> None:
        needle = text.strip().casefold()
        if needle == self._needle:
            return
        self.beginFilterChange()
        self._needle = needle
        self._pinned = None  # a new search shows what matches, the selected row included or not
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def sort(self, column: int, order: Qt.SortOrder = Qt.AscendingOrder) -> None:
        """Sorting by # ascending is the dataset's own order: no comparisons (fast on big files)."""
        if column == SamplesModel.COL_INDEX and order == Qt.AscendingOrder:
            column = -1
        super().sort(column, order)

    def lessThan(  # noqa: N802 - Qt override
        self, left: QModelIndex | QPersistentModelIndex, right: QModelIndex | QPersistentModelIndex
    ) -> bool:
        model = self.sourceModel()
        if isinstance(model, SamplesModel):
            col = left.column()
            return model.sort_key(left.row(), col) < model.sort_key(right.row(), col)
        return super().lessThan(left, right)

    def set_pinned(self, row: SampleRow | None, *, refilter: bool = False) -> None:
        """Keep this row visible whatever the search (the one being edited), until the search
        changes. `refilter`: show it now if it is hidden (otherwise it is only kept from hiding)."""
        self._pinned = row
        if refilter and row is not None and self._needle:
            self.beginFilterChange()
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def filterAcceptsRow(self, source_row: int, source_parent: QModelIndex | QPersistentModelIndex) -> bool:  # noqa: N802
        if not self._needle:
            return True
        model = self.sourceModel()
        if not isinstance(model, SamplesModel):
            return True
        if self._pinned is not None and model.row_object(source_row) is self._pinned:
            return True
        return self._needle in model.search_text(source_row)


__all__ = [
    "DatasetStats",
    "NO_VALUE",
    "ROLES",
    "SampleRow",
    "SamplesFilterModel",
    "SamplesModel",
    "SortRole",
    "first_words",
    "new_sample",
    "rebuild_sample",
    "sample_text",
]
