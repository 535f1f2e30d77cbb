"""A blind A/B choice between two answers: the Chat page's side by side and the Rewards page's A/B tab.

`BlindChoiceWidget.set_pair(pair)` shows an engine `BlindPair` as two columns titled only "A" and
"B" (the pair put them in a random order); the person chooses with the buttons or the keys 1 / A,
2 / B, T (tie) and S (skip), and `sig_chosen("A" | "B" | "tie" | "skip")` fires. Who gave each
answer is shown only then (`reveal`). Two identical answers offer nothing to choose: only Skip.
The page that owns the widget writes the pair (engine `append_preference`) and says where.

What it is not: it generates and saves nothing.
"""

from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine import BlindPair, append_preference

from .buttons import action_button
from .faint_label import FaintLabel
from .page_layout import splitter
from .wrapping_label import wrapping_label

KEYS = {"A": ("1", "A"), "B": ("2", "B"), "tie": ("T",), "skip": ("S",)}


class _Column(QFrame):
    def __init__(self, name: str):
        super().__init__()
        self.setFrameShape(QFrame.StyledPanel)
        self.title = QLabel(f"<b>{name}</b>")
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setFocusPolicy(Qt.ClickFocus)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 6)
        layout.addWidget(self.title)
        layout.addWidget(self.text, 1)


class BlindChoiceWidget(QWidget):
    """Two answers as A and B; the person's choice (see the module docstring)."""

    sig_chosen = Signal(str)  # "A", "B", "tie" or "skip"

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.pair: BlindPair | None = None
        self.choice: str | None = None
        self.columns = {"A": _Column("A"), "B": _Column("B")}
        split = splitter(Qt.Horizontal, (self.columns["A"], self.columns["B"]))
        self.buttons = {
            "A": QPushButton("A is better"),
            "B": QPushButton("B is better"),
            "tie": QPushButton("Tie"),
            "skip": QPushButton("Skip"),
        }
        tips = {
            "A": "A is the better answer: saved as a preference pair, A chosen and B rejected (keys 1 or A)",
            "B": "B is the better answer: saved as a preference pair, B chosen and A rejected (keys 2 or B)",
            "tie": "Both are as good (or as bad): nothing to learn from, nothing is saved (key T)",
            "skip": "Do not judge this pair: nothing is saved (key S)",
        }
        row = QHBoxLayout()
        for key, b in self.buttons.items():
            b.setToolTip(tips[key])
            b.clicked.connect(lambda _=False, k=key: self.choose(k))
            row.addWidget(b)
            for seq in KEYS[key]:
                QShortcut(
                    QKeySequence(seq),
                    self,
                    lambda k=key: self.choose(k),
                    context=Qt.WidgetWithChildrenShortcut,
                )
        row.addStretch(1)
        self.status = wrapping_label()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(split, 1)
        layout.addLayout(row)
        layout.addWidget(self.status)
        self.clear()

    def clear(self, text: str = "") -> None:
        """No pair: empty columns (`text` in both, e.g. "Generating…")."""
        self.pair, self.choice = None, None
        for name, col in self.columns.items():
            col.title.setText(f"<b>{name}</b>")
            col.text.setPlainText(text)
        for b in self.buttons.values():
            b.setEnabled(False)
        self.status.setText("")

    def set_pair(self, pair: BlindPair) -> None:
        """Show a new pair; its sources stay hidden until a choice."""
        self.pair, self.choice = pair, None
        self.columns["A"].text.setPlainText(pair.a)
        self.columns["B"].text.setPlainText(pair.b)
        for name, col in self.columns.items():
            col.title.setText(f"<b>{name}</b>")
        same = pair.a == pair.b
        for key, b in self.buttons.items():
            b.setEnabled(key == "skip" or not same)
        self.status.setText(
            "The two answers are the same: nothing to choose between (Skip)."
            if same
            else "Which answer is better? 1 / A, 2 / B, T for a tie, S to skip. Who gave which is shown then."
        )
        self.setFocus()

    def choose(self, choice: str) -> bool:
        """Take the person's choice (buttons and keys call this); False when there is nothing to choose."""
        if self.pair is None or self.choice is not None or not self.buttons[choice].isEnabled():
            return False
        self.choice = choice
        for b in self.buttons.values():
            b.setEnabled(False)
        self.reveal(choice)
        self.sig_chosen.emit(choice)
        return True

    def reveal(self, choice: str) -> None:
        """Say who gave each answer, and mark the chosen one."""
        pair = self.pair
        if pair is None:
            return
        for name, source in (("A", pair.a_source), ("B", pair.b_source)):
            mark = " ✓ chosen" if choice == name else (" ✗ rejected" if choice in ("A", "B") else "")
            self.columns[name].title.setText(f"<b>{name}</b> · {source}{mark}")


