"""The Chat page's conversation view: one bubble per message, the answer growing as tokens arrive.

`MessageWidget` shows one message: who wrote it ("You", "Base model", "Adapter · name"), its text
(selectable, wrapped), and for an answer its length, why it stopped, and a Copy button.
`ConversationWidget` stacks them in a scroll area that follows the newest text while the person
has not scrolled up. `AnswerColumnWidget` is one column of the side-by-side view.

These widgets draw what they are given; the page keeps the conversation and runs the engine.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ...widgets.elided_label import ElidedLabel
from ...widgets.page_layout import scroll_area
from ...widgets.theme import is_dark
from ...widgets.wrapping_label import wrapping_label

STOP_REASONS = {
    "eos": "ended its turn",
    "length": "cut off: reached the token limit",
    "context": "cut off: the context is full",
    "stopped": "stopped",
}


def _mix(a: QColor, b: QColor, t: float) -> QColor:
    return QColor(
        round(a.red() * (1 - t) + b.red() * t),
        round(a.green() * (1 - t) + b.green() * t),
        round(a.blue() * (1 - t) + b.blue() * t),
    )


class MessageWidget(QFrame):
    """One message: author, text, and for an answer its facts and a Copy button."""

    sig_copied = Signal(str)

    def __init__(self, role: str, text: str, who: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.role = role
        self.text = ""
        self._restyling = False
        self.setObjectName("message")
        self.who = ElidedLabel(who)  # one line, elided: a long adapter name never widens the bubble
        self.who.setObjectName("who")
        font = self.who.font()
        font.setBold(True)
        self.who.setFont(font)
        self.meta = QLabel()
        self.meta.setObjectName("meta")
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.setAutoRaise(True)
        self.copy_button.setToolTip("Copy this answer to the clipboard (the last answer: Ctrl+Shift+C)")
        self.copy_button.clicked.connect(self.copy)
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(self.who, 1)
        head.addWidget(self.meta)
        head.addWidget(self.copy_button)
        self.body = wrapping_label(
            name="body",
            text_format=Qt.PlainText,
            interaction=Qt.TextSelectableByMouse | Qt.TextSelectableByKeyboard,
        )
        self.body.setAlignment(Qt.AlignLeft | Qt.AlignTop)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 8)
        layout.setSpacing(2)
        layout.addLayout(head)
        layout.addWidget(self.body)
        self.copy_button.setHidden(role != "assistant")  # in its layout now: never a window of its own
        self.set_text(text)
        self._restyle()

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() == QEvent.PaletteChange and not self._restyling:
            self._restyle()  # the theme changed: the bubble takes its colours

    def _restyle(self) -> None:
        self._restyling = True
        try:
            self._apply_style()
        finally:
            self._restyling = False

    def _apply_style(self) -> None:
        pal = self.palette()
        base, window = pal.color(QPalette.Base), pal.color(QPalette.Window)
        accent = pal.color(QPalette.Highlight)
        bg = _mix(base, accent, 0.14 if is_dark(pal) else 0.08) if self.role == "user" else base
        border = pal.color(QPalette.Mid) if self.role != "user" else _mix(window, accent, 0.5)
        faint = pal.color(QPalette.PlaceholderText).name()
        self.setStyleSheet(
            f"QFrame#message {{ background: {bg.name()}; border: 1px solid {border.name()}; "
            "border-radius: 8px; }"
            f"QLabel#body {{ color: {pal.color(QPalette.Text).name()}; font-size: 14px; }}"
            f"QLabel#who {{ color: {pal.color(QPalette.Text).name()}; }}"
            f"QLabel#meta {{ color: {faint}; }}"
            # the Copy button inherits the bubble's sheet: its text takes the palette's, on any theme
            f"QToolButton {{ color: {pal.color(QPalette.ButtonText).name()}; }}"
        )

    def set_text(self, text: str) -> None:
        self.text = text
        self.body.setText(text if text else "…")

    def append(self, piece: str) -> None:
        self.set_text(self.text + piece)

    def set_meta(self, n_tokens: int | None, stop_reason: str = "") -> None:
        parts = []
        if n_tokens is not None:
            parts.append(f"{n_tokens} token{'s' if n_tokens != 1 else ''}")
        if stop_reason:
            parts.append(STOP_REASONS.get(stop_reason, stop_reason))
        self.meta.setText(" · ".join(parts))

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)
        self.sig_copied.emit(self.text)


class ConversationWidget(QScrollArea):
    """The messages, newest at the bottom, followed while the view is at the bottom."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.messages: list[MessageWidget] = []
        self.inner = QWidget()
        self.column = QVBoxLayout(self.inner)
        self.column.setContentsMargins(4, 4, 4, 4)
        self.column.setSpacing(8)
        self.placeholder = QLabel()
        self.placeholder.setWordWrap(True)
        self.placeholder.setAlignment(Qt.AlignCenter)
        self.placeholder.setStyleSheet(
            f"QLabel {{ color: {self.palette().color(QPalette.PlaceholderText).name()}; }}"
        )
        self.column.addWidget(self.placeholder, 1)
        self.column.addStretch(0)
        self.setWidget(self.inner)
        self._follow = True
        self.verticalScrollBar().valueChanged.connect(self._scrolled)
        self.verticalScrollBar().rangeChanged.connect(self._range_changed)

    def set_placeholder(self, text: str) -> None:
        self.placeholder.setText(text)

    def add(self, role: str, text: str, who: str) -> MessageWidget:
        msg = MessageWidget(role, text, who)
        self.placeholder.hide()
        self.column.insertWidget(self.column.count() - 1, msg)
        self.column.setStretch(self.column.count() - 1, 1)
        self.messages.append(msg)
        self._follow = True
        QTimer.singleShot(0, self.scroll_to_bottom)
        return msg

    def remove(self, msg: MessageWidget) -> None:
        if msg in self.messages:
            self.messages.remove(msg)
            msg.setParent(None)
            msg.deleteLater()
        self.placeholder.setVisible(not self.messages)

    def clear(self) -> None:
        for msg in list(self.messages):
            self.remove(msg)

    def scroll_to_bottom(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 4

    def _range_changed(self, _lo: int, hi: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(hi)


class AnswerColumnWidget(QFrame):
    """One column of the side-by-side view: a title and one answer."""

    def __init__(self, title: str, tip: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = QLabel(f"<b>{title}</b>")
        self.title.setToolTip(tip)
        self.title.setWordWrap(True)
        self.message = MessageWidget("assistant", "", "Answer")
        self.message.who.hide()
        inner = QWidget()
        il = QVBoxLayout(inner)
        il.setContentsMargins(0, 0, 0, 0)
        il.addWidget(self.message)
        il.addStretch(1)
        scroll = scroll_area(inner)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(scroll, 1)
        self.clear()

    def clear(self) -> None:
        self.message.set_text("")
        self.message.body.setText("")
        self.message.set_meta(None)

    @property
    def text(self) -> str:
        return self.message.text


__all__ = ["AnswerColumnWidget", "ConversationWidget", "MessageWidget", "STOP_REASONS"]
