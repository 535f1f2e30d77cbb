"""The Chat page's sampling settings: temperature, top-k, top-p, min-p, max new tokens and seed.

`SamplingSettingsWidget.sampling(seed=...)` gives them as the engine's `SamplingConfig` (an
EngineError names a value out of range). The defaults are the engine's (llama.cpp's); each field
has a tooltip saying what it does and its default. Nothing here is saved in the project.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QSpinBox,
    QToolButton,
    QWidget,
)

from engine import SamplingConfig

from ...widgets.spinbox import set_tip, spin_box

DEFAULTS = SamplingConfig()
CHAT_MAX_TOKENS = 256  # an answer's default budget in a chat (the engine's default is 128)
RANDOM_SEED = -1  # the seed box's "random" value: a new seed for each answer


class SamplingSettingsWidget(QGroupBox):
    """How the next token is chosen; see the module docstring."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Sampling", parent)
        d = DEFAULTS
        self.temp_spin = set_tip(spin_box(QDoubleSpinBox, 0.0, 2.0, d.temperature, step=0.05),
            "Randomness: higher gives more varied answers, 0 always the most likely token (the same "
            "answer every time).", d.temperature)  # fmt: skip
        self.top_k_spin = set_tip(spin_box(QSpinBox, 0, 100000, d.top_k, special="off"),
            "Sample only among the k most likely next tokens; 0 = off.", d.top_k)  # fmt: skip
        self.top_p_spin = set_tip(spin_box(QDoubleSpinBox, 0.01, 1.0, d.top_p, step=0.05),
            "Nucleus sampling: keep the most likely tokens that together have this probability; 1 = off.",
            d.top_p)  # fmt: skip
        self.min_p_spin = set_tip(spin_box(QDoubleSpinBox, 0.0, 1.0, d.min_p, step=0.01),
            "Drop tokens less likely than min-p × the most likely one; 0 = off.", d.min_p)  # fmt: skip
        self.max_tokens_spin = set_tip(spin_box(QSpinBox, 1, 8192, CHAT_MAX_TOKENS),
            "The most tokens one answer may have; an answer that reaches it is cut off.",
            CHAT_MAX_TOKENS)  # fmt: skip
        self.seed_spin = set_tip(spin_box(QSpinBox, RANDOM_SEED, 2**31 - 1, RANDOM_SEED, special="random"),
            "Random seed: the same conversation, settings and seed give the same answer; random = a new "
            "seed each time. Side by side uses one seed for both answers.", "random")  # fmt: skip
        dice = QToolButton()
        dice.setText("⚄")
        dice.setToolTip("Pick a seed at random (then answers can be repeated)")
        dice.clicked.connect(self.roll_seed)
        seed_row = QHBoxLayout()
        seed_row.setContentsMargins(0, 0, 0, 0)
        seed_row.addWidget(self.seed_spin, 1)
        seed_row.addWidget(dice)
        form = QFormLayout(self)
        form.setContentsMargins(6, 4, 6, 4)
        form.setVerticalSpacing(3)
        for label, w in (("Temperature:", self.temp_spin), ("Top-k:", self.top_k_spin),
                         ("Top-p:", self.top_p_spin), ("Min-p:", self.min_p_spin),
                         ("Max new tokens:", self.max_tokens_spin)):  # fmt: skip
            w.setMinimumWidth(64)
            form.addRow(label, w)
            form.labelForField(w).setToolTip(w.toolTip())
        form.addRow("Seed:", seed_row)
        form.labelForField(seed_row).setToolTip(self.seed_spin.toolTip())

    def roll_seed(self) -> None:
        self.seed_spin.setValue(int(np.random.default_rng().integers(0, 2**31 - 1)))

    def seed(self) -> int | None:
        """The chosen seed, or None for random."""
        v = int(self.seed_spin.value())
        return None if v == RANDOM_SEED else v

    def sampling(self, seed: int | None = None) -> SamplingConfig:
        """The settings as a SamplingConfig; `seed` overrides the box (side by side draws one)."""
        return SamplingConfig(
            temperature=float(self.temp_spin.value()),
            top_k=int(self.top_k_spin.value()),
            top_p=float(self.top_p_spin.value()),
            min_p=float(self.min_p_spin.value()),
            seed=seed if seed is not None else self.seed(),
            max_new_tokens=int(self.max_tokens_spin.value()),
        )


__all__ = ["CHAT_MAX_TOKENS", "RANDOM_SEED", "SamplingSettingsWidget"]
