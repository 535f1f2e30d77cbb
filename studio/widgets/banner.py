"""A message shown inside a page: error, warning or information, with a button to dismiss it."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QLabel, QStyle, QToolButton, QWidget

from .theme import is_dark


class MessageBar(QFrame):
    """A message in the page (error, warning or information) with a button to dismiss it."""

    STYLES = {  # level: (light background, light border, light text, dark bg, dark border, dark text)
        "error": ("#fdecea", "#e57373", "#7f1d1d", "#4a1f1f", "#b34a4a", "#ffd9d9"),
        "warning": ("#fff4e0", "#e0a040", "#5c3b00", "#463618", "#b38a3a", "#ffe8bd"),
        "info": ("#e8f1fb", "#7aa7d9", "#183a5c", "#1d3147", "#4f7fb0", "#d9eaff"),
    }

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("messageBar")
        self.level = "info"
        self._dark = False
        self.icon = QLabel()
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setAutoRaise(True)
        self.close_button.setToolTip("Dismiss this message")
        self.close_button.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 4, 4)
        layout.addWidget(self.icon, 0, Qt.AlignTop)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.close_button, 0, Qt.AlignTop)
        self.hide()

    def show_message(self, level: str, text: str) -> None:
        self.level = level
        self.label.setText(text)
        icon = {
            "error": QStyle.SP_MessageBoxCritical,
            "warning": QStyle.SP_MessageBoxWarning,
            "info": QStyle.SP_MessageBoxInformation,
        }[level]
        self.icon.setPixmap(self.style().standardIcon(icon).pixmap(20, 20))
        self._restyle()
        self.show()

    def text(self) -> str:
        return self.label.text()

    def _restyle(self) -> None:
        light_bg, light_border, light_fg, dark_bg, dark_border, dark_fg = self.STYLES[self.level]
        dark = is_dark(QApplication.palette())
        self._dark = dark
        bg, border, fg = (dark_bg, dark_border, dark_fg) if dark else (light_bg, light_border, light_fg)
        self.setStyleSheet(
            f"#messageBar {{ background: {bg}; border: 1px solid {border}; border-radius: 4px; }}"
            f"#messageBar QLabel {{ color: {fg}; }}"
        )

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        # the style sheet itself changes the palette: restyle only when light/dark flipped
        if event.type() == QEvent.PaletteChange and self._dark != is_dark(QApplication.palette()):
            self._restyle()
        super().changeEvent(event)
