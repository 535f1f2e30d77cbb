"""The Rewards page's settings: how answers are sampled and how ratings become a training step.

`RewardSettingsWidget` edits the fields of the engine's `RewardConfig` that a person tunes between
rounds (answers per prompt, temperature, top-k, top-p, min-p, token budget; mode, KL coefficient,
learning rate) plus the sampling seed, each with a tooltip saying what it does and its default.
`reward_config()` gives them as a RewardConfig. The mode and KL coefficient start from the project's
reward settings when it has some (the Train page's reward mode); nothing here is written back to
the project.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import RewardConfig

from ...project import Project
from ...widgets.spinbox import SciSpinBox, set_tip, spin_box

DEFAULTS = {f.name: getattr(RewardConfig(), f.name) for f in fields(RewardConfig)}


def _form_box(title: str, rows) -> QGroupBox:
    """A compact form titled `title`; each row is (label, field) or a lone widget, as QFormLayout.addRow."""
    box = QGroupBox(title)
    form = QFormLayout(box)
    form.setContentsMargins(6, 4, 6, 4)
    form.setVerticalSpacing(3)
    for row in rows:
        form.addRow(*row)
    return box


class RewardSettingsWidget(QWidget):
    """Sampling and training-step settings of the Rewards page (see the module docstring)."""

    sig_mode_changed = Signal(str)  # "group" | "weighted"

    def __init__(self, project: Project, parent: QWidget | None = None):
        super().__init__(parent)
        d = DEFAULTS
        self.n_spin = set_tip(spin_box(QSpinBox, 1, 32, d["n_samples"]),
            "How many answers to sample for the prompt. Group mode compares them with each other: rate at "
            "least two differently.", d["n_samples"])  # fmt: skip
        self.temp_spin = set_tip(spin_box(QDoubleSpinBox, 0.0, 2.0, d["temperature"], step=0.05),
            "Sampling temperature: higher gives more varied answers, 0 always the most likely one (all "
            "answers alike: nothing to compare).", d["temperature"])  # fmt: skip
        self.top_k_spin = set_tip(spin_box(QSpinBox, 0, 100000, d["top_k"], special="off"),
            "Sample only among the k most likely next tokens; 0 = off.", d["top_k"])  # fmt: skip
        self.top_p_spin = set_tip(spin_box(QDoubleSpinBox, 0.01, 1.0, d["top_p"], step=0.05),
            "Nucleus sampling: keep the most likely tokens that together have this probability; 1 = off.",
            d["top_p"])  # fmt: skip
        self.min_p_spin = set_tip(spin_box(QDoubleSpinBox, 0.0, 1.0, d["min_p"], step=0.01),
            "Drop tokens less likely than min-p × the most likely one; 0 = off.", d["min_p"])  # fmt: skip
        self.max_tokens_spin = set_tip(spin_box(QSpinBox, 1, 4096, d["max_new_tokens"]),
            "Token budget of each answer; an answer that reaches it is cut off.",
            d["max_new_tokens"])  # fmt: skip
        self.seed_spin = set_tip(spin_box(QSpinBox, 0, 2**31 - 1, 0),
            "Random seed of the sampling: the same prompt, seed and adapter give the same answers.",
            0)  # fmt: skip
        dice = QToolButton()
        dice.setText("⚄")
        dice.setToolTip("Pick a random seed")
        dice.clicked.connect(self.roll_seed)
        self.dice_button = dice
        seed_row = QHBoxLayout()
        seed_row.setContentsMargins(0, 0, 0, 0)
        seed_row.addWidget(self.seed_spin, 1)
        seed_row.addWidget(dice)
        self.next_seed_check = QCheckBox("Next seed after each round")
        self.next_seed_check.setChecked(True)
        set_tip(self.next_seed_check, "Add 1 to the seed after each Generate, so that a new round gives "
                  "new answers; off: the same seed again.", "on")  # fmt: skip

        sampling = _form_box("Sampling", (
            ("Answers:", self.n_spin), ("Temperature:", self.temp_spin), ("Top-k:", self.top_k_spin),
            ("Top-p:", self.top_p_spin), ("Min-p:", self.min_p_spin), ("Max tokens:", self.max_tokens_spin),
            ("Seed:", seed_row), (self.next_seed_check,),
        ))  # fmt: skip

        cfg = project.config
        self.mode_combo = QComboBox()
        self.mode_combo.addItem("group", "group")
        self.mode_combo.addItem("weighted", "weighted")
        self.mode_combo.setItemData(
            0, "Group-relative (GRPO-style): advantages around the mean", Qt.ToolTipRole
        )
        self.mode_combo.setItemData(
            1, "Reward-weighted SFT: ratings become loss weights in [0, 1]", Qt.ToolTipRole
        )
        mode = cfg.reward_mode if cfg.reward_mode in ("group", "weighted") else d["mode"]
        self.mode_combo.setCurrentIndex(self.mode_combo.findData(mode))
        set_tip(self.mode_combo, "How ratings become a step. group: each answer gets its advantage "
                  "(rating − mean) / spread, so worse-than-average answers are pushed down. weighted: "
                  "ratings scaled to loss weights in [0, 1]; the worst answer is ignored, none is pushed "
                  "down.", d["mode"])  # fmt: skip
        self.mode_combo.currentIndexChanged.connect(self._mode_changed)
        self.kl_spin = set_tip(
            spin_box(QDoubleSpinBox, 0.0, 100.0, cfg.kl_coef or d["kl_coef"], step=0.01, decimals=3),
            "Group mode: weight of a penalty for drifting away from the base model (KL divergence per "
            "answer token); 0 = off.", d["kl_coef"])  # fmt: skip
        self.lr_spin = set_tip(spin_box(SciSpinBox, 1e-8, 1.0, d["lr"]),
            "Learning rate of each Apply step (AdamW, constant). Too high and the model forgets what it "
            "knew.", f"{d['lr']:g}")  # fmt: skip
        step = _form_box("Training step", (
            ("Mode:", self.mode_combo), ("KL coefficient:", self.kl_spin), ("Learning rate:", self.lr_spin),
        ))  # fmt: skip
        spins = (self.n_spin, self.temp_spin, self.top_k_spin, self.top_p_spin, self.min_p_spin)
        for w in (*spins, self.max_tokens_spin, self.seed_spin, self.mode_combo, self.kl_spin, self.lr_spin):
            w.setMinimumWidth(64)  # the column stays narrow; the seed's range would make it wide
        for f in (sampling, step):
            lay = f.layout()
            for row in range(lay.rowCount()):
                label, field = lay.itemAt(row, QFormLayout.LabelRole), lay.itemAt(row, QFormLayout.FieldRole)
                if label and field and field.widget() and label.widget():
                    label.widget().setToolTip(field.widget().toolTip())

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(sampling)
        layout.addWidget(step)
        self._mode_changed()

    def mode(self) -> str:
        return self.mode_combo.currentData()

    def _mode_changed(self) -> None:
        self.kl_spin.setEnabled(self.mode() == "group")  # KL is a group-mode penalty
        self.sig_mode_changed.emit(self.mode())

    def roll_seed(self) -> None:
        self.seed_spin.setValue(int(np.random.default_rng().integers(0, 2**31 - 1)))

    def next_seed(self) -> None:
        """After a round: the next seed, when "Next seed after each round" is on."""
        if self.next_seed_check.isChecked():
            self.seed_spin.setValue((self.seed_spin.value() + 1) % (2**31 - 1))

    def reward_config(self) -> RewardConfig:
        """The settings as the engine's RewardConfig (RewardError, an EngineError, if one is not valid)."""
        return RewardConfig(
            mode=self.mode(),
            kl_coef=float(self.kl_spin.value()),
            lr=float(self.lr_spin.value()),
            n_samples=int(self.n_spin.value()),
            temperature=float(self.temp_spin.value()),
            top_k=int(self.top_k_spin.value()),
            top_p=float(self.top_p_spin.value()),
            min_p=float(self.min_p_spin.value()),
            max_new_tokens=int(self.max_tokens_spin.value()),
        )


__all__ = ["DEFAULTS", "RewardSettingsWidget"]
