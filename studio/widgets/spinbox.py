"""Spin boxes the settings forms share, and the tooltip that states a setting's default."""

from __future__ import annotations

import re

from PySide6.QtGui import QValidator
from PySide6.QtWidgets import QAbstractSpinBox, QDoubleSpinBox, QWidget


def set_tip(widget: QWidget, meaning: str, default=None) -> QWidget:
    """Give `widget` the tooltip `meaning`, followed by its default when one is given."""
    widget.setToolTip(meaning if default is None else f"{meaning}\nDefault: {default}.")
    return widget


def spin_box(
    cls: type[QAbstractSpinBox], lo: float, hi: float, value: float, *, step=None, special="", decimals=None
) -> QAbstractSpinBox:
    """A `cls` (QSpinBox, QDoubleSpinBox, SciSpinBox) over [lo, hi] showing `value`; `special`
    is the text shown at the minimum (Qt's special value text), e.g. "off"."""
    box = cls()
    if decimals is not None:
        box.setDecimals(decimals)
    box.setRange(lo, hi)
    if step is not None:
        box.setSingleStep(step)
    if special:
        box.setSpecialValueText(special)
    box.setValue(value)
    return box


_NUMBER = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d*)?\s*$")


class SciSpinBox(QDoubleSpinBox):
    """A spin box for small positive numbers shown as 2e-04 / 0.0002 (%g); steps multiply by 2."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setDecimals(12)

    def textFromValue(self, value: float) -> str:  # noqa: N802 - Qt override
        return f"{value:g}"

    def valueFromText(self, text: str) -> float:  # noqa: N802 - Qt override
        try:
            return float(text)
        except ValueError:
            return self.value()

    def validate(self, text: str, pos: int):
        if _NUMBER.match(text):
            return QValidator.Acceptable, text, pos
        if re.match(r"^\s*[+-]?[\d.]*([eE][+-]?)?\d*\s*$", text):
            return QValidator.Intermediate, text, pos
        return QValidator.Invalid, text, pos

    def stepBy(self, steps: int) -> None:  # noqa: N802 - Qt override
        v = self.value() or self.minimum() or 1e-6
        self.setValue(v * (2.0**steps))
