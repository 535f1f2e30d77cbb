"""A one-line-per-line label that elides each line in the middle to fit its width (long paths).

The full text is the label's tooltip and `full_text()`; `text()` is what is shown. It is not an
editor and does not wrap.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """Shows each line of its text elided in the middle ("/home/…/runs/x.gguf") to fit its width."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self._full = ""
        self.setTextFormat(Qt.PlainText)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt override
        self._full = text
        self.setToolTip(text)
        self._elide()

    def full_text(self) -> str:
        return self._full

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._elide()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(20, super().minimumSizeHint().height())

    def _elide(self) -> None:
        fm = self.fontMetrics()
        width = max(20, self.contentsRect().width())
        lines = [fm.elidedText(line, Qt.ElideMiddle, width) for line in self._full.split("\n")]
        shown = "\n".join(lines)
        if shown != super().text():
            super().setText(shown)


__all__ = ["ElidedLabel"]
