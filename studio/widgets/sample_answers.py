"""Sample answers during training: the prompts to answer every N steps, and the table of answers
(step, prompt, answer) that grows as a run's SampleAnswers events come in (Train and Runs pages)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QRadioButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import SampleAnswers

from ..project import Project, SampleAnswerSettings
from .faint_label import FaintLabel


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
    """The Train page's tab: which prompts are answered (typed ones, one a line, or the first N of the
    validation split) and how often, above the table of answers. The choice is the project's
    (`Project.sample_answers`, saved with it): edits here change the project, and a project loaded
    or restored shows its own."""

    def __init__(self, project: Project, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.project = project
        self._showing = False  # True while the widgets are set from the project
        layout = QVBoxLayout(self)
        row = QHBoxLayout()
        choice = QVBoxLayout()
        self.typed_radio = QRadioButton("Typed prompts")
        self.typed_radio.setToolTip("Answer the prompts typed beside, one a line (the default)")
        self.validation_radio = QRadioButton("From the validation split:")
        self.validation_radio.setToolTip(
            "Answer the prompts of the first N held-out samples (in file order, each prompt once), "
            "rendered with the chat template as the typed ones are"
        )
        self.source_group = QButtonGroup(self)
        self.source_group.addButton(self.typed_radio)
        self.source_group.addButton(self.validation_radio)
        self.count_spin = QSpinBox()
        self.count_spin.setRange(1, 1000)
        self.count_spin.setSuffix(" prompts")
        self.count_spin.setToolTip("How many validation samples' prompts are answered (default 3)")
        self.every_spin = QSpinBox()
        self.every_spin.setRange(1, 1_000_000)
        self.every_spin.setPrefix("every ")
        self.every_spin.setSuffix(" steps")
        self.every_spin.setToolTip("Steps between sample answers (default 10)")
        choice.addWidget(self.typed_radio)
        from_val = QHBoxLayout()
        from_val.addWidget(self.validation_radio)
        from_val.addWidget(self.count_spin)
        choice.addLayout(from_val)
        choice.addWidget(self.every_spin)
        choice.addStretch(1)
        self.prompts_edit = QPlainTextEdit()
        self.prompts_edit.setPlaceholderText(
            "Prompts to answer during training, one a line (greedy, 48 tokens, with the adapter of that step)"
        )
        self.prompts_edit.setMaximumHeight(80)
        row.addLayout(choice)
        row.addWidget(self.prompts_edit, 1)
        layout.addLayout(row)
        self.validation_note = QLabel()  # what the validation choice will answer, or why nothing
        self.validation_note.setWordWrap(True)
        self.validation_note.setTextFormat(Qt.RichText)
        layout.addWidget(self.validation_note)
        self.table = SampleAnswersTable()
        layout.addWidget(self.table, 1)
        self.empty = FaintLabel("No sample answers yet: choose the prompts above, then start a run.")
        layout.addWidget(self.empty)
        self._show_project()
        for signal in (
            self.prompts_edit.textChanged, self.source_group.buttonToggled,
            self.count_spin.valueChanged, self.every_spin.valueChanged,
        ):  # fmt: skip
            signal.connect(self._edited)
        project.subscribe(self._project_changed)
        self.destroyed.connect(lambda *_, cb=self._project_changed: project.unsubscribe(cb))

    # --- the choice, the project's -----------------------------------------------------------------
    def settings(self) -> SampleAnswerSettings:
        """What the widgets show (the project's, once edits are taken)."""
        prompts = tuple(p.strip() for p in self.prompts_edit.toPlainText().splitlines() if p.strip())
        source = "validation" if self.validation_radio.isChecked() else "typed"
        return SampleAnswerSettings(
            prompts, source, int(self.count_spin.value()), int(self.every_spin.value())
        )

    def summary(self) -> str:
        """What is chosen, in a few words after the tab's name (" (2 typed prompts, every 10 steps)"),
        or nothing when no prompt is."""
        s = self.project.sample_answers
        if s.source == "validation":
            return f" ({s.count} from the validation split, every {s.every} steps)"
        if s.prompts:
            n = len(s.prompts)
            return f" ({n} typed prompt{'s' if n > 1 else ''}, every {s.every} steps)"
        return ""

    def prompts(self) -> tuple[str, ...]:
        return self.settings().prompts

    def every(self) -> int:
        return int(self.every_spin.value())

    def _edited(self, *_: object) -> None:
        if self._showing:
            return
        self._show_note()
        if self.settings() != self.project.sample_answers:
            self.project.update(sample_answers=self.settings())

    def _project_changed(self, changed: set[str]) -> None:
        if "sample_answers" in changed and self.project.sample_answers != self.settings():
            self._show_project()
        elif changed & {"config", "config.val_split"}:
            self._show_note()

    def _show_project(self) -> None:
        s = self.project.sample_answers
        self._showing = True
        try:
            if tuple(self.prompts()) != s.prompts:
                self.prompts_edit.setPlainText("\n".join(s.prompts))
            (self.validation_radio if s.source == "validation" else self.typed_radio).setChecked(True)
            self.count_spin.setValue(s.count)
            self.every_spin.setValue(s.every)
        finally:
            self._showing = False
        self._show_note()

    def _show_note(self) -> None:
        """Which prompts a run answers with the validation choice, or why it has none."""
        validation = self.validation_radio.isChecked()
        self.prompts_edit.setEnabled(not validation)
        self.count_spin.setEnabled(validation)
        split = self.project.config.val_split
        if validation and not split:
            self.validation_note.setText(
                "<b>No validation split</b>: the Settings' validation split is 0, so no sample is held "
                "out and there are no prompts to take. Set a validation split (e.g. 0.1) or type prompts."
            )
        elif validation:
            self.validation_note.setText(
                f"The prompts of the first {self.count_spin.value()} validation samples (the {split:.0%} "
                "held out), in file order, each once; a sample without a prompt (text) is passed over."
            )
        self.validation_note.setVisible(validation)

    # --- the answers -------------------------------------------------------------------------------
    def add_event(self, event: SampleAnswers) -> None:
        self.table.add_event(event)
        self.empty.hide()

    def clear(self) -> None:
        self.table.clear_rows()
        self.empty.show()
