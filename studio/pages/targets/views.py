"""Qt views of a `TargetSelection`: the layers × kinds grid (a heatmap of checkmarks) and the tree of
real tensor names. Both models read and write the one selection, so they never disagree.

Not the page: presets, layer ranges, rank/alpha and the project live in `targets_page`.

One module (about 600 lines) on purpose: the grid's model, delegate, rotated header and view and the
tree's model are two views of one selection that share its item roles, check values and tooltips;
apart, each would import the other's helpers.
"""

from __future__ import annotations

from PySide6.QtCore import (
    QAbstractItemModel,
    QAbstractTableModel,
    QModelIndex,
    QPointF,
    QRect,
    QSize,
    Qt,
    Signal,
)
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableView,
    QWidget,
)

from engine import Candidate

from ...widgets.theme import is_dark
from .selection import TargetSelection, ab_shapes, is_expert, kind_help, shape_text

CELL_ROLE = Qt.UserRole + 1  # the Candidate of a grid cell or tree leaf (None for none)
# Roles and states as plain values: looking up Qt.DisplayRole & co. costs microseconds in PySide6, and
# data() runs thousands of times per repaint.
DISPLAY, CHECK, TOOLTIP, ALIGN = (
    int(r.value) for r in (Qt.DisplayRole, Qt.CheckStateRole, Qt.ToolTipRole, Qt.TextAlignmentRole)
)
CELL = int(CELL_ROLE)
CHECKED, UNCHECKED, PARTIAL = Qt.Checked, Qt.Unchecked, Qt.PartiallyChecked
ALIGN_RIGHT = int((Qt.AlignRight | Qt.AlignVCenter).value)
GRID_ROLES = frozenset({DISPLAY, CHECK, TOOLTIP, CELL})
TREE_ROLES = frozenset({DISPLAY, CHECK, TOOLTIP, ALIGN, CELL})
NO_FLAGS = Qt.NoItemFlags
CELL_FLAGS = Qt.ItemIsEnabled | Qt.ItemIsUserCheckable
LEAF_FLAGS = Qt.ItemIsEnabled | Qt.ItemIsSelectable
CHECKABLE_FLAGS = Qt.ItemIsEnabled | Qt.ItemIsSelectable | Qt.ItemIsUserCheckable
DISABLED_FLAGS = Qt.ItemIsSelectable
CELL_W, CELL_H = 26, 22
# (light, dark) colours of the grid's cells that have no group colour
VECTOR_FILL = ("#eceeef", "#3a3d41")  # a vector: cannot take LoRA (hatched)
VECTOR_HATCH = ("#b8bdc1", "#62666b")
EMPTY_BORDER = ("#c3c8cd", "#6a6e73")  # a tensor that is not selected (filled with the base colour)
BADGE_SCALE = 0.78  # expert badge font size, relative to the view's

GROUP_COLORS: dict[str, str] = {
    "attention": "#2f6fdf",
    "mlp": "#16a085",
    "shared": "#2e9e48",
    "experts": "#8e44ad",
    "router": "#d35400",
    "other": "#5d6d7e",
    "global": "#b7950b",
    "vector": "#a6acaf",
}
GROUP_NAMES: dict[str, str] = {
    "attention": "attention",
    "mlp": "MLP",
    "shared": "shared expert",
    "experts": "experts",
    "router": "router",
    "other": "other",
    "global": "global",
    "vector": "vector (not LoRA)",
}


def check_value(value) -> bool:
    """True for a Qt.Checked check-state value, whether it arrives as the enum or as an int."""
    if value is None:
        return False
    return (value.value if hasattr(value, "value") else int(value)) == Qt.Checked.value


def value(index: QModelIndex, role: int = DISPLAY):
    """index.data(role), asked of the Python model directly (no QVariant round trip)."""
    return index.model().data(index, role) if index.isValid() else None


