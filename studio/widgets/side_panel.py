"""A column that scrolls up and down but is never cut at its right edge (settings, a dialog's body).

`SidePanelWidget` is a vertical-only scroll area whose minimum width is its content's minimum width
(plus the scroll bar): a splitter or a small window can narrow it that far and no further, so no
spin box, button or label of the column is ever clipped; a short window scrolls it instead. The
Chat and Rewards pages put their settings in one, the export dialog its body.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QWidget


class SidePanelWidget(QScrollArea):
    """Scrolls vertically; as wide as its content needs at least (see the module docstring)."""

    def __init__(self, content: QWidget, parent: QWidget | None = None, minimum: int = 0):
        super().__init__(parent)
        self.minimum = minimum
        self.setWidget(content)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setFrameShape(QFrame.NoFrame)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        content = self.widget()
        need = content.minimumSizeHint().width() if content is not None else 0
        bar = self.verticalScrollBar().sizeHint().width()
        return QSize(max(self.minimum, need + bar + 2 * self.frameWidth()), 60)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        hint = super().sizeHint()
        return QSize(max(hint.width(), self.minimumSizeHint().width()), hint.height())


__all__ = ["SidePanelWidget"]
