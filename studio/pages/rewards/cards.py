"""Answer cards of the Rewards page: one card per sampled answer, rated from the keyboard or mouse.

`AnswerCardWidget` shows an answer (selectable text, token count, why it stopped) and its rating
controls: five stars (keys 1-5), thumbs up / down (+1 / -1, keys U / D or + / -), a slider for
fine values in [-1, 1] (keys [ and ]), Skip (keys 0 or S) and Edit… (E or F2: an inline editor for
a better answer, saved with Ctrl+Enter). A coloured band on the left tells the rating at a glance:
red for -1 through grey to green for +1; a skipped answer is greyed out.

The card only *asks* for a rating (`sig_rated`, `sig_corrected`); the page records it in the engine's
reward session and then shows it with `set_rating` / `set_corrected`, so a card never shows a
rating that was not saved. The rating keys are the cards' own: a card takes them before any
shortcut of the window (`takes_key`), so a digit never reaches the window's page list. Laying the
cards out and moving the focus between them is `studio.pages.rewards.grid`.

What this is not: it keeps no data the engine needs and calls nothing in the engine but
`rating_from_stars`.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QKeyEvent, QPainter, QPainterPath, QPalette, QPixmap
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSizePolicy,
    QSlider,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import rating_from_stars

from ...widgets.buttons import action_button
from ...widgets.theme import is_dark
from ...widgets.wrapping_label import wrapping_label

CARD_MIN_WIDTH = 260  # a card narrower than this would squeeze its controls: one column then
SLIDER_STEPS = 20  # slider positions per unit: values in steps of 0.05
STOP_REASONS = {
    "eos": "ended its turn",
    "length": "hit the token limit",
    "context": "filled the context",
    "stopped": "stopped",
}
CARD_KEYS = (
    "Keys on a card: 1–5 stars · U / D thumbs · [ ] fine-tune · 0 or S skip · E edit. A rating moves on "
    "to the next unrated answer by itself; Tab, Shift+Tab and the arrows move between answers (Tab wraps)."
)
# keys a card takes for itself, so that none reaches the window (its page list, a shortcut)
RATING_KEYS = frozenset(
    (Qt.Key_0, Qt.Key_1, Qt.Key_2, Qt.Key_3, Qt.Key_4, Qt.Key_5, Qt.Key_6, Qt.Key_7, Qt.Key_8, Qt.Key_9,
     Qt.Key_S, Qt.Key_U, Qt.Key_D, Qt.Key_E, Qt.Key_F2, Qt.Key_Plus, Qt.Key_Minus, Qt.Key_Equal,
     Qt.Key_BracketLeft, Qt.Key_BracketRight, Qt.Key_Left, Qt.Key_Right, Qt.Key_Up, Qt.Key_Down)
)  # fmt: skip


def takes_key(event: QKeyEvent) -> bool:
    """A key of the rating loop (no Ctrl / Alt / Meta): a card or the grid consumes it."""
    if event.modifiers() & (Qt.ControlModifier | Qt.AltModifier | Qt.MetaModifier):
        return False
    return event.key() in RATING_KEYS or event.key() in (Qt.Key_Tab, Qt.Key_Backtab)


def stars_for(value: float) -> int:
    """The star count (1-5) closest to a reward in [-1, 1]: -1 → 1, 0 → 3, +1 → 5."""
    return max(1, min(5, int(round((max(-1.0, min(1.0, value)) + 1.0) * 2.0)) + 1))


def rating_colour(value: float | None) -> QColor:
    """Red (-1) → grey (0) → green (+1); None (skipped or unrated) is light grey."""
    if value is None:
        return QColor("#a0a4a8")
    v = max(-1.0, min(1.0, value))
    grey, red, green = QColor("#9aa0a6"), QColor("#d64541"), QColor("#27ae60")
    end = green if v >= 0 else red
    t = abs(v)
    return QColor(
        round(grey.red() + (end.red() - grey.red()) * t),
        round(grey.green() + (end.green() - grey.green()) * t),
        round(grey.blue() + (end.blue() - grey.blue()) * t),
    )


def format_reward(value: float) -> str:
    return f"{value:+.2f}".replace("-", "−")


def thumb_icon(up: bool, colour: QColor, size: int = 20) -> QIcon:
    """A thumbs-up (or down) drawn with a painter path: no emoji font needed."""
    pm = QPixmap(size * 2, size * 2)  # drawn at 2x for high-dpi screens
    pm.fill(Qt.transparent)
    pm.setDevicePixelRatio(2.0)
    p = QPainter(pm)
    p.setRenderHint(QPainter.Antialiasing)
    s = size / 20.0
    if not up:  # a thumbs-down is a thumbs-up turned upside down
        p.translate(0, size)
        p.scale(1, -1)
    p.scale(s, s)
    p.setPen(Qt.NoPen)
    p.setBrush(colour)
    p.drawRoundedRect(QRectF(2, 9, 3.5, 9), 1, 1)  # cuff
    hand = QPainterPath()
    hand.moveTo(7, 9)
    hand.lineTo(10, 3.5)
    hand.quadTo(11, 1.5, 12.3, 2.5)
    hand.quadTo(13.2, 3.5, 12.6, 6)
    hand.lineTo(12, 8)
    hand.lineTo(16.5, 8)
    hand.quadTo(18.6, 8.2, 18, 10.5)
    hand.lineTo(16.3, 16.5)
    hand.quadTo(15.8, 18, 14.3, 18)
    hand.lineTo(7, 18)
    hand.closeSubpath()
    p.drawPath(hand)
    p.end()
    return QIcon(pm)


def _set_style(widget, sheet: str) -> None:
    """setStyleSheet only when it changes: each call re-polishes the widget and all its children, and
    cards refresh on every focus change."""
    if widget.styleSheet() != sheet:
        widget.setStyleSheet(sheet)


class AnswerEditWidget(QPlainTextEdit):
    """The inline editor's text box: Ctrl+Enter saves, Escape cancels (before any page shortcut)."""

    sig_save = Signal()
    sig_cancel = Signal()

    def _is_save(self, event: QKeyEvent) -> bool:
        return event.key() in (Qt.Key_Return, Qt.Key_Enter) and bool(event.modifiers() & Qt.ControlModifier)

    def event(self, event: QEvent) -> bool:
        # claim Ctrl+Enter and Escape from the window's shortcuts (Generate is Ctrl+Enter)
        if event.type() == QEvent.ShortcutOverride and (self._is_save(event) or event.key() == Qt.Key_Escape):
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt override
        if self._is_save(event):
            self.sig_save.emit()
        elif event.key() == Qt.Key_Escape:
            self.sig_cancel.emit()
        else:
            super().keyPressEvent(event)