def cell_tooltip(c: Candidate, rank: int, params: int) -> str:
    where = f"{c.name} — {shape_text(c.shape)}, {c.qtype}"
    if not c.lora_ok:
        return f"{where}\nCannot take LoRA: {c.reason}."
    a, b = ab_shapes(c, rank)
    pair = f"A {shape_text(a)}, B {shape_text(b)}"
    if is_expert(c):
        E = c.shape[0]
        head = f"{c.name} — {E} experts of {shape_text(c.shape[1:])}, {c.qtype}"
        return (
            f"{head}\nOne A/B pair per expert, {E} experts: {pair} = {params:,} parameters at rank {rank}.\n"
            "Each expert's adapter trains on the tokens routed to it."
        )
    return f"{where}\nLoRA at rank {rank}: {pair} = {params:,} parameters."


def short_reason(c: Candidate) -> str:
    """The tree's note for a tensor that cannot take LoRA (the tooltip has the engine's whole reason)."""
    if "train it in full instead" in c.reason:
        what = "bias" if c.name.endswith(".bias") else "vector"
        return f"{what}: train it in full instead"
    return c.reason


class TargetGridModel(QAbstractTableModel):
    """Rows: layers, then "global"; columns: tensor kinds (`selection.columns`). A cell is checked when
    its tensor gets a LoRA adapter; cells of vectors are disabled and say why."""

    def __init__(self, selection: TargetSelection, rank: int = 16, parent=None):
        super().__init__(parent)
        self.selection = selection
        self.rank = rank

    # --- structure ----------------------------------------------------------------------------
    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802, B008 - Qt API
        return 0 if parent.isValid() else len(self.selection.rows)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802, B008 - Qt API
        return 0 if parent.isValid() else len(self.selection.columns)

    def candidate(self, index: QModelIndex) -> Candidate | None:
        if not index.isValid():
            return None
        return self.selection.cell(
            self.selection.rows[index.row()], self.selection.columns[index.column()].kind
        )

    def index_of(self, name: str) -> QModelIndex:
        c = self.selection.by_name[name]
        kinds = [col.kind for col in self.selection.columns]
        return self.index(self.selection.rows.index(c.layer), kinds.index(c.kind))

    # --- data ---------------------------------------------------------------------------------
    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if role not in GRID_ROLES:
            return None
        c = self.candidate(index)
        if role == CELL:
            return c
        if c is None:
            if role == TOOLTIP:
                row = self.selection.rows[index.row()]
                where = "the global tensors" if row is None else f"layer {row}"
                return f"{where} has no {self.selection.columns[index.column()].kind}"
            return None
        if role == DISPLAY:
            return f"{c.shape[0]}×" if is_expert(c) else ""
        if role == CHECK:
            if not c.lora_ok:
                return None
            return CHECKED if c.name in self.selection.selected else UNCHECKED
        if role == TOOLTIP:
            params = self.selection.lora_params(c.name, self.rank) if c.lora_ok else 0
            return cell_tooltip(c, self.rank, params)
        return None

    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        c = self.candidate(index)
        return CELL_FLAGS if c is not None and c.lora_ok else NO_FLAGS

    def setData(self, index: QModelIndex, value, role: int = Qt.EditRole) -> bool:  # noqa: N802
        c = self.candidate(index)
        if role != CHECK or c is None or not c.lora_ok:
            return False
        self.selection.set_checked([c.name], check_value(value))
        return True

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole):  # noqa: N802
        if orientation == Qt.Horizontal:
            if not 0 <= section < len(self.selection.columns):
                return None
            col = self.selection.columns[section]
            if role == DISPLAY:
                return col.kind
            if role == TOOLTIP:
                if not col.lora:
                    return (
                        f"{col.kind}: {kind_help(col.kind)}. A vector: cannot take LoRA (train it in full)."
                    )
                extra = ""
                if col.group == "experts":
                    c = next(c for c in self.selection.candidates if c.kind == col.kind)
                    extra = f" One A/B pair per expert ({c.shape[0]} experts)."
                return f"{col.kind}: {kind_help(col.kind)}.{extra}\nClick to toggle it in every layer."
            if role == CELL_ROLE:
                return col
            return None
        if not 0 <= section < len(self.selection.rows):
            return None
        row = self.selection.rows[section]
        if role == DISPLAY:
            return "global" if row is None else f"blk.{row}"
        if role == TOOLTIP:
            if row is None:
                return "Global tensors (embedding, output). Click to toggle all of them."
            return f"Layer {row}. Click to toggle every LoRA-capable tensor of this layer."
        return None

    def refresh(self, names: set[str] | None = None) -> None:
        """Repaint the cells of `names` (None: every cell, e.g. after a rank change)."""
        if not self.rowCount() or not self.columnCount():
            return
        if names is None:
            self.dataChanged.emit(self.index(0, 0), self.index(self.rowCount() - 1, self.columnCount() - 1))
            return
        cells = [self.index_of(n) for n in names if n in self.selection.by_name]
        if cells:
            rows = [i.row() for i in cells]
            cols = [i.column() for i in cells]
            self.dataChanged.emit(self.index(min(rows), min(cols)), self.index(max(rows), max(cols)))


