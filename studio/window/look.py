"""The window's colours: the desktop's own look (kept on the application the first time a theme is
chosen, to go back to) or one of studio.widgets.theme's."""

from __future__ import annotations

from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QWidget

from ..widgets.theme import apply_theme


def apply_look(window: QWidget, old: str, theme: str) -> None:
    """Go from theme `old` to `theme` ("system", "light", "dark") on the whole application, and
    polish `window`'s styled widgets again."""
    app = QApplication.instance()
    look = getattr(app, "platform_look", None)
    if look is None:  # the desktop's own style and palette, to go back to
        look = app.platform_look = (app.style().name(), QPalette(app.palette()))
    if theme == "system":
        if old != "system":
            app.setStyle(look[0])
            app.setPalette(look[1])
    else:
        apply_theme(app, theme)
    # a widget with a style sheet keeps the palette it was polished with: polish it again, so that
    # it takes the new colours and hears the change (banners and the strip restyle themselves)
    for widget in window.findChildren(QWidget):
        if widget.styleSheet():
            widget.setStyleSheet(widget.styleSheet())
