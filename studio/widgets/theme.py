"""Light or dark: what the pages ask of the palette."""

from __future__ import annotations

from PySide6.QtGui import QPalette


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.Base).lightness() < 128