class GridDelegate(QStyledItemDelegate):
    """Paints a cell as a heatmap square: filled with its group's colour when checked, outlined when
    not, hatched grey when it cannot take LoRA; expert stacks carry an "E×" badge."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        model = index.model()  # read through the Python model: see value()
        c: Candidate | None = model.candidate(index)
        if c is None:
            return
        col = model.headerData(index.column(), Qt.Horizontal, CELL_ROLE)
        color = QColor(GROUP_COLORS[col.group])
        r = QRect(option.rect).adjusted(2, 2, -2, -2)
        dark = is_dark(option.palette)
        painter.save()
        painter.setRenderHint(QPainter.Antialiasing)
        if not c.lora_ok:
            painter.setPen(Qt.NoPen)
            painter.setBrush(QColor(VECTOR_FILL[dark]))
            painter.drawRect(r)
            painter.setBrush(QBrush(QColor(VECTOR_HATCH[dark]), Qt.BDiagPattern))
            painter.drawRect(r)
            painter.restore()
            return
        checked = model.data(index, CHECK) == CHECKED
        if checked:
            painter.setPen(QPen(color.darker(115), 1))
            painter.setBrush(color)
        else:
            painter.setPen(QPen(QColor(EMPTY_BORDER[dark]), 1))
            painter.setBrush(option.palette.base())
        painter.drawRoundedRect(r, 3, 3)
        badge = model.data(index, DISPLAY)
        if badge:
            font = QFont(option.font)
            font.setPointSizeF(max(6.0, font.pointSizeF() * BADGE_SCALE))
            font.setBold(True)
            painter.setFont(font)
            painter.setPen(QColor("#ffffff") if checked else (color.lighter(160) if dark else color))
            painter.drawText(r, Qt.AlignCenter, badge)
        elif checked:
            path = QPainterPath()
            cx, cy, s = r.center().x(), r.center().y(), min(r.width(), r.height()) / 2.0
            path.moveTo(QPointF(cx - 0.55 * s, cy + 0.05 * s))
            path.lineTo(QPointF(cx - 0.15 * s, cy + 0.45 * s))
            path.lineTo(QPointF(cx + 0.6 * s, cy - 0.45 * s))
            painter.setPen(QPen(QColor("#ffffff"), 2.0, Qt.SolidLine, Qt.RoundCap, Qt.RoundJoin))
            painter.setBrush(Qt.NoBrush)
            painter.drawPath(path)
        painter.restore()

    def sizeHint(self, option, index) -> QSize:  # noqa: N802 - Qt API
        return QSize(CELL_W, CELL_H)

    def editorEvent(self, event, model, option, index) -> bool:  # noqa: N802 - the view toggles cells
        return False


class RotatedHeaderView(QHeaderView):
    """Horizontal header with the kind names written bottom-to-top over narrow columns, each with a
    strip of its group's colour."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(Qt.Horizontal, parent)
        self.setSectionsClickable(True)
        self.setHighlightSections(False)
        self.setSectionResizeMode(QHeaderView.Fixed)
        self.setDefaultSectionSize(CELL_W)
        self.setMinimumSectionSize(CELL_W)

    def _text_height(self) -> int:
        fm = QFontMetrics(self.font())
        model = self.model()
        widths = [
            fm.horizontalAdvance(str(model.headerData(i, Qt.Horizontal, DISPLAY) or ""))
            for i in range(model.columnCount() if model else 0)
        ]
        return max(widths, default=40) + 14

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt API
        return QSize(super().sizeHint().width(), self._text_height())

    def sectionSizeFromContents(self, logical_index: int) -> QSize:  # noqa: N802 - Qt API
        return QSize(CELL_W, self._text_height())

    def paintSection(self, painter: QPainter, rect: QRect, logical_index: int) -> None:  # noqa: N802
        model = self.model()
        if model is None or not rect.isValid():
            return
        col = model.headerData(logical_index, Qt.Horizontal, CELL_ROLE)
        text = str(model.headerData(logical_index, Qt.Horizontal, DISPLAY) or "")
        painter.save()
        painter.fillRect(rect, self.palette().window())
        color = QColor(GROUP_COLORS[col.group] if col else "#888888")
        painter.fillRect(QRect(rect.left() + 2, rect.bottom() - 4, rect.width() - 4, 4), color)
        dim = self.palette().color(QPalette.PlaceholderText)  # a vector kind: readable, but quieter
        painter.setPen(self.palette().windowText().color() if col and col.lora else dim)
        fm = QFontMetrics(self.font())
        painter.translate(rect.left() + (rect.width() + fm.ascent() - fm.descent()) / 2.0, rect.bottom() - 8)
        painter.rotate(-90)
        painter.drawText(0, 0, text)
        painter.restore()


