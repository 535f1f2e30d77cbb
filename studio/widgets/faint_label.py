"""`FaintLabel`: secondary text (status lines, notes, paths) in the palette's placeholder colour.

It follows the palette when the theme changes. wrap: wrap long text; squeeze: never widen its layout
for long text (the text is cut at the label's width instead).
"""

from __future__ import annotations

from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QLabel, QSizePolicy, QWidget

from .theme import FollowsPalette


class FaintLabel(FollowsPalette, QLabel):
    """A QLabel drawn in the palette's placeholder colour; see the module docstring."""

    def __init__(
        self, text: str = "", parent: QWidget | None = None, *, wrap: bool = False, squeeze: bool = False
    ):
        super().__init__(text, parent)
        self.setObjectName("faint")
        self.setWordWrap(wrap)
        if squeeze:
            self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self._apply_palette()

    def _apply_palette(self) -> None:
        faint = QApplication.palette().color(QPalette.PlaceholderText)
        pal = self.palette()
        if all(pal.color(g, QPalette.WindowText) == faint for g in (QPalette.Active, QPalette.Inactive)):
            return
        pal = QPalette(pal)
        for group in (QPalette.Active, QPalette.Inactive):
            pal.setColor(group, QPalette.WindowText, faint)
        self.setPalette(pal)


__all__ = ["FaintLabel"]
