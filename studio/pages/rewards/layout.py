"""The Rewards page's blocks: the settings column, the Rate answers tab and the Apply column.

`RewardsSideWidget` is the column on the left: the sampling and step settings
(`RewardSettingsWidget`) and the "Adapter and files" box (rewards/files.py). `RateTabWidget` is the
Rate answers tab: the prompt, its system line, From dataset…, Generate / Stop, the status line, the
answer cards, the keys and "Score with checks". `ApplyColumnWidget` is the column on the right: the
diagnostics, Apply step and the history of the rounds.

Layout only: each block makes and names its widgets, and takes the page's actions as callables;
the page (studio.pages.rewards.page) decides with its controller what they show.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QPushButton, QSplitter, QVBoxLayout, QWidget

from ...widgets.buttons import action_button, shortcut_text
from ...widgets.faint_label import FaintLabel
from ...widgets.page_layout import scroll_area
from ...widgets.side_panel import SidePanelWidget
from .ab import prompt_inputs
from .cards import CARD_KEYS
from .files import AdapterFilesWidget
from .grid import AnswerGridWidget
from .panels import DiagnosticsWidget, RewardHistoryWidget
from .settings import RewardSettingsWidget


class RewardsSideWidget(SidePanelWidget):
    """The settings column; see the module docstring. page: the RewardsPage."""

    def __init__(self, page):
        self.reward_settings = RewardSettingsWidget(page.project)
        self.files = AdapterFilesWidget(page)
        self.settings_box = QWidget()
        il = QVBoxLayout(self.settings_box)
        il.setContentsMargins(0, 0, 4, 0)
        il.setSpacing(4)
        il.addWidget(self.reward_settings)
        il.addWidget(self.files)
        il.addStretch(1)
        super().__init__(self.settings_box, minimum=190)  # never narrower than its controls: none is cut


class RateTabWidget(QWidget):
    """The Rate answers tab; see the module docstring. The callables are the page's actions."""

    def __init__(self, choose_dataset_prompt, generate, stop, parent: QWidget | None = None):
        super().__init__(parent)
        self.prompt_edit, self.system_edit = prompt_inputs(
            "Ask the model something, e.g. What color is the sky?"
        )
        self.prompt_edit.setToolTip(
            f"The prompt of the round (user message). {shortcut_text('Ctrl+Return')} generates the answers."
        )
        self.system_edit.setToolTip("An optional system message before the prompt. Default: none.")
        self.dataset_button = action_button(
            "From dataset…",
            choose_dataset_prompt,
            "Take a prompt (and its system message) from the project's dataset",
        )
        self.generate_button = action_button(
            "Generate",
            generate,
            f"Sample new answers with the adapter as it is now ({shortcut_text('Ctrl+Return')}).",
            "Ctrl+Return",
        )
        self.stop_button = action_button(
            "Stop", stop, f"End the answers where they are ({shortcut_text('Ctrl+.')}).", "Ctrl+."
        )
        self.status_label = FaintLabel(squeeze=True)
        top = QHBoxLayout()
        top.addWidget(QLabel("<b>Prompt</b>"))
        top.addStretch(1)
        top.addWidget(self.dataset_button)
        buttons = QHBoxLayout()
        buttons.addWidget(self.system_edit, 1)
        buttons.addWidget(self.generate_button)
        buttons.addWidget(self.stop_button)
        self.grid = AnswerGridWidget(columns=2)
        self.keys_label = FaintLabel(CARD_KEYS, wrap=True)
        self.checks_box = QCheckBox("Score with checks")
        self.checks_box.setToolTip(
            "Score each round's answers with the checks of the Unattended tab too: an answer's reward is "
            "then the checks' sum plus your rating times the rating's weight set there (your rating is one "
            "more source). Default: off."
        )
        tl = QVBoxLayout(self)
        tl.setContentsMargins(4, 4, 4, 4)
        tl.setSpacing(4)
        tl.addLayout(top)
        tl.addWidget(self.prompt_edit)
        tl.addLayout(buttons)
        tl.addWidget(self.status_label)
        tl.addWidget(self.grid, 1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.keys_label, 1)
        bottom.addWidget(self.checks_box)
        tl.addLayout(bottom)


class ApplyColumnWidget(QSplitter):
    """The Apply column; see the module docstring. apply: the page's Apply."""

    def __init__(self, apply, parent: QWidget | None = None):
        super().__init__(Qt.Vertical, parent)
        self.diagnostics = DiagnosticsWidget()
        self.apply_button = QPushButton("Apply step")
        self.apply_button.setShortcut(QKeySequence("Ctrl+Shift+Return"))
        self.apply_button.setToolTip(
            "Take one training step on this round's ratings and better answers "
            f"({shortcut_text('Ctrl+Shift+Return')})."
        )
        self.apply_button.setMinimumHeight(32)
        font = self.apply_button.font()
        font.setBold(True)
        self.apply_button.setFont(font)
        self.apply_button.clicked.connect(apply)
        self.history = RewardHistoryWidget()
        # the diagnostics scroll when a long message meets a short window; a splitter shares the height
        scroll = scroll_area(self.diagnostics)
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.setSpacing(4)
        tl.addWidget(scroll, 1)
        tl.addWidget(self.apply_button)
        self.addWidget(top)
        self.addWidget(self.history)
        self.setStretchFactor(0, 0)
        self.setStretchFactor(1, 1)
        self.setSizes([340, 440])
        self.setChildrenCollapsible(False)
        self.setMinimumWidth(260)


__all__ = ["ApplyColumnWidget", "RateTabWidget", "RewardsSideWidget"]