class TargetGridView(QTableView):
    """The grid: click a cell to toggle it, drag to paint the same state over more cells, Space toggles
    the current cell; header clicks are wired by the page (whole kind / whole layer)."""

    sig_cell_pressed = Signal(QModelIndex)  # a cell was clicked (the page shows it in the tree)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setHorizontalHeader(RotatedHeaderView(self))
        self.setItemDelegate(GridDelegate(self))
        self.setSelectionMode(QAbstractItemView.NoSelection)
        self.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.setShowGrid(False)
        self.setWordWrap(False)
        self.setCornerButtonEnabled(False)
        vh = self.verticalHeader()
        vh.setSectionResizeMode(QHeaderView.Fixed)
        vh.setDefaultSectionSize(CELL_H)
        vh.setMinimumSectionSize(CELL_H)
        vh.setSectionsClickable(True)
        vh.setHighlightSections(False)
        vh.setDefaultAlignment(Qt.AlignRight | Qt.AlignVCenter)
        self._paint: bool | None = None  # state being painted by a drag

    def _set(self, index: QModelIndex, on: bool) -> None:
        model = self.model()
        if index.isValid() and model.flags(index) & Qt.ItemIsUserCheckable:
            if check_value(value(index, CHECK)) != on:
                model.setData(index, CHECKED if on else UNCHECKED, CHECK)

    def mousePressEvent(self, event) -> None:  # noqa: N802 - Qt API
        index = self.indexAt(event.position().toPoint())
        if event.button() == Qt.LeftButton and index.isValid() and self.model().flags(index):
            self.setCurrentIndex(index)
            self._paint = not check_value(value(index, CHECK))
            self._set(index, self._paint)
            self.sig_cell_pressed.emit(index)
            event.accept()
            return
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event) -> None:  # noqa: N802 - Qt API
        if self._paint is not None:
            self._set(self.indexAt(event.position().toPoint()), self._paint)
            event.accept()
            return
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802 - Qt API
        if self._paint is not None:
            self._paint = None
            event.accept()
            return
        super().mouseReleaseEvent(event)

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt API
        index = self.currentIndex()
        if event.key() in (Qt.Key_Space, Qt.Key_Return, Qt.Key_Enter) and index.isValid():
            self._set(index, not check_value(value(index, CHECK)))
            event.accept()
            return
        super().keyPressEvent(event)

    def fit_columns(self) -> None:
        """Widen the columns whose cells carry an expert badge ("128×") so the badge fits."""
        model = self.model()
        if model is None or not model.rowCount():
            return
        font = QFont(self.font())
        font.setPointSizeF(max(6.0, font.pointSizeF() * BADGE_SCALE))
        font.setBold(True)
        fm = QFontMetrics(font)
        header = self.horizontalHeader()
        for col in range(model.columnCount()):
            badges = (model.data(model.index(row, col), DISPLAY) or "" for row in range(model.rowCount()))
            widest = max((fm.horizontalAdvance(b) for b in badges), default=0)
            header.resizeSection(col, max(CELL_W, widest + 10))

    def content_height(self) -> int:
        """Height that shows every row (a taller view would only add empty space)."""
        return (
            self.horizontalHeader().sizeHint().height()
            + self.verticalHeader().length()
            + self.horizontalScrollBar().sizeHint().height()
            + 2 * self.frameWidth()
        )

    def content_width(self) -> int:
        """Width that shows every column without a horizontal scroll bar."""
        return (
            self.verticalHeader().sizeHint().width()
            + self.horizontalHeader().length()
            + self.verticalScrollBar().sizeHint().width()
            + 2 * self.frameWidth()
            + 4
        )


