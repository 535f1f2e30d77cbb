"""`wrapping_label`: a QLabel that wraps its text at its column's width and never widens the column
(a long path, answer or message breaks into lines instead), optionally selectable, named for the
style sheet, and held to one text format.

It is a plain QLabel made in one call; the page keeps adding what is its own (alignment, links).
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSizePolicy


def wrapping_label(
    text: str = "",
    *,
    name: str = "",
    text_format: Qt.TextFormat | None = None,
    interaction: Qt.TextInteractionFlag | None = None,
) -> QLabel:
    """A word-wrapped QLabel that gives way to its layout's width. name: its object name (the style
    sheet's selector); text_format: Qt.PlainText or Qt.RichText (default: Qt guesses); interaction:
    its text interaction flags, e.g. Qt.TextSelectableByMouse (default: Qt's, not selectable)."""
    label = QLabel(text)
    if name:
        label.setObjectName(name)
    label.setWordWrap(True)
    if text_format is not None:
        label.setTextFormat(text_format)
    if interaction is not None:
        label.setTextInteractionFlags(interaction)
    label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
    return label


__all__ = ["wrapping_label"]
