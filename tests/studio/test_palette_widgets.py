"""Widgets whose colours come from the application palette follow a change of theme."""

from __future__ import annotations

from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QWidget

from studio.widgets.buttons import PrimaryButton
from studio.widgets.faint_label import FaintLabel
from studio.widgets.theme import apply_theme


def test_primary_buttons_and_faint_labels_follow_a_change_of_theme(qtbot):
    app = QApplication.instance()
    before = QPalette(app.palette())
    try:
        apply_theme(app, "light")
        page = QWidget()  # a page that is shown, and one that is not (another tab)
        hidden = QWidget()
        label, button = FaintLabel("a note", page), PrimaryButton("Start", hidden)
        for w in (page, hidden):
            qtbot.addWidget(w)
        page.show()
        qtbot.waitExposed(page)
        light = app.palette()
        assert label.palette().color(QPalette.WindowText) == light.color(QPalette.PlaceholderText)
        assert button.palette().color(QPalette.Button) == light.color(QPalette.Highlight)
        apply_theme(app, "dark")
        qtbot.wait(1)
        dark = app.palette()
        assert dark.color(QPalette.PlaceholderText) != light.color(QPalette.PlaceholderText)
        assert label.palette().color(QPalette.WindowText) == dark.color(QPalette.PlaceholderText)
        assert button.palette().color(QPalette.Button) == dark.color(QPalette.Highlight)
        assert button.palette().color(QPalette.ButtonText) == dark.color(QPalette.HighlightedText)
    finally:
        app.setPalette(before)