class AnswerCardWidget(QFrame):
    """One answer and its rating controls; see the module docstring for the keys."""

    sig_rated = Signal(int, object, bool)  # index, reward (None = skip), move on to the next card
    sig_unskip = Signal(int)
    sig_corrected = Signal(int, str)  # index, the better answer
    sig_move = Signal(int, str)  # index, "left" | "right" | "up" | "down" | "next" | "previous"

    def __init__(self, index: int, text: str, n_tokens: int | None = None, stop_reason: str = "",
                 parent: QWidget | None = None):  # fmt: skip
        super().__init__(parent)
        self.index = index
        self.text = text
        self.state = "unrated"  # "unrated" | "rated" | "skipped"
        self.rating: float | None = None
        self.weight: float | None = None
        self.weight_kind = "advantage"  # "advantage" (group mode) | "weight" (weighted mode)
        self.corrected: str | None = None
        self.locked = False  # the round was applied: the card shows its rating but takes no more
        self.setObjectName("answerCard")
        self.setFocusPolicy(Qt.StrongFocus)
        self.setToolTip(CARD_KEYS)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Maximum)

        # --- header: number, length and stop reason, rating badge, weight ---
        self.title = QLabel(f"<b>Answer {index + 1}</b>")
        self.title.setObjectName("cardTitle")  # coloured by the card's style sheet (dark themes too)
        self.meta = QLabel()
        self.meta.setObjectName("cardMeta")
        self.set_meta(n_tokens, stop_reason)
        self.badge = QLabel()
        self.badge.setObjectName("ratingBadge")
        self.badge.setAlignment(Qt.AlignCenter)
        self.badge.setMinimumWidth(58)
        self.weight_label = QLabel()
        self.weight_label.setObjectName("cardWeight")
        self.weight_label.setToolTip(
            "What this answer will count for when you apply the step: its advantage (group mode: "
            "(rating − mean) / spread; positive pulls the model towards it, negative pushes away) or "
            "its loss weight (weighted mode: 0 ignores it, 1 trains on it fully)."
        )
        self.meta.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.weight_label.setAlignment(Qt.AlignRight | Qt.AlignVCenter)
        header = QHBoxLayout()
        header.setSpacing(6)
        header.addWidget(self.title)
        self.same_as: list[int] = []
        self.same_label = QLabel()  # "same as answer 2": beside the token count, never over the badge
        self.same_label.setObjectName("sameAs")
        self.same_label.hide()
        header.addStretch(1)
        header.addWidget(self.badge)
        info = QHBoxLayout()
        info.setSpacing(6)
        info.addWidget(self.meta, 1)
        info.addWidget(self.same_label)
        info.addWidget(self.weight_label)

        # --- the answer ---
        self.body = wrapping_label(
            name="answerText", text_format=Qt.PlainText, interaction=Qt.TextSelectableByMouse
        )
        self.body.setMinimumHeight(36)
        self.body.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        self.set_text(text)
        self.correction_label = wrapping_label(
            name="correction", text_format=Qt.RichText, interaction=Qt.TextSelectableByMouse
        )
        self.correction_label.hide()

        # --- rating controls ---
        self.star_buttons: list[QToolButton] = []
        stars = QHBoxLayout()
        stars.setSpacing(0)
        for n in range(1, 6):
            b = QToolButton()
            b.setText("★")
            b.setAutoRaise(True)
            b.setFocusPolicy(Qt.NoFocus)
            b.setFixedWidth(26)
            b.setToolTip(
                f"{n} star{'s' if n > 1 else ''} = reward {format_reward(rating_from_stars(n))} (key {n})"
            )
            b.clicked.connect(lambda _=False, n=n: self.rate_stars(n))
            self.star_buttons.append(b)
            stars.addWidget(b)
        self.up_button = self._tool("Good: reward +1 (key U or +)", lambda: self.request(1.0))
        self.down_button = self._tool("Bad: reward −1 (key D or −)", lambda: self.request(-1.0))
        self.slider = QSlider(Qt.Horizontal)
        self.slider.setRange(-SLIDER_STEPS, SLIDER_STEPS)
        self.slider.setPageStep(SLIDER_STEPS // 10)
        self.slider.setFocusPolicy(Qt.NoFocus)
        self.slider.setMinimumWidth(70)
        self.slider.setToolTip("A reward anywhere in [−1, 1] in steps of 0.05 (keys [ and ] move it by 0.1)")
        self.slider.valueChanged.connect(self._slider_moved)
        self.slider.sliderReleased.connect(self._slider_released)
        self.slider_label = QLabel("0.00")
        self.slider_label.setMinimumWidth(38)
        self.slider_label.setAlignment(Qt.AlignRight | Qt.AlignVCenter)
        self.skip_button = QToolButton()
        self.skip_button.setText("Skip")
        self.skip_button.setCheckable(True)
        self.skip_button.setFocusPolicy(Qt.NoFocus)
        self.skip_button.setToolTip("Leave this answer out of the step (key 0 or S); press again to undo")
        self.skip_button.clicked.connect(self._skip_clicked)
        self.edit_button = QToolButton()
        self.edit_button.setText("Edit…")
        self.edit_button.setFocusPolicy(Qt.NoFocus)
        self.edit_button.setToolTip(
            "Write a better answer (key E): it is saved at once as a training sample (SFT) and used by "
            "the next Apply"
        )
        self.edit_button.clicked.connect(self.open_editor)
        row1 = QHBoxLayout()
        row1.setSpacing(2)
        row1.addLayout(stars)
        row1.addSpacing(10)
        row1.addWidget(self.up_button)
        row1.addWidget(self.down_button)
        row1.addStretch(1)
        row2 = QHBoxLayout()
        row2.setSpacing(4)
        row2.addWidget(self.slider, 1)
        row2.addWidget(self.slider_label)
        row2.addSpacing(6)
        row2.addWidget(self.skip_button)
        row2.addWidget(self.edit_button)

        # --- inline editor (hidden until Edit…) ---
        self.editor = AnswerEditWidget()
        self.editor.setPlaceholderText("Write the answer the model should have given…")
        self.editor.setTabChangesFocus(True)
        self.editor.setMinimumHeight(70)
        self.editor.sig_save.connect(self.save_editor)
        self.editor.sig_cancel.connect(self.close_editor)
        self.save_edit_button = action_button(
            "Save better answer",
            self.save_editor,
            "Save it as a training sample for the next Apply (Ctrl+Enter)",
        )
        cancel = action_button("Cancel", self.close_editor, "Close the editor without saving (Escape)")
        self.editor_box = QWidget()
        el = QVBoxLayout(self.editor_box)
        el.setContentsMargins(0, 4, 0, 0)
        el.setSpacing(3)
        el.addWidget(self.editor)
        eb = QHBoxLayout()
        eb.addStretch(1)
        eb.addWidget(cancel)
        eb.addWidget(self.save_edit_button)
        el.addLayout(eb)
        self.editor_box.hide()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 8, 10, 8)
        layout.setSpacing(4)
        layout.addLayout(header)
        layout.addLayout(info)
        layout.addWidget(self.body)
        layout.addWidget(self.correction_label)
        layout.addLayout(row1)
        layout.addLayout(row2)
        layout.addWidget(self.editor_box)
        self._refresh()

    def _tool(self, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setAutoRaise(True)
        b.setFocusPolicy(Qt.NoFocus)
        b.setToolTip(tip)
        b.clicked.connect(slot)
        return b

    # --- content ----------------------------------------------------------------------------
    def set_meta(self, n_tokens: int | None, stop_reason: str) -> None:
        """ "12 tokens", plus "cut off" / "stopped" when the answer did not end its turn by itself."""
        parts = []
        if n_tokens is not None:
            parts.append(f"{n_tokens} token{'s' if n_tokens != 1 else ''}")
        if stop_reason in ("length", "context"):
            parts.append("cut off")
        elif stop_reason and stop_reason != "eos":
            parts.append(STOP_REASONS.get(stop_reason, stop_reason))
        self.meta.setText(" · ".join(parts))
        self.meta.setToolTip(
            " · ".join(parts[:1] + [STOP_REASONS.get(stop_reason, stop_reason)] * bool(stop_reason))
        )

    def set_check(self, score) -> None:
        """The answer's score from checks (an engine Score; None: not scored), after its length."""
        base = self.meta.text().split(" · checks")[0]
        if score is None:
            self.meta.setText(base)
            return
        if score.total is None:
            errors = "; ".join(f"{k}: {v}" for k, v in score.errors.items())
            self.meta.setText(f"{base} · checks failed")
            self.meta.setToolTip(f"A check failed, so this answer is left out of the step: {errors}")
        else:
            parts = ", ".join(f"{k} {v:g}" for k, v in score.parts.items())
            self.meta.setText(f"{base} · checks {score.total:+.2f}")
            self.meta.setToolTip(f"Score from the checks: {parts}")
        self.check_score = score

    def set_text(self, text: str) -> None:
        self.text = text
        self.body.setText(text if text.strip() else "(empty answer)")

    def set_same_as(self, others: list[int]) -> None:
        """Mark the answer as identical to these other answers (indexes), or unmark it ([])."""
        self.same_as = list(others)
        if others:
            nums = [str(i + 1) for i in others]
            names = nums[0] if len(nums) == 1 else f"{', '.join(nums[:-1])} and {nums[-1]}"
            what = f"answer{'s' if len(nums) > 1 else ''} {names}"
            self.same_label.setText(f"same as {what}")
            self.same_label.setToolTip(
                f"This answer is the same text as {what}: rating them differently teaches nothing "
                "(their pulls cancel out). Rate one of them and skip the others (key S)."
            )
        self.same_label.setVisible(bool(others))

    # --- asking for a rating (the page records it, then calls set_rating) --------------------
    def request(self, value: float | None, advance: bool = True) -> None:
        if self.locked or not self.isEnabled():
            return
        self.sig_rated.emit(self.index, value, advance)

    def rate_stars(self, n: int) -> None:
        self.request(rating_from_stars(n))

    def _skip_clicked(self, checked: bool) -> None:
        self.skip_button.setChecked(self.state == "skipped")  # the page decides
        if self.locked:
            return
        if checked:
            self.request(None)
        else:
            self.sig_unskip.emit(self.index)

    def _slider_moved(self, position: int) -> None:
        self.slider_label.setText(format_reward(position / SLIDER_STEPS))

    def _slider_released(self) -> None:
        self.request(self.slider.value() / SLIDER_STEPS, advance=False)

    def nudge(self, delta: float) -> None:
        base = self.rating if self.state == "rated" and self.rating is not None else 0.0
        self.request(round(max(-1.0, min(1.0, base + delta)) * SLIDER_STEPS) / SLIDER_STEPS, advance=False)

    # --- showing the recorded rating ----------------------------------------------------------
    def set_rating(self, value: float | None, skipped: bool = False) -> None:
        """Show a recorded rating: a value, skipped (None, skipped=True) or unrated (None)."""
        self.rating = None if value is None else float(value)
        self.state = "rated" if value is not None else ("skipped" if skipped else "unrated")
        self._refresh()

    def set_weight(self, weight: float | None, kind: str) -> None:
        self.weight, self.weight_kind = weight, kind
        if weight is None:
            self.weight_label.setText("")
        elif kind == "weight":
            self.weight_label.setText(f"weight {weight:.2f}")
        else:
            self.weight_label.setText(f"advantage {format_reward(weight)}")

    def set_corrected(self, text: str) -> None:
        self.corrected = text
        self.correction_label.setText(
            "<b>✎ Your better answer</b> (saved as a training sample):<br>"
            + text.replace("&", "&amp;").replace("<", "&lt;").replace("\n", "<br>")
        )
        self.correction_label.show()
        self.close_editor()

    def set_locked(self, locked: bool) -> None:
        """After Apply: the rating stays visible, the controls are off."""
        self.locked = locked
        for w in (*self.star_buttons, self.up_button, self.down_button, self.slider, self.skip_button,
                  self.edit_button):  # fmt: skip
            w.setEnabled(not locked)
        self._refresh()

    def _refresh(self) -> None:
        dark = is_dark(self.palette())
        value = self.rating if self.state == "rated" else None
        band = rating_colour(value)
        n = stars_for(value) if value is not None else 0
        # an unlit star or thumb: visible on the card's tint in both palettes (the dark Mid is not)
        gold, off = QColor("#f2b01e"), QColor("#70757c") if dark else self.palette().color(QPalette.Mid)
        for i, b in enumerate(self.star_buttons, start=1):
            colour = (gold if i <= n else off).name()
            _set_style(b, f"QToolButton {{ font-size: 19px; padding: 0px; color: {colour}; }}")
        up_on = self.state == "rated" and value is not None and value >= 0.999
        down_on = self.state == "rated" and value is not None and value <= -0.999
        self.up_button.setIcon(thumb_icon(True, QColor("#27ae60") if up_on else off))
        self.down_button.setIcon(thumb_icon(False, QColor("#d64541") if down_on else off))
        self.slider.blockSignals(True)
        self.slider.setValue(round((value or 0.0) * SLIDER_STEPS))
        self.slider.blockSignals(False)
        self._slider_moved(self.slider.value())
        self.skip_button.setChecked(self.state == "skipped")
        if self.state == "rated":
            badge, fg, bg = format_reward(value), "white", band.name()
        elif self.state == "skipped":
            badge, fg, bg = "skipped", self.palette().color(QPalette.Text).name(), "transparent"
        else:
            badge, fg, bg = "not rated", self.palette().color(QPalette.PlaceholderText).name(), "transparent"
        self.badge.setText(badge)
        outline = band.name() if self.state != "unrated" else off.name()
        _set_style(
            self.badge,
            f"QLabel#ratingBadge {{ color: {fg}; background: {bg}; border-radius: 9px; padding: 1px 8px; "
            f"font-weight: bold; border: 1px solid {outline}; }}",
        )
        focus = self.hasFocus()
        highlight = self.palette().color(QPalette.Highlight)
        base = self.palette().color(QPalette.Base)
        tint = QColor(band)
        tint.setAlpha(40 if self.state == "rated" else 0)
        background = _blend(base, tint)
        border = highlight.name() if focus else self.palette().color(QPalette.Mid).name()
        text_colour = self.palette().color(
            QPalette.PlaceholderText if self.state == "skipped" else QPalette.Text
        )
        _set_style(
            self,
            f"QFrame#answerCard {{ background: {background.name()}; border: {2 if focus else 1}px solid "
            f"{border}; border-left: 7px solid {band.name() if self.state != 'unrated' else border}; "
            f"border-radius: 6px; }}"
            f"QLabel#answerText {{ font-size: 14px; color: {text_colour.name()}; }}"
            f"QLabel#cardTitle {{ color: {self.palette().color(QPalette.Text).name()}; }}"
            f"QLabel#cardMeta {{ color: {self.palette().color(QPalette.PlaceholderText).name()}; }}"
            f"QLabel#cardWeight {{ color: {'#9ecbff' if dark else '#1b4f72'}; }}"
            f"QLabel#sameAs {{ color: {'#f5c26b' if dark else '#8a5300'}; font-weight: bold; }}"
            f"QLabel#correction {{ color: {'#9be7b0' if dark else '#1e6b3a'}; }}",
        )

    # --- editor -----------------------------------------------------------------------------
    def open_editor(self) -> None:
        if self.locked:
            return
        self.editor.setPlainText(self.corrected if self.corrected is not None else self.text)
        self.editor_box.show()
        self.editor.setFocus()
        self.editor.selectAll()

    def close_editor(self) -> None:
        had_focus = self.editor.hasFocus()
        self.editor_box.hide()
        if had_focus:
            self.setFocus()

    def save_editor(self) -> None:
        text = self.editor.toPlainText().strip()
        if text:
            self.sig_corrected.emit(self.index, text)

    @property
    def editing(self) -> bool:
        return not self.editor_box.isHidden()

    # --- keyboard and focus -----------------------------------------------------------------
    def event(self, event: QEvent) -> bool:
        # the rating keys are the card's, before any shortcut of the window; Tab and Shift+Tab move
        # between the cards (wrapping around) instead of leaving them
        if event.type() == QEvent.ShortcutOverride and takes_key(event):
            event.accept()
            return True
        if event.type() == QEvent.KeyPress and event.key() in (Qt.Key_Tab, Qt.Key_Backtab):
            if not event.modifiers() & (Qt.ControlModifier | Qt.AltModifier | Qt.MetaModifier):
                back = event.key() == Qt.Key_Backtab or bool(event.modifiers() & Qt.ShiftModifier)
                self.sig_move.emit(self.index, "previous" if back else "next")
                return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt override
        key, mods = event.key(), event.modifiers()
        if mods & (Qt.ControlModifier | Qt.AltModifier | Qt.MetaModifier):
            super().keyPressEvent(event)
            return
        moves = {Qt.Key_Left: "left", Qt.Key_Right: "right", Qt.Key_Up: "up", Qt.Key_Down: "down"}
        if Qt.Key_6 <= key <= Qt.Key_9:
            event.accept()  # not a rating, but never the window's either
        elif Qt.Key_1 <= key <= Qt.Key_5:
            self.rate_stars(key - Qt.Key_0)
        elif key in (Qt.Key_0, Qt.Key_S):
            self.request(None)
        elif key in (Qt.Key_U, Qt.Key_Plus, Qt.Key_Equal):
            self.request(1.0)
        elif key in (Qt.Key_D, Qt.Key_Minus):
            self.request(-1.0)
        elif key == Qt.Key_BracketRight:
            self.nudge(0.1)
        elif key == Qt.Key_BracketLeft:
            self.nudge(-0.1)
        elif key in (Qt.Key_E, Qt.Key_F2):
            self.open_editor()
        elif key in moves:
            self.sig_move.emit(self.index, moves[key])
        else:
            super().keyPressEvent(event)
            return
        event.accept()

    def focusInEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().focusInEvent(event)
        self._refresh()

    def focusOutEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().focusOutEvent(event)
        self._refresh()

    def mousePressEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.setFocus(Qt.MouseFocusReason)
        super().mousePressEvent(event)


def _blend(base: QColor, over: QColor) -> QColor:
    a = over.alphaF()
    return QColor(
        round(base.red() * (1 - a) + over.red() * a),
        round(base.green() * (1 - a) + over.green() * a),
        round(base.blue() * (1 - a) + over.blue() * a),
    )


__all__ = [
    "AnswerCardWidget",
    "AnswerEditWidget",
    "CARD_KEYS",
    "RATING_KEYS",
    "format_reward",
    "rating_colour",
    "stars_for",
    "takes_key",
    "thumb_icon",
]
