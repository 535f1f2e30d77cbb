"""Sample answers during training: the prompts to answer every N steps, and the table of answers
(step, prompt, answer) that grows as a run's SampleAnswers events come in (Train and Runs pages)."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import SampleAnswers


class SampleAnswersTable(QTableWidget):
    """Step | Prompt | Answer, a row per prompt per SampleAnswers event, newest last."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, 3, parent)
        self.setHorizontalHeaderLabels(["Step", "Prompt", "Answer"])
        self.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeToContents)
        self.horizontalHeader().setSectionResizeMode(1, QHeaderView.Stretch)  # prompt and answer share
        self.horizontalHeader().setSectionResizeMode(2, QHeaderView.Stretch)  # the width, wrapped
        self.verticalHeader().hide()
        self.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.setWordWrap(True)

    def add_event(self, event: SampleAnswers) -> None:
        for prompt, answer in zip(event.prompts, event.answers, strict=True):
            r = self.rowCount()
            self.insertRow(r)
            for c, text in enumerate((str(event.step), prompt, answer)):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.setItem(r, c, item)
        self.resizeRowsToContents()
        self.scrollToBottom()

    def rows(self) -> list[tuple[str, str, str]]:
        return [tuple(self.item(r, c).text() for c in range(3)) for r in range(self.rowCount())]

    def clear_rows(self) -> None:
        self.setRowCount(0)


class SampleAnswersWidget(QWidget):
    """The Train page's tab: prompts (one a line) and how often, above the table of answers."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        row = QHBoxLayout()
        self.prompts_edit = QPlainTextEdit()
        self.prompts_edit.setPlaceholderText(
            "Prompts to answer during training, one a line (greedy, 48 tokens, with the adapter of that step)"
        )
        self.prompts_edit.setMaximumHeight(70)
        self.every_spin = QSpinBox()
        self.every_spin.setRange(1, 1_000_000)
        self.every_spin.setValue(10)
        self.every_spin.setPrefix("every ")
        self.every_spin.setSuffix(" steps")
        row.addWidget(self.prompts_edit, 1)
        row.addWidget(self.every_spin)
        layout.addLayout(row)
        self.table = SampleAnswersTable()
        layout.addWidget(self.table, 1)
        self.empty = QLabel("No sample answers yet: type prompts above, then start a run.")
        self.empty.setObjectName("faint")
        layout.addWidget(self.empty)

    def prompts(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.prompts_edit.toPlainText().splitlines() if p.strip())

    def every(self) -> int:
        return int(self.every_spin.value())

    def add_event(self, event: SampleAnswers) -> None:
        self.table.add_event(event)
        self.empty.hide()

    def clear(self) -> None:
        self.table.clear_rows()
        self.empty.show()