PREFERENCES_FILE = "preferences.jsonl"


class PreferenceRecorder:
    """Where a page's A/B choices go, and how many it saved: `<output folder>/preferences.jsonl` unless
    the person chose another file (`custom_path`). `record` appends one choice (engine
    `append_preference`: flushed to disk before it returns) and says what it did, in words."""

    def __init__(self, output_folder):
        self.output_folder = output_folder  # () -> the project's output folder
        self.custom_path: str | None = None
        self.saved = 0
        self.ties = 0
        self.skipped = 0

    def path(self) -> str:
        return self.custom_path or os.path.join(self.output_folder(), PREFERENCES_FILE)

    def record(self, pair: BlindPair, choice: str, messages: list[dict], extra: dict | None = None) -> str:
        """Save the pair for "A"/"B" (DatasetError when it cannot be written); count a tie or a skip."""
        answers = pair.choose(choice)
        if answers is None:
            if choice == "tie":
                self.ties += 1
                return "A tie: nothing is saved (a pair teaches only when one answer is better)."
            self.skipped += 1
            return "Skipped: nothing is saved."
        chosen, rejected = answers
        path = self.path()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        info = {"chosen_from": pair.chosen_source(choice),
                "rejected_from": pair.b_source if choice == "A" else pair.a_source}  # fmt: skip
        append_preference(path, chosen, rejected, messages=messages, extra={**(extra or {}), **info})
        self.saved += 1
        return (
            f"{choice} ({pair.chosen_source(choice)}) is better: saved to {os.path.basename(path)} "
            f"({self.saved} pair{'s' if self.saved != 1 else ''} from this page)."
        )


class PreferencesFileRow(QWidget):
    """Where a page's choices go, with "Preferences file…" to choose another file and "Train on
    choices" (`sig_train_choices(path)`, enabled once the file exists)."""

    sig_train_choices = Signal(str)

    def __init__(self, recorder: PreferenceRecorder, parent: QWidget | None = None):
        super().__init__(parent)
        self.recorder = recorder
        self.label = FaintLabel(squeeze=True)
        self.file_button = action_button(
            "Preferences file…",
            self.choose_file,
            "Choose the JSON Lines file the A/B choices are appended to (never rewritten). Default: "
            f"{PREFERENCES_FILE} in the project's output folder (the Chat and Rewards pages share it).",
        )
        self.train_button = action_button(
            "Train on choices",
            self.train_on_choices,
            "Open the preferences file on the Dataset page and set the Train page's objective to DPO",
        )
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label, 1)
        row.addWidget(self.file_button)
        row.addWidget(self.train_button)
        self.refresh()

    def choose_file(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Preferences file", self.recorder.path(), "JSON Lines (*.jsonl)",
            options=QFileDialog.DontConfirmOverwrite,  # appended to, never replaced
        )  # fmt: skip
        if path:
            self.recorder.custom_path = path
            self.refresh()

    def refresh(self) -> None:
        """Show the file and how many pairs this page saved; Train on choices once it exists."""
        path = self.recorder.path()
        n = self.recorder.saved
        saved = f" · {n} pair{'s' if n != 1 else ''} saved here" if n else ""
        self.label.setText(f"Choices → {os.path.basename(path)}{saved}")
        self.label.setToolTip(path)
        self.train_button.setEnabled(os.path.isfile(path))

    def train_on_choices(self) -> None:
        path = self.recorder.path()
        if os.path.isfile(path):
            self.sig_train_choices.emit(path)


__all__ = ["BlindChoiceWidget", "PREFERENCES_FILE", "PreferenceRecorder", "PreferencesFileRow"]
