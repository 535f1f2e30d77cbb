"""The editor for one sample: chat turns (role and text), or prompt and response, or text, or a
preference pair (prompt, chosen and rejected answers, which a button swaps); a reward.

The editor shows a copy of the selected `Sample` and, on every change, builds the edited copy
(`rebuild_sample`, which validates it) and emits `sig_edit(new, problems, key, description)`;
the page turns that into an undoable edit of the `DatasetDocument`. `key` says which field
changed and in which editing session, so consecutive keystrokes in one box merge into one undo
step, while leaving the box starts a new one. Ctrl+Z / Ctrl+Shift+Z in a box undo and redo the
document, not the box. When the sample changes underneath (undo, redo), `show_sample` puts the
new values in the boxes, keeping the cursor where it was.

What this module is not: it changes no sample in the dataset (the page does, through the
document) and keeps no history of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QFocusEvent, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QComboBox,
    QDoubleSpinBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSizePolicy,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import Sample, chosen_text

from ...dataset_document import DatasetDocument
from ...widgets.buttons import action_button
from ...widgets.page_layout import scroll_area
from .samples import rebuild_sample
from .table import ROLES

ROLE_TIPS = {
    "system": "system: instructions for the whole conversation (not trained)",
    "user": "user: what the person says (not trained)",
    "assistant": "assistant: a reply the model learns to write (trained)",
    "tool": "tool: a tool's result handed back to the model (not trained)",
}


class FieldEdit(QPlainTextEdit):
    """A text box whose Ctrl+Z / Ctrl+Shift+Z undo and redo the dataset document, and which says
    when it loses focus (the end of an editing session)."""

    def __init__(
        self, history: DatasetDocument, on_focus_out: Callable[[], None], parent: QWidget | None = None
    ):
        super().__init__(parent)
        self._history, self._on_focus_out = history, on_focus_out
        self.setUndoRedoEnabled(False)
        self.setTabChangesFocus(True)

    def event(self, e: QEvent) -> bool:
        if e.type() == QEvent.ShortcutOverride and isinstance(e, QKeyEvent) and self._is_undo_redo(e):
            e.accept()  # handle it here, in keyPressEvent
            return True
        return super().event(e)

    @staticmethod
    def _is_undo_redo(e: QKeyEvent) -> bool:
        return e.matches(QKeySequence.Undo) or e.matches(QKeySequence.Redo)

    def keyPressEvent(self, e: QKeyEvent) -> None:  # noqa: N802 - Qt override
        if e.matches(QKeySequence.Undo):
            self._on_focus_out()
            self._history.undo()
        elif e.matches(QKeySequence.Redo):
            self._on_focus_out()
            self._history.redo()
        else:
            super().keyPressEvent(e)

    def focusOutEvent(self, e: QFocusEvent) -> None:  # noqa: N802 - Qt override
        self._on_focus_out()
        super().focusOutEvent(e)

    def set_text_keeping_cursor(self, text: str) -> None:
        if self.toPlainText() == text:
            return
        pos = self.textCursor().position()
        self.blockSignals(True)
        self.setPlainText(text)
        self.blockSignals(False)
        cursor = self.textCursor()
        cursor.setPosition(min(pos, len(text)))
        self.setTextCursor(cursor)


class AutoHeightEdit(FieldEdit):
    """A FieldEdit as tall as its text (between `min_lines` and `max_lines` lines)."""

    def __init__(
        self,
        history: DatasetDocument,
        on_focus_out: Callable[[], None],
        min_lines: int = 2,
        max_lines: int = 14,
    ):
        super().__init__(history, on_focus_out)
        self.min_lines, self.max_lines = min_lines, max_lines
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setLineWrapMode(QPlainTextEdit.WidgetWidth)
        self.document().documentLayout().documentSizeChanged.connect(lambda _size: self._fit())
        self._fit()

    def _fit(self) -> None:
        lines = int(self.document().documentLayout().documentSize().height())
        lines = max(self.min_lines, min(self.max_lines, lines))
        margins = self.contentsMargins()
        doc_margin = self.document().documentMargin()
        height = (
            self.fontMetrics().lineSpacing() * lines + 2 * doc_margin + margins.top() + margins.bottom() + 2
        )
        if self.height() != height:
            self.setFixedHeight(int(height))

    def resizeEvent(self, e) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(e)
        QTimer.singleShot(0, self._fit)


class RewardSpinBox(QDoubleSpinBox):
    """A reward in [-1e6, 1e6], or "no reward" (the lowest value, shown as text)."""

    NONE = -1_000_001.0
    LIMIT = 1_000_000.0

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setRange(self.NONE, self.LIMIT)
        self.setDecimals(4)
        self.setSingleStep(0.1)
        self.setSpecialValueText("no reward")
        self.setKeyboardTracking(False)
        self.setCorrectionMode(QAbstractSpinBox.CorrectToNearestValue)

    def textFromValue(self, value: float) -> str:  # noqa: N802 - Qt override
        return f"{value:.4f}".rstrip("0").rstrip(".")

    def valueFromText(self, text: str) -> float:  # noqa: N802 - Qt override
        try:
            return float(text.replace(",", "."))
        except ValueError:
            return self.value()

    def reward(self) -> float | None:
        v = self.value()
        if v <= self.NONE + 0.5:
            return None
        return max(-self.LIMIT, v)

    def set_reward(self, reward: float | None) -> None:
        self.setValue(self.NONE if reward is None else reward)

    def stepBy(self, steps: int) -> None:  # noqa: N802 - Qt override
        current = self.reward()
        if current is None:
            if steps > 0:
                self.setValue(0.0)
            return
        new = current + steps * self.singleStep()
        self.setValue(self.NONE if new < -self.LIMIT else min(new, self.LIMIT))


class TurnWidget(QFrame):
    """One chat turn: role, text, and buttons to move or remove it."""

    def __init__(self, editor: SampleEditorWidget, index: int):
        super().__init__()
        self.setFrameShape(QFrame.StyledPanel)
        self.index = index
        self.role = QComboBox()
        self.role.addItems(ROLES)
        for i, role in enumerate(ROLES):
            self.role.setItemData(i, ROLE_TIPS[role], Qt.ToolTipRole)
        self.role.setToolTip(
            "Who speaks in this turn. Only assistant turns are trained (unless 'train on prompt' is set)"
        )
        self.number = QLabel(f"Turn {index + 1}")
        self.up = self._button("↑", "Move this turn up")
        self.down = self._button("↓", "Move this turn down")
        self.remove = self._button("✕", "Remove this turn")
        self.edit = AutoHeightEdit(editor.history, editor.end_session)
        self.edit.setToolTip("The text of this turn. Control tokens such as <|im_end|> are read as tokens")
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.number)
        top.addWidget(self.role)
        top.addStretch(1)
        for b in (self.up, self.down, self.remove):
            top.addWidget(b)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 6)
        layout.setSpacing(3)
        layout.addLayout(top)
        layout.addWidget(self.edit)

    @staticmethod
    def _button(text: str, tip: str) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAutoRaise(True)
        return b


def _fields_page(*fields: tuple[str, QWidget, int]) -> QWidget:
    """A page of (label text, field, stretch) rows, each label above its field, with no margins."""
    page = QWidget()
    layout = QVBoxLayout(page)
    layout.setContentsMargins(0, 0, 0, 0)
    for label, widget, stretch in fields:
        layout.addWidget(QLabel(label))
        layout.addWidget(widget, stretch)
    return page


class SampleEditorWidget(QWidget):
    """Edits one sample; emits sig_edit(new_sample, problems, key, description) for each change."""

    sig_edit = Signal(object, object, object, str)

    def __init__(self, history: DatasetDocument, parent: QWidget | None = None):
        super().__init__(parent)
        self.history = history  # what Ctrl+Z in a box undoes
        self.sample: Sample | None = None
        self.turns: list[TurnWidget] = []
        self._session = 0
        self._unique = itertools.count()

        self.header = QLabel("No sample selected")
        self.header.setWordWrap(True)
        self.header.setToolTip("The sample being edited: its position, its line in the file and its shape")

        self.reward = RewardSpinBox()
        self.reward.setToolTip(
            "The sample's reward (saved as \"reward\"). Choose 'no reward' (below the lowest value, or "
            "the ✕ button) to leave it out. Any number from -1e6 to 1e6 is kept in the file; training "
            "clips rewards to [-1, 1] and scales them to [0, 1] weights."
        )
        self.reward.valueChanged.connect(self._reward_changed)
        self.clear_reward = QToolButton()
        self.clear_reward.setText("✕")
        self.clear_reward.setAutoRaise(True)
        self.clear_reward.setToolTip("Remove the reward from this sample (no reward)")
        self.clear_reward.clicked.connect(lambda: self.reward.set_reward(None))
        reward_row = QHBoxLayout()
        reward_label = QLabel("Reward:")
        reward_label.setToolTip(self.reward.toolTip())
        reward_row.addWidget(reward_label)
        reward_row.addWidget(self.reward)
        reward_row.addWidget(self.clear_reward)
        self.reward_note = QLabel()
        self.reward_note.setToolTip("Training clips rewards to [-1, 1]; the file keeps the number as it is")
        reward_row.addWidget(self.reward_note)
        reward_row.addStretch(1)

        # messages
        self.turns_box = QWidget()
        self.turns_layout = QVBoxLayout(self.turns_box)
        self.turns_layout.setContentsMargins(0, 0, 0, 0)
        self.turns_layout.setSpacing(6)
        self.add_turn_button = action_button(
            "Add turn",
            self.add_turn,
            "Add a turn at the end (user after an assistant turn, assistant after any other)",
        )
        turns_page = QWidget()
        turns_page_layout = QVBoxLayout(turns_page)
        turns_page_layout.setContentsMargins(0, 0, 4, 0)
        turns_page_layout.addWidget(self.turns_box)
        add_row = QHBoxLayout()
        add_row.addWidget(self.add_turn_button)
        add_row.addStretch(1)
        turns_page_layout.addLayout(add_row)
        turns_page_layout.addStretch(1)
        self.turns_scroll = scroll_area(turns_page, sideways=True)

        def field(changed, name: str, tip: str) -> FieldEdit:
            edit = FieldEdit(history, self.end_session)
            edit.setToolTip(tip)
            edit.textChanged.connect(lambda: changed(name))
            return edit

        # prompt / response
        fc, pc = self._field_changed, self._pref_changed
        self.prompt = field(fc, "prompt", "The prompt (not trained unless 'train on prompt' is set)")
        self.response = field(fc, "response", "The response the model learns to write (trained)")
        prompt_page = _fields_page(("Prompt:", self.prompt, 1), ("Response:", self.response, 2))

        # text
        self.text = field(fc, "text", "Plain text: every token is trained (a BOS before it, an EOS after)")
        text_page = _fields_page(("Text:", self.text, 1))

        # preference pair
        self.pref_context = QLabel()
        self.pref_context.setWordWrap(True)
        self.pref_context.setToolTip(
            "The turns before the prompt (a system message, earlier turns): kept as they are"
        )
        self.pref_prompt = field(
            pc, "prompt", "The prompt: the last user turn before the two answers (not trained)"
        )
        self.pref_chosen = field(
            pc, "chosen",
            "The better answer: DPO and ORPO raise its probability over the rejected one's; SFT trains on it",
        )  # fmt: skip
        self.pref_rejected = field(
            pc, "rejected", "The worse answer: DPO and ORPO lower its probability against the chosen one"
        )
        self.swap_button = action_button(
            "Swap chosen and rejected",
            self.swap_answers,
            "Make the rejected answer the chosen one and the other way round",
        )
        pref_page = _fields_page(
            ("Prompt:", self.pref_prompt, 1),
            ("Chosen (better) answer:", self.pref_chosen, 2),
            ("Rejected (worse) answer:", self.pref_rejected, 2),
        )
        pfl = pref_page.layout()
        pfl.insertWidget(0, self.pref_context)
        swap_row = QHBoxLayout()
        swap_row.addWidget(self.swap_button)
        swap_row.addStretch(1)
        pfl.addLayout(swap_row)

        self.empty = QLabel("Select a sample in the table to edit it, or add one (Ctrl+Shift+N).")
        self.empty.setAlignment(Qt.AlignCenter)
        self.empty.setWordWrap(True)
        self.pages = QStackedWidget()
        for page in (self.empty, self.turns_scroll, prompt_page, text_page, pref_page):
            self.pages.addWidget(page)
        self._page_of = {"messages": self.turns_scroll, "prompt": prompt_page, "text": text_page,
                         "preference": pref_page}  # fmt: skip

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.header)
        layout.addLayout(reward_row)
        layout.addWidget(self.pages, 1)
        self._set_enabled(False)

    # --- showing ------------------------------------------------------------------------------
    def end_session(self) -> None:
        """The next edit starts a new undo step."""
        self._session += 1

    def show_sample(self, sample: Sample | None, header: str = "") -> None:
        """Show `sample` (None: nothing selected); values already shown are left as they are."""
        if sample is not None and sample == self.sample and self.turns_match(sample):
            self.header.setText(header)
            return
        same_shape = (
            sample is not None
            and self.sample is not None
            and sample.kind == self.sample.kind
            and self.turns_match(sample)
        )
        self.sample = sample
        self.end_session()
        self.header.setText(header or "No sample selected")
        self._set_enabled(sample is not None)
        if sample is None:
            self.pages.setCurrentWidget(self.empty)
            return
        self.reward.blockSignals(True)
        self.reward.set_reward(sample.reward)
        self.reward.blockSignals(False)
        self._update_reward_note(sample.reward)
        self.pages.setCurrentWidget(self._page_of[sample.kind])
        if sample.kind == "messages":
            if not same_shape:
                self._build_turns(len(sample.messages))
            for turn, m in zip(self.turns, sample.messages, strict=True):
                turn.role.blockSignals(True)
                role = m.get("role")
                if turn.role.findText(str(role)) < 0:
                    turn.role.addItem(str(role))
                turn.role.setCurrentText(str(role))
                turn.role.blockSignals(False)
                turn.edit.set_text_keeping_cursor(str(m.get("content") or ""))
            self._update_turn_buttons()
        elif sample.kind == "prompt":
            self.prompt.set_text_keeping_cursor(sample.prompt or "")
            self.response.set_text_keeping_cursor(sample.response or "")
        elif sample.kind == "preference":
            before, prompt = self._pref_prompt_parts(sample)
            shown = "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in before)
            self.pref_context.setText(f"Before the prompt:\n{shown}" if before else "")
            self.pref_context.setVisible(bool(before))
            self.pref_prompt.set_text_keeping_cursor(prompt)
            self.pref_chosen.set_text_keeping_cursor(chosen_text(sample))
            self.pref_rejected.set_text_keeping_cursor(sample.rejected or "")
        else:
            self.text.set_text_keeping_cursor(sample.text or "")

    def turns_match(self, sample: Sample) -> bool:
        return sample.kind != "messages" or len(self.turns) == len(sample.messages)

    def _update_reward_note(self, reward: float | None) -> None:
        clipped = None if reward is None else min(1.0, max(-1.0, reward))
        self.reward_note.setText("" if clipped == reward else f"training uses {clipped:g}")

    def _set_enabled(self, enabled: bool) -> None:
        self.reward.setEnabled(enabled)
        self.clear_reward.setEnabled(enabled)

    def _build_turns(self, n: int) -> None:
        for turn in self.turns:
            self.turns_layout.removeWidget(turn)
            turn.deleteLater()
        self.turns = []
        for i in range(n):
            turn = TurnWidget(self, i)
            turn.role.currentTextChanged.connect(lambda role, i=i: self._role_changed(i, role))
            turn.edit.textChanged.connect(lambda i=i: self._turn_text_changed(i))
            turn.up.clicked.connect(lambda _=False, i=i: self.move_turn(i, i - 1))
            turn.down.clicked.connect(lambda _=False, i=i: self.move_turn(i, i + 1))
            turn.remove.clicked.connect(lambda _=False, i=i: self.remove_turn(i))
            self.turns_layout.addWidget(turn)
            self.turns.append(turn)

    def _update_turn_buttons(self) -> None:
        for i, turn in enumerate(self.turns):
            turn.up.setEnabled(i > 0)
            turn.down.setEnabled(i < len(self.turns) - 1)
            turn.remove.setEnabled(len(self.turns) > 1)

    # --- editing ------------------------------------------------------------------------------
    def _emit(self, description: str, key: tuple, reload: bool = False, **changes) -> None:
        assert self.sample is not None
        new, problems = rebuild_sample(self.sample, **changes)
        if reload or (new.kind == "messages" and len(new.messages) != len(self.turns)):
            self.sample = None  # put the new turns in the widgets (rebuilt if their number changed)
            self.show_sample(new, self.header.text())
        else:
            self.sample = new
        self.sig_edit.emit(new, problems, key, description)

    def _turn_text_changed(self, i: int) -> None:
        if self.sample is None or self.sample.kind != "messages" or i >= len(self.sample.messages):
            return
        messages = list(self.sample.messages)
        messages[i] = {**messages[i], "content": self.turns[i].edit.toPlainText()}
        self._emit(f"Edit turn {i + 1}", ("turn", i, "content", self._session), messages=tuple(messages))

    def _role_changed(self, i: int, role: str) -> None:
        if self.sample is None or self.sample.kind != "messages" or i >= len(self.sample.messages):
            return
        messages = list(self.sample.messages)
        messages[i] = {**messages[i], "role": role}
        self.end_session()
        self._emit(f"Set turn {i + 1} to {role}", ("role", next(self._unique)), messages=tuple(messages))

    def _field_changed(self, name: str) -> None:
        if self.sample is None or self.sample.kind not in ("prompt", "text"):
            return
        box = {"prompt": self.prompt, "response": self.response, "text": self.text}[name]
        self._emit(f"Edit {name}", (name, self._session), **{name: box.toPlainText()})

    @staticmethod
    def _pref_prompt_parts(sample: Sample) -> tuple[tuple[dict, ...], str]:
        """(the turns before the prompt, the prompt's text) of a preference sample."""
        prompt = sample.messages[:-1]
        if not prompt:
            return (), ""
        return prompt[:-1], str(prompt[-1].get("content") or "")

    def _pref_changed(self, which: str) -> None:
        s = self.sample
        if s is None or s.kind != "preference" or not s.messages:
            return
        if which == "prompt":
            text = self.pref_prompt.toPlainText()
            messages = list(s.messages)
            if len(messages) >= 2:
                messages[-2] = {**messages[-2], "content": text}
            changes = {"messages": tuple(messages)}
            if s.prompt is not None:
                changes["prompt"] = text
        elif which == "chosen":
            changes = {
                "messages": (*s.messages[:-1], {**s.messages[-1], "content": self.pref_chosen.toPlainText()})
            }
        else:
            changes = {"rejected": self.pref_rejected.toPlainText()}
        self._emit(f"Edit the {which}", (which, self._session), **changes)

    def swap_answers(self) -> None:
        """The chosen answer becomes the rejected one and the other way round (one undo step)."""
        s = self.sample
        if s is None or s.kind != "preference" or not s.messages:
            return
        self.end_session()
        messages = (*s.messages[:-1], {**s.messages[-1], "content": s.rejected or ""})
        self._emit("Swap chosen and rejected", ("swap", next(self._unique)), reload=True, messages=messages,
                   rejected=chosen_text(s))  # fmt: skip

    def _reward_changed(self, _value: float) -> None:
        if self.sample is None:
            return
        reward = self.reward.reward()
        if reward == self.sample.reward:
            return
        self._update_reward_note(reward)
        what = "Remove the reward" if reward is None else f"Set reward to {reward:g}"
        self._emit(what, ("reward", self._session), reward=reward)

    def add_turn(self) -> None:
        if self.sample is None or self.sample.kind != "messages":
            return
        last = self.sample.messages[-1].get("role") if self.sample.messages else "assistant"
        role = "user" if last == "assistant" else "assistant"
        messages = (*self.sample.messages, {"role": role, "content": ""})
        self._emit(f"Add a {role} turn", ("add", next(self._unique)), messages=messages)
        if self.turns:
            self.turns[-1].edit.setFocus()

    def remove_turn(self, i: int) -> None:
        if self.sample is None or self.sample.kind != "messages" or len(self.sample.messages) < 2:
            return
        messages = self.sample.messages[:i] + self.sample.messages[i + 1 :]
        self._emit(f"Remove turn {i + 1}", ("remove", next(self._unique)), messages=messages)

    def move_turn(self, i: int, j: int) -> None:
        if self.sample is None or self.sample.kind != "messages" or not 0 <= j < len(self.sample.messages):
            return
        messages = list(self.sample.messages)
        messages.insert(j, messages.pop(i))
        self._emit(f"Move turn {i + 1}", ("move", next(self._unique)), reload=True, messages=tuple(messages))

    def focus_first_field(self) -> None:
        if self.sample is None:
            return
        if self.sample.kind == "messages" and self.turns:
            self.turns[0].edit.setFocus()
        elif self.sample.kind == "prompt":
            self.prompt.setFocus()
        elif self.sample.kind == "preference":
            self.pref_prompt.setFocus()
        else:
            self.text.setFocus()


__all__ = ["FieldEdit", "RewardSpinBox", "SampleEditorWidget", "TurnWidget"]
