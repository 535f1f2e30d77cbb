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

DEFAULTS = SamplingConfig()
CHAT_MAX_TOKENS = 256  # an answer's default budget in a chat (the engine's default is 128)
RANDOM_SEED = -1  # the seed box's "random" value: a new seed for each answer


def _tip(widget: QWidget, meaning: str, default) -> None:
    widget.setToolTip(f"{meaning}\nDefault: {default}.")


class SamplingSettingsWidget(QGroupBox):
    """How the next token is chosen; see the module docstring."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Sampling", parent)
        d = DEFAULTS
        self.temp_spin = QDoubleSpinBox()
        self.temp_spin.setRange(0.0, 2.0)
        self.temp_spin.setSingleStep(0.05)
        self.temp_spin.setValue(d.temperature)
        _tip(self.temp_spin, "Randomness: higher gives more varied answers, 0 always the most likely "
             "token (the same answer every time).", d.temperature)  # fmt: skip
        self.top_k_spin = QSpinBox()
        self.top_k_spin.setRange(0, 100000)
        self.top_k_spin.setSpecialValueText("off")
        self.top_k_spin.setValue(d.top_k)
        _tip(self.top_k_spin, "Sample only among the k most likely next tokens; 0 = off.", d.top_k)
        self.top_p_spin = QDoubleSpinBox()
        self.top_p_spin.setRange(0.01, 1.0)
        self.top_p_spin.setSingleStep(0.05)
        self.top_p_spin.setValue(d.top_p)
        _tip(self.top_p_spin, "Nucleus sampling: keep the most likely tokens that together have this "
             "probability; 1 = off.", d.top_p)  # fmt: skip
        self.min_p_spin = QDoubleSpinBox()
        self.min_p_spin.setRange(0.0, 1.0)
        self.min_p_spin.setSingleStep(0.01)
        self.min_p_spin.setValue(d.min_p)
        _tip(self.min_p_spin, "Drop tokens less likely than min-p × the most likely one; 0 = off.", d.min_p)
        self.max_tokens_spin = QSpinBox()
        self.max_tokens_spin.setRange(1, 8192)
        self.max_tokens_spin.setValue(CHAT_MAX_TOKENS)
        _tip(self.max_tokens_spin, "The most tokens one answer may have; an answer that reaches it is "
             "cut off.", CHAT_MAX_TOKENS)  # fmt: skip
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(RANDOM_SEED, 2**31 - 1)
        self.seed_spin.setSpecialValueText("random")
        self.seed_spin.setValue(RANDOM_SEED)
        _tip(self.seed_spin, "Random seed: the same conversation, settings and seed give the same "
             "answer; random = a new seed each time. Side by side uses one seed for both answers.",
             "random")  # fmt: skip
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
