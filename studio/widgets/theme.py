"""Light or dark: the app's palettes, and what the pages ask of the palette.

`apply_theme(app, "light" | "dark" | "system")` sets the Fusion style with a light or a dark palette
(every colour role set, placeholder and disabled text included, so hints and legends stay readable
on both), or leaves the platform's own for "system". `is_dark(palette)` tells pages which one is
in use, so the colours they draw themselves (token views, heatmaps, banners) follow.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

THEMES = ("system", "light", "dark")

_DARK = {
    QPalette.Window: "#2b2d30",
    QPalette.WindowText: "#e6e6e6",
    QPalette.Base: "#1e1f22",
    QPalette.AlternateBase: "#26282b",
    QPalette.ToolTipBase: "#3c3f41",
    QPalette.ToolTipText: "#f0f0f0",
    QPalette.PlaceholderText: "#a0a4a8",
    QPalette.Text: "#e6e6e6",
    QPalette.Button: "#3a3d41",
    QPalette.ButtonText: "#e6e6e6",
    QPalette.BrightText: "#ff6b6b",
    QPalette.Light: "#4a4d51",
    QPalette.Midlight: "#3f4246",
    QPalette.Mid: "#2f3134",
    QPalette.Dark: "#1b1c1e",
    QPalette.Shadow: "#000000",
    QPalette.Highlight: "#3d7dd8",
    QPalette.HighlightedText: "#ffffff",
    QPalette.Link: "#6aa9ff",
    QPalette.LinkVisited: "#b48cff",
}
_DARK_DISABLED = {
    QPalette.WindowText: "#8a8d91",
    QPalette.Text: "#8a8d91",
    QPalette.ButtonText: "#8a8d91",
    QPalette.PlaceholderText: "#7a7d81",
}
_LIGHT_OVERRIDES = {QPalette.PlaceholderText: "#6b6f75"}  # Fusion's default grey is too faint on white


def dark_palette() -> QPalette:
    pal = QPalette()
    for role, colour in _DARK.items():
        pal.setColor(QPalette.All, role, QColor(colour))
    for role, colour in _DARK_DISABLED.items():
        pal.setColor(QPalette.Disabled, role, QColor(colour))
    return pal


def light_palette() -> QPalette:
    pal = QStyleFactory.create("Fusion").standardPalette()
    for role, colour in _LIGHT_OVERRIDES.items():
        pal.setColor(QPalette.All, role, QColor(colour))
    return pal


def apply_theme(app: QApplication, theme: str) -> None:
    """Light or dark Fusion palettes, or the platform's own look ("system")."""
    if theme not in THEMES:
        raise ValueError(f"theme must be one of {', '.join(THEMES)}, got {theme!r}")
    if theme == "system":
        return
    app.setStyle("Fusion")
    app.setPalette(dark_palette() if theme == "dark" else light_palette())


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.Base).lightness() < 128


class FollowsPalette:
    """Mixin for a widget whose colours come from the application palette: `_apply_palette()` runs
    again when the theme changes the palette (the widget calls it once when it is made); it must set
    the widget's palette only when a colour differs (setting it sends PaletteChange)."""

    def event(self, event) -> bool:
        handled = super().event(event)
        # a window gets ApplicationPaletteChange (changeEvent never sees it), a child the PaletteChange
        # of its parent's new palette; _apply_palette sets nothing when its colours are in place already
        if event.type() in (QEvent.ApplicationPaletteChange, QEvent.PaletteChange):
            self._apply_palette()
        return handled

    def _apply_palette(self) -> None:
        raise NotImplementedError
