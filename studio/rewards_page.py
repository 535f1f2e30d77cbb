"""The Rewards page: rate sampled answers and train on the ratings.

Until the reward session lands (issue: rewards and export), the page says what it will do and
how to train on rated samples today: a dataset with "reward" fields and the reward mode on the
Train page.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from .project import ModelInfo, Project


class RewardsPage(QWidget):
    def __init__(self, project: Project, parent: QWidget | None = None):
        super().__init__(parent)
        self.project = project
        text = QLabel(
            "<h3>Rewards</h3>"
            "<p>Generate several answers to a prompt, rate them with the keyboard, and apply a training step "
            "on the ratings — this page is being built.</p>"
            '<p>Today you can already train on ratings: give samples a <code>"reward"</code> in the dataset '
            "(Dataset page) and choose a reward mode on the Train page — <i>weighted</i> (reward-weighted "
            "fine-tuning, as llama.cpp's QLoRA work) or <i>group</i> (group-relative: answers to the same "
            "prompt are compared, bad ones are pushed down).</p>"
        )
        text.setWordWrap(True)
        text.setTextFormat(Qt.RichText)
        text.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        layout = QVBoxLayout(self)
        layout.addWidget(text)
        layout.addStretch(1)

    def set_model_info(self, info: ModelInfo | None) -> None:
        pass
