"""Buttons: `action_button`, a push button with its action, tooltip and shortcut in one call,
`shortcut_text`, a shortcut as tooltips and hints write it, and `PrimaryButton`, the one main action
of a page (Start on the Train page).

A PrimaryButton is drawn in the palette's highlight colour with bold text and is the default button,
and it follows the palette when the theme changes. It does nothing else than a QPushButton.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QKeySequence, QPalette
from PySide6.QtWidgets import QApplication, QPushButton, QWidget

from .theme import FollowsPalette


def action_button(
    text: str,
    slot: Callable[[], object],
    tip: str,
    shortcut: str | None = None,
    *,
    button: QPushButton | None = None,
) -> QPushButton:
    """A push button (`button`, or a new QPushButton(text)) that calls `slot` when clicked, with its
    tooltip and, when given, its keyboard shortcut (a QKeySequence string such as "Ctrl+E")."""
    b = button if button is not None else QPushButton(text)
    if shortcut:
        b.setShortcut(QKeySequence(shortcut))
    b.setToolTip(tip)
    b.clicked.connect(slot)
    return b


def shortcut_text(seq: str) -> str:
    """A shortcut ("Ctrl+Return") as this platform writes it, for tooltips and hints."""
    return QKeySequence(seq).toString(QKeySequence.NativeText)


class PrimaryButton(FollowsPalette, QPushButton):
    """A QPushButton drawn as the page's main action (highlight colour, bold, default)."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(text, parent)
        self.setDefault(True)
        self.setAutoDefault(True)
        font = self.font()
        font.setBold(True)
        self.setFont(font)
        self.setObjectName("primaryButton")
        self._apply_palette()

    def _apply_palette(self) -> None:
        app = QApplication.palette()
        pal = QPalette(app)
        for group in (QPalette.Active, QPalette.Inactive):
            pal.setColor(group, QPalette.Button, app.color(QPalette.Highlight))
            pal.setColor(group, QPalette.ButtonText, app.color(QPalette.HighlightedText))
        if pal != self.palette():
            self.setPalette(pal)


__all__ = ["PrimaryButton", "action_button", "shortcut_text"]