TREE_COLUMNS = ("Tensor", "Shape", "Type", "LoRA params", "Note")


class TargetTreeModel(QAbstractItemModel):
    """The real tensor names, grouped blk.0 … blk.N then global, with shape, type, LoRA parameters at
    the current rank, and a note (expert stacks, or why a vector cannot take LoRA). Leaves that can
    take LoRA and group rows are checkable; vectors are listed disabled."""

    def __init__(self, selection: TargetSelection, rank: int = 16, parent=None):
        super().__init__(parent)
        self.selection = selection
        self.rank = rank
        self.groups: list[tuple[int | None, list[Candidate]]] = [
            (row, [c for c in selection.candidates if c.layer == row]) for row in selection.rows
        ]
        self._leaf_pos = {c.name: (g, i) for g, (_, cs) in enumerate(self.groups) for i, c in enumerate(cs)}
        self._group_lora = [[c.name for c in cs if c.lora_ok] for _, cs in self.groups]

    # --- structure ----------------------------------------------------------------------------
    # internalId 0 marks a group row; a leaf of group g carries g + 1.
    def index(self, row: int, column: int, parent=QModelIndex()) -> QModelIndex:  # noqa: B008
        if not self.hasIndex(row, column, parent):
            return QModelIndex()
        if not parent.isValid():
            return self.createIndex(row, column, 0)
        return self.createIndex(row, column, parent.row() + 1)

    def parent(self, index: QModelIndex = QModelIndex()) -> QModelIndex:  # noqa: B008
        if not index.isValid() or index.internalId() == 0:
            return QModelIndex()
        return self.createIndex(index.internalId() - 1, 0, 0)

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802, B008 - Qt API
        if not parent.isValid():
            return len(self.groups)
        if parent.internalId() == 0 and parent.column() == 0:
            return len(self.groups[parent.row()][1])
        return 0

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802, B008 - Qt API
        return len(TREE_COLUMNS)

    def leaf(self, index: QModelIndex) -> Candidate | None:
        if not index.isValid() or index.internalId() == 0:
            return None
        return self.groups[index.internalId() - 1][1][index.row()]

    def index_of(self, name: str, column: int = 0) -> QModelIndex:
        g, i = self._leaf_pos[name]
        return self.index(i, column, self.index(g, 0))

    def column_widths(self, fm: QFontMetrics, indentation: int) -> list[int]:
        """Widths that fit the longest text of each column (cheaper than resizeColumnToContents)."""
        cands = self.selection.candidates
        most = max((self.selection.lora_params(c.name, self.rank) for c in cands if c.lora_ok), default=0)
        longest = [
            max((c.name for c in cands), key=len, default=""),
            max((shape_text(c.shape) for c in cands), key=len, default=""),
            max((c.qtype for c in cands), key=len, default=""),
            f"{most:,}",
        ]
        widths = [
            max(fm.horizontalAdvance(t), fm.horizontalAdvance(h)) + 16
            for t, h in zip(longest, TREE_COLUMNS[:4], strict=True)
        ]
        widths[0] += 2 * indentation + 20  # two levels of indentation and the check box
        return widths

    def group_index(self, layer: int | None) -> QModelIndex:
        return self.index(self.selection.rows.index(layer), 0)

    # --- data ---------------------------------------------------------------------------------
    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if role not in TREE_ROLES or not index.isValid():
            return None
        c = self.leaf(index)
        if c is None:
            return self._group_data(index, role)
        col = index.column()
        if role == CELL:
            return c
        if role == DISPLAY:
            if col == 0:
                return c.name
            if col == 1:
                return shape_text(c.shape)
            if col == 2:
                return c.qtype
            if col == 3:
                return f"{self.selection.lora_params(c.name, self.rank):,}" if c.lora_ok else "—"
            if c.lora_ok:
                return f"one A/B per expert ({c.shape[0]})" if is_expert(c) else ""
            return short_reason(c)
        if role == CHECK:
            if col != 0 or not c.lora_ok:
                return None
            return CHECKED if c.name in self.selection.selected else UNCHECKED
        if role == TOOLTIP:
            params = self.selection.lora_params(c.name, self.rank) if c.lora_ok else 0
            return cell_tooltip(c, self.rank, params)
        if role == ALIGN and col == 3:
            return ALIGN_RIGHT
        return None

    def _group_data(self, index: QModelIndex, role: int):
        if role == CELL:
            return None
        layer = self.groups[index.row()][0]
        lora = self._group_lora[index.row()]
        chosen = [n for n in lora if n in self.selection.selected]
        col = index.column()
        if role == DISPLAY:
            if col == 0:
                return "global" if layer is None else f"blk.{layer}"
            if col == 3:
                return f"{sum(self.selection.lora_params(n, self.rank) for n in chosen):,}" if chosen else ""
            if col == 4:
                return f"{len(chosen)} of {len(lora)} selected"
            return ""
        if role == CHECK:
            if col != 0 or not lora:
                return None
            if not chosen:
                return UNCHECKED
            return CHECKED if len(chosen) == len(lora) else PARTIAL
        if role == TOOLTIP:
            where = "the global tensors" if layer is None else f"layer {layer}"
            return f"Tick to give every LoRA-capable tensor of {where} an adapter; untick to remove them."
        if role == ALIGN and col == 3:
            return ALIGN_RIGHT
        return None

    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return NO_FLAGS
        c = self.leaf(index)
        if c is None:
            checkable = index.column() == 0 and bool(self._group_lora[index.row()])
            return CHECKABLE_FLAGS if checkable else LEAF_FLAGS
        if not c.lora_ok:
            return DISABLED_FLAGS
        return CHECKABLE_FLAGS if index.column() == 0 else LEAF_FLAGS

    def setData(self, index: QModelIndex, value, role: int = Qt.EditRole) -> bool:  # noqa: N802
        if role != CHECK or not index.isValid() or index.column() != 0:
            return False
        c = self.leaf(index)
        if c is None:
            names = [x.name for x in self.groups[index.row()][1] if x.lora_ok]
        elif c.lora_ok:
            names = [c.name]
        else:
            return False
        self.selection.set_checked(names, check_value(value))
        return True

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole):  # noqa: N802
        if orientation == Qt.Horizontal and role == DISPLAY and 0 <= section < len(TREE_COLUMNS):
            return TREE_COLUMNS[section]
        return None

    def refresh(self, names: set[str] | None = None) -> None:
        """Repaint the leaves of `names` and their groups (None: everything, e.g. after a rank change)."""
        last = len(TREE_COLUMNS) - 1
        if names is None:
            for g, (_, cands) in enumerate(self.groups):
                group = self.index(g, 0)
                if cands:
                    self.dataChanged.emit(self.index(0, 0, group), self.index(len(cands) - 1, last, group))
            if self.groups:
                self.dataChanged.emit(self.index(0, 0), self.index(len(self.groups) - 1, last))
            return
        groups = set()
        for name in names:
            if name in self._leaf_pos:
                g, i = self._leaf_pos[name]
                leaf = self.index(i, 0, self.index(g, 0))
                self.dataChanged.emit(leaf, leaf, [CHECK])
                groups.add(g)
        for g in sorted(groups):
            self.dataChanged.emit(self.index(g, 0), self.index(g, last))
