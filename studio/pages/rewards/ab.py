"""The Rewards page's A/B tab: two answers of the adapter being trained, shown blind, the better chosen.

"New pair" (Ctrl+Enter in the tab) samples two answers to the prompt with the page's reward session
(`RewardSession.sample`: the round being rated is left alone) and shows them as A and B in a random
order (studio.widgets.blind_choice); the person chooses A, B, a tie or skips. A choice is appended
at once to the preferences file (`<output folder>/preferences.jsonl` unless another is chosen) as a
{"messages", "chosen", "rejected"} pair: the same file the Chat page's choices go to, a dataset
for DPO or ORPO ("Train on choices" hands it to the Dataset and Train pages).

What it is not: it takes no training step (the pairs train on the Train page).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from engine import EngineError, blind_pair

from ...widgets.blind_choice import BlindChoiceWidget, PreferenceRecorder, PreferencesFileRow
from ...widgets.buttons import action_button
from ...widgets.faint_label import FaintLabel
from ..generation import chat_messages


def prompt_inputs(placeholder: str) -> tuple[QPlainTextEdit, QLineEdit]:
    """A tab's prompt box (a few lines high; Tab moves on) and its optional system prompt line."""
    prompt = QPlainTextEdit()
    prompt.setPlaceholderText(placeholder)
    prompt.setTabChangesFocus(True)
    prompt.setMaximumHeight(64)
    system = QLineEdit()
    system.setPlaceholderText("System prompt (optional)")
    system.setClearButtonEnabled(True)
    return prompt, system


class ABTabWidget(QWidget):
    """Blind A/B pairs of the adapter's answers (see the module docstring)."""

    sig_train_choices = Signal(str)  # the preferences file
    sig_chosen = Signal(str)  # "A", "B", "tie" or "skip"

    def __init__(self, page, parent: QWidget | None = None):
        super().__init__(parent)
        self.page = page  # the RewardsPage: its session, settings and engine jobs
        self.preferences = PreferenceRecorder(page.project.output_folder)
        self._context: dict | None = None
        self.prompt_edit, self.system_edit = prompt_inputs(
            "A prompt for two answers, e.g. Tell me something."
        )
        self.pair_button = action_button(
            "New pair",
            self.new_pair,
            "Sample two answers with the adapter as it is now and show them blind (Ctrl+Enter in this tab)",
        )
        QShortcut(QKeySequence("Ctrl+Return"), self, self.new_pair, context=Qt.WidgetWithChildrenShortcut)
        self.status = FaintLabel(wrap=True, squeeze=True)
        self.blind = BlindChoiceWidget()
        self.blind.sig_chosen.connect(self._chosen)
        self.files = PreferencesFileRow(self.preferences)
        self.files.sig_train_choices.connect(self.sig_train_choices)
        self.train_button = self.files.train_button
        row = QHBoxLayout()
        row.addWidget(self.system_edit, 1)
        row.addWidget(self.pair_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        layout.addWidget(QLabel("<b>Prompt</b>"))
        layout.addWidget(self.prompt_edit)
        layout.addLayout(row)
        layout.addWidget(self.status)
        layout.addWidget(self.blind, 1)
        layout.addWidget(self.files)

    def set_busy(self, busy: bool) -> None:
        self.pair_button.setEnabled(not busy)

    def new_pair(self) -> bool:
        """Sample two answers in the worker and show them blind; False (and why, in the page) if it cannot."""
        page = self.page
        if page.busy:
            return False
        prompt = self.prompt_edit.toPlainText().strip() or page.prompt_edit.toPlainText().strip()
        config = page.ready_to_sample(
            prompt, self.prompt_edit, "Type a prompt first, then press New pair.", "New pair"
        )
        if config is None:
            return False
        self.prompt_edit.setPlainText(prompt)
        system = self.system_edit.text().strip() or None
        seed = int(page.reward_settings.seed_spin.value())
        job, model = page.session_job(config, lambda s: s.sample(prompt, system=system, n=2, seed=seed))

        def done(result) -> None:
            s, answers, error = result
            page._adopt(s, model)
            if error is not None:
                page._task_failed("generating", error)
                self.blind.clear()
                return
            page.reward_settings.next_seed()
            self._context = {"messages": chat_messages(system, prompt), "seed": seed, "step": s.step}
            sources = (f"answer 1 (seed {seed})", "answer 2")
            self.blind.set_pair(blind_pair(answers[0].text, answers[1].text, sources))
            self.status.setText(f"Two answers of the adapter after {s.step} step(s), seed {seed}.")

        self.blind.clear("Generating two answers…")
        page._run("loading" if model else "generating", job, done)
        return True

    def _chosen(self, choice: str) -> None:
        pair, ctx = self.blind.pair, self._context
        if pair is None or ctx is None:
            return
        extra = {"source": "rewards A/B", "seed": ctx["seed"], "adapter_step": ctx["step"]}
        try:
            text = self.preferences.record(pair, choice, ctx["messages"], extra)
        except (EngineError, OSError) as exc:
            self.page.show_error(
                f"The choice was not saved: {exc}. Choose another file with Preferences file…."
            )
            return
        self.blind.status.setText(text + " New pair (Ctrl+Enter) for the next one.")
        self.files.refresh()
        self.sig_chosen.emit(choice)


__all__ = ["ABTabWidget"]
