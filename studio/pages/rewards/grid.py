"""The grid of answer cards on the Rewards page: the round's `AnswerCardWidget`s in a scroll area.

`AnswerGridWidget` lays the cards out in up to two columns (fewer when the view is narrow) and moves
the focus between them with the arrow keys and Tab / Shift+Tab (wrapping around: the focus never
leaves the cards). While the cards are off during a round the grid holds the focus and takes the
rating keys itself (`takes_key`), so a digit never reaches the window's page list. Identical answers
are marked ("same as answer 2").

Layout and focus only: the cards (studio.pages.rewards.cards) ask for ratings, the page records them.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QApplication, QFrame, QGridLayout, QLabel, QScrollArea, QWidget

from ...widgets.buttons import shortcut_text
from .cards import CARD_MIN_WIDTH, AnswerCardWidget, takes_key


class AnswerGridWidget(QScrollArea):
    """The round's cards in a scrollable grid of up to `columns` columns (fewer when the view is narrow),
    with the focus moving between them."""

    def __init__(self, columns: int = 2, parent: QWidget | None = None):
        super().__init__(parent)
        self.max_columns = self.columns = columns  # fewer when the view is too narrow for them
        self.cards: list[AnswerCardWidget] = []
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setFocusPolicy(Qt.StrongFocus)  # holds the focus while the cards are off (a round running)
        self.inner = QWidget()
        self.grid = QGridLayout(self.inner)
        self.grid.setContentsMargins(2, 2, 2, 2)
        self.grid.setSpacing(8)
        self.placeholder = QLabel()
        self.placeholder.setAlignment(Qt.AlignCenter)
        self.placeholder.setWordWrap(True)
        self.placeholder.setObjectName("cardMeta")
        self.set_placeholder(
            "No answers yet.\n\nType a prompt above (or take one from the dataset) and press Generate "
            f"({shortcut_text('Ctrl+Return')})."
        )
        self.setWidget(self.inner)
        self._rebuild()

    def _fit_columns(self) -> bool:
        """As many columns (up to max_columns) as fit the view without squeezing a card; True if changed."""
        need = max([CARD_MIN_WIDTH] + [c.minimumSizeHint().width() for c in self.cards[:1]])
        spacing = self.grid.spacing()
        columns = max(1, min(self.max_columns, (self.viewport().width() + spacing) // (need + spacing)))
        changed, self.columns = columns != self.columns, columns
        return changed

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        if self._fit_columns():
            self._rebuild()

    def set_placeholder(self, text: str) -> None:
        self.placeholder.setText(text)

    def clear(self) -> None:
        for card in self.cards:
            card.setParent(None)
            card.deleteLater()
        self.cards = []
        self._rebuild()

    def set_cards(self, cards: list[AnswerCardWidget]) -> None:
        self.hold_focus()  # a focused card about to go must not hand the focus to the window
        self.clear()
        self.cards = list(cards)
        for card in self.cards:
            card.sig_move.connect(self.move_focus)
        self._fit_columns()
        self._rebuild()
        for a, b in zip(self.cards, self.cards[1:], strict=False):
            QWidget.setTabOrder(a, b)

    def _rebuild(self) -> None:
        while self.grid.count():
            self.grid.takeAt(0)
        for r in range(self.grid.rowCount()):
            self.grid.setRowStretch(r, 0)
        if not self.cards:
            self.grid.addWidget(self.placeholder, 0, 0, 1, self.columns)
            self.placeholder.show()
            self.grid.setRowStretch(0, 1)
            return
        self.placeholder.hide()
        self.grid.setRowStretch(0, 0)
        for i, card in enumerate(self.cards):
            self.grid.addWidget(card, i // self.columns, i % self.columns, Qt.AlignTop)
        for c in range(self.max_columns):
            self.grid.setColumnStretch(c, 1 if c < self.columns else 0)
        last = (len(self.cards) - 1) // self.columns + 1
        self.grid.setRowStretch(last, 1)

    def focus_card(self, index: int) -> None:
        if 0 <= index < len(self.cards):
            card = self.cards[index]
            if not card.isVisible():  # just added to the layout: Qt shows it from the event queue
                QTimer.singleShot(0, lambda card=card: self._focus(card))
                return
            self._focus(card)

    def _focus(self, card: AnswerCardWidget) -> None:
        if card in self.cards and card.isVisible():
            card.setFocus(Qt.OtherFocusReason)
            self.ensureWidgetVisible(card, 10, 10)

    def move_focus(self, index: int, direction: str) -> None:
        """Arrows move in the grid (left / right in order, up / down by rows); next / previous (Tab,
        Shift+Tab) go in order and wrap around, so the focus never leaves the cards."""
        n = len(self.cards)
        if not n:
            return
        if direction in ("next", "previous"):
            self.focus_card((index + (1 if direction == "next" else -1)) % n)
            return
        step = {"left": -1, "right": 1, "up": -self.columns, "down": self.columns}[direction]
        self.focus_card(index + step)

    def hold_focus(self) -> None:
        """Keep the focus in the grid (not on a card) while the cards are disabled: keys pressed
        meanwhile are swallowed here instead of reaching the window."""
        w = QApplication.focusWidget()
        if w is not None and (w is self or self.isAncestorOf(w)):
            self.setFocus(Qt.OtherFocusReason)

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.ShortcutOverride and takes_key(event):
            event.accept()
            return True
        if event.type() == QEvent.KeyPress and event.key() in (Qt.Key_Tab, Qt.Key_Backtab):
            if self.cards and self.hasFocus():
                if all(c.isEnabled() for c in self.cards):
                    self.focus_card(0 if event.key() == Qt.Key_Tab else len(self.cards) - 1)
                return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt override
        if takes_key(event):
            event.accept()  # a rating key while the cards are busy: not for the window
            if event.key() in (Qt.Key_Down, Qt.Key_Right) and self.cards and self.cards[0].isEnabled():
                self.focus_card(0)
            return
        super().keyPressEvent(event)

    def next_card(self, index: int) -> None:
        """Focus the next card after `index` that is not rated yet (else simply the next one)."""
        later = self.cards[index + 1 :]
        target = next((c for c in later if c.state == "unrated"), later[0] if later else None)
        if target is not None:
            self.focus_card(target.index)
