"""The Chat page's two blocks beside the conversation: the Side by side tab and the adapter column.

`CompareTabWidget` is the Side by side tab: the prompt for both, Compare / Stop, "Blind A/B", the
two answer columns (or the blind choice in their place) and the preferences file row.
`AdapterSideWidget` is the column on the right: the adapter list, the Base / Adapter toggle, the
note under it, Export… / Rate answers, and the sampling settings.

They lay out and name their widgets; the page (studio.pages.chat.page) wires them and decides
with its controller what they show.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QGroupBox,
    QHBoxLayout,
    QPlainTextEdit,
    QSizePolicy,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import RUN

from ...widgets.blind_choice import BlindChoiceWidget, PreferenceRecorder, PreferencesFileRow
from ...widgets.buttons import action_button, shortcut_text
from ...widgets.faint_label import FaintLabel
from ...widgets.page_layout import splitter
from ...widgets.runs import RunChoiceWidget
from ...widgets.side_panel import SidePanelWidget
from .controller import BASE, RUN_LABEL
from .conversation import AnswerColumnWidget
from .settings import SamplingSettingsWidget


def send_keys(tab: QWidget, slot) -> None:
    """Ctrl+Enter anywhere in the tab calls `slot` (the hidden tab's keys are off)."""
    for key in ("Ctrl+Return", "Ctrl+Enter"):
        QShortcut(QKeySequence(key), tab, slot, context=Qt.WidgetWithChildrenShortcut)


class CompareTabWidget(QWidget):
    """The Side by side tab; see the module docstring. compare and stop: the page's actions."""

    def __init__(self, compare, stop, preferences: PreferenceRecorder, parent: QWidget | None = None):
        super().__init__(parent)
        self.compare_prompt = QPlainTextEdit()
        self.compare_prompt.setPlaceholderText(
            f"A prompt for both ({shortcut_text('Ctrl+Return')} compares; empty: your last message in the "
            "chat)"
        )
        self.compare_prompt.setTabChangesFocus(True)
        self.compare_prompt.setMaximumHeight(70)
        self.compare_button = action_button(
            "Compare",
            compare,
            "Answer the prompt with the base model, then with the adapter: the same sampling and seed, so "
            f"the adapter is the only difference ({shortcut_text('Ctrl+Return')})",
        )
        self.compare_stop_button = action_button(
            "Stop", stop, f"End the answers where they are ({shortcut_text('Ctrl+.')})"
        )
        self.compare_status = FaintLabel(wrap=True, squeeze=True)
        row = QHBoxLayout()
        row.addWidget(self.compare_button)
        row.addWidget(self.compare_stop_button)
        row.addWidget(self.compare_status, 1)
        self.blind_check = QCheckBox("Blind A/B")
        self.blind_check.setToolTip(
            "Show the two answers as A and B in a random order, without saying which is the adapter's, and "
            "choose the better one: each choice is saved as a preference pair (for DPO or ORPO on the Train "
            "page). Default: off."
        )
        row.insertWidget(2, self.blind_check)
        self.base_column = AnswerColumnWidget("Base model", "The model file as it is, without an adapter")
        self.adapter_column = AnswerColumnWidget("With the adapter", "The model with the chosen adapter")
        columns = splitter(Qt.Horizontal, (self.base_column, self.adapter_column))
        self.blind = BlindChoiceWidget()
        self.compare_stack = QStackedWidget()
        self.compare_stack.addWidget(columns)
        self.compare_stack.addWidget(self.blind)
        self.blind_check.toggled.connect(lambda on: self.compare_stack.setCurrentIndex(1 if on else 0))
        self.preferences_row = PreferencesFileRow(preferences)
        self.train_choices_button = self.preferences_row.train_button
        tl = QVBoxLayout(self)
        tl.setContentsMargins(4, 4, 4, 4)
        tl.setSpacing(4)
        tl.addWidget(self.compare_prompt)
        tl.addLayout(row)
        tl.addWidget(self.compare_stack, 1)
        tl.addWidget(self.preferences_row)
        send_keys(self, compare)


class AdapterSideWidget(SidePanelWidget):
    """The adapter column; see the module docstring. The callables are the page's actions."""

    def __init__(self, use_adapter, request_export, request_rate, parent: QWidget | None = None):
        box = QGroupBox("Adapter")
        self.adapter_choice = RunChoiceWidget(
            fixed=[
                ("Base model (no adapter)", BASE, "The model file as it is"),
                (
                    RUN_LABEL,
                    RUN,
                    "The adapter of the run on the Train page as trained so far (pause the run to chat with "
                    "it: answers wait while it takes steps)",
                ),
            ],  # fmt: skip
            placeholder="",
        )
        self.base_toggle = QToolButton()
        self.base_toggle.setText("Base")
        self.adapter_toggle = QToolButton()
        self.adapter_toggle.setText("Adapter")
        self.toggle_group = QButtonGroup(box)
        self.toggle_group.setExclusive(True)
        for b, tip in (
            (self.base_toggle, "Answer with the base model, the adapter off"),
            (self.adapter_toggle, "Answer with the chosen adapter"),
        ):
            b.setCheckable(True)
            b.setToolTip(f"{tip} ({shortcut_text('Ctrl+B')} switches)")
            b.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
            self.toggle_group.addButton(b)
        self.base_toggle.clicked.connect(lambda: use_adapter(False))
        self.adapter_toggle.clicked.connect(lambda: use_adapter(True))
        toggle = QHBoxLayout()
        toggle.setSpacing(0)
        toggle.addWidget(self.base_toggle)
        toggle.addWidget(self.adapter_toggle)
        self.adapter_note = FaintLabel(wrap=True, squeeze=True)
        self.export_button = action_button(
            "Export…",
            request_export,
            "Export this adapter for llama.cpp, or merge it into the model (Export page)",
        )
        self.rate_button = action_button(
            "Rate answers",
            request_rate,
            "Go on with rating rounds on the Rewards page: this adapter (or a new one for the base model) "
            "and your last prompt",
        )
        hand = QHBoxLayout()
        hand.addWidget(self.export_button)
        hand.addWidget(self.rate_button)
        bl = QVBoxLayout(box)
        bl.setContentsMargins(6, 4, 6, 6)
        bl.setSpacing(4)
        for row in (self.adapter_choice, toggle, self.adapter_note, hand):
            (bl.addLayout if isinstance(row, QHBoxLayout) else bl.addWidget)(row)
        self.sampling = SamplingSettingsWidget()
        inner = QWidget()
        il = QVBoxLayout(inner)
        il.setContentsMargins(0, 0, 4, 0)
        il.setSpacing(6)
        il.addWidget(box)
        il.addWidget(self.sampling)
        il.addStretch(1)
        super().__init__(inner, parent, minimum=220)  # never narrower than its controls: none is cut


__all__ = ["AdapterSideWidget", "CompareTabWidget", "send_keys"]
