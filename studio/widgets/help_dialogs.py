"""The Help menu's dialogs: the quick start (the steps of the work, each with a link to its page) and the
list of keyboard shortcuts.

Both show what they are given: the window writes the steps (with its real shortcuts) and reads the
shortcuts from its actions and buttons when the dialog opens, so neither list goes stale. Not the
window's menus, and no knowledge of pages.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QLineEdit,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)


class QuickStartDialog(QDialog):
    """The steps of the work in order: (key, title, html text); each title links to its page
    (`sig_page_requested(key)`, and the dialog closes)."""

    sig_page_requested = Signal(str)

    def __init__(self, steps: Sequence[tuple[str, str, str]], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Quick start")
        layout = QVBoxLayout(self)
        words = {6: "six", 7: "seven", 8: "eight", 9: "nine"}
        count = words.get(len(steps), str(len(steps)))
        self.intro = intro = QLabel(
            f"Fine-tuning a model takes {count} steps, one page each. Click a step to go to its page."
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.step_labels: list[QLabel] = []
        for i, (key, title, text) in enumerate(steps, 1):
            label = QLabel(f"<b>{i}. <a href='{key}'>{title}</a></b> — {text}")
            label.setWordWrap(True)
            label.setTextFormat(Qt.RichText)
            label.setTextInteractionFlags(Qt.TextBrowserInteraction)
            label.linkActivated.connect(self._go)
            layout.addWidget(label)
            self.step_labels.append(label)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.resize(560, self.sizeHint().height())

    def _go(self, key: str) -> None:
        self.sig_page_requested.emit(key)
        self.accept()


class ShortcutsDialog(QDialog):
    """Every keyboard shortcut: (where, what, keys) rows in a sortable table with a filter field."""

    COLUMNS = ("Keys", "Action", "Where")

    def __init__(self, rows: Sequence[tuple[str, str, str]], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.rows = list(rows)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter by key, action or page")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._filter)
        self.table = QTableWidget(len(self.rows), len(self.COLUMNS))
        self.table.setHorizontalHeaderLabels(list(self.COLUMNS))
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setAlternatingRowColors(True)
        for r, (where, what, keys) in enumerate(self.rows):
            for c, text in enumerate((keys, what, where)):
                self.table.setItem(r, c, QTableWidgetItem(text))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeToContents)
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 6)
        # in the order given (menus, then pages) until a header is clicked
        header.setSortIndicator(-1, Qt.AscendingOrder)
        self.table.setSortingEnabled(True)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.filter)
        layout.addWidget(self.table, 1)
        layout.addWidget(buttons)
        self.resize(620, 560)

    def visible_rows(self) -> list[tuple[str, str, str]]:
        """The rows the filter leaves, as (where, what, keys), in the table's order."""
        out = []
        for r in range(self.table.rowCount()):
            if not self.table.isRowHidden(r):
                keys, what, where = (self.table.item(r, c).text() for c in range(3))
                out.append((where, what, keys))
        return out

    def _filter(self, text: str) -> None:
        needle = text.strip().lower()
        for r in range(self.table.rowCount()):
            cells = " ".join(self.table.item(r, c).text() for c in range(3)).lower()
            self.table.setRowHidden(r, bool(needle) and needle not in cells)


__all__ = ["QuickStartDialog", "ShortcutsDialog"]
