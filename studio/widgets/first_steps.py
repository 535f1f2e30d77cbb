"""The first-run strip: the steps a newcomer takes, each a link to its page, ticked as they are done.

`FirstStepsWidget(steps)` shows, left to right, "Model ✓ demo.gguf · Dataset ✓ 12 samples ·
Targets ✓ 14 tensors · Start training →": a button per step that emits `sig_step_clicked(key)`, and
a close button (`sig_dismissed`). The window tells it what is done (`set_step`) and decides when it
is shown; the strip knows nothing of pages, projects or settings. The next step to do is in bold.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QWidget

from .theme import is_dark

MAX_DETAIL = 32  # characters of a step's detail (a long model file name) before it is elided


def elide_middle(text: str, limit: int = MAX_DETAIL) -> str:
    """ "qwen2.5-coder-7b-instruct-q4_k_m.gguf" -> "qwen2.5-coder-7b-inst…4_k_m.gguf" (at most `limit`
    characters), so that a long file name does not widen the strip and the window."""
    if len(text) <= limit:
        return text
    tail = limit // 3
    return text[: limit - tail - 1] + "…" + text[-tail:]


class FirstStepsWidget(QFrame):
    """A row of step buttons; `set_step(key, done, detail)` updates one (a long detail is elided in
    the middle, whole in the tooltip); the last step is the action the others lead to
    ("Start training →") and is never ticked."""

    sig_step_clicked = Signal(str)  # the key of the step clicked
    sig_dismissed = Signal()  # the close button: the person does not want the strip

    COLOURS = {  # light: (background, border), dark: (background, border)
        False: ("#eef5fc", "#9cbfe3"),
        True: ("#1f2e3d", "#4f7fb0"),
    }

    def __init__(self, steps: Sequence[tuple[str, str]], parent: QWidget | None = None):
        """`steps`: (key, title) in order; the last one is the goal (e.g. ("Train", "Start training"))."""
        super().__init__(parent)
        self.setObjectName("firstSteps")
        self._dark: bool | None = None
        self.titles = dict(steps)
        self.keys = [key for key, _ in steps]
        self.done: dict[str, bool] = {key: False for key in self.keys}
        self.details: dict[str, str] = {key: "" for key in self.keys}
        self.buttons: dict[str, QToolButton] = {}
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 2, 2, 2)
        layout.setSpacing(2)
        intro = QLabel("Getting started:")
        layout.addWidget(intro)
        for i, key in enumerate(self.keys):
            if i:
                dot = QLabel("·")
                dot.setAlignment(Qt.AlignCenter)
                layout.addWidget(dot)
            button = QToolButton()
            button.setAutoRaise(True)
            button.setCursor(Qt.PointingHandCursor)
            button.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Fixed)
            button.clicked.connect(lambda _=False, key=key: self.sig_step_clicked.emit(key))
            layout.addWidget(button)
            self.buttons[key] = button
        layout.addStretch(1)
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setAutoRaise(True)
        self.close_button.setToolTip("Hide this strip (View > Getting started shows it again)")
        self.close_button.clicked.connect(self.sig_dismissed)
        layout.addWidget(self.close_button)
        for key in self.keys:
            self._render(key)
        self._restyle()

    def set_step(self, key: str, done: bool, detail: str = "", tip: str = "") -> None:
        """Tick (done) or not one step; `detail` follows its title ("12 samples"); `tip` is its tooltip."""
        self.done[key] = done
        self.details[key] = detail
        if tip:
            self.buttons[key].setToolTip(tip)
        for k in self.keys:
            self._render(k)

    def next_step(self) -> str:
        """The first step not done yet (the goal once all the others are)."""
        return next((k for k in self.keys[:-1] if not self.done[k]), self.keys[-1])

    def text_of(self, key: str) -> str:
        return self.buttons[key].text()

    def _render(self, key: str) -> None:
        button = self.buttons[key]
        title = self.titles[key]
        detail = elide_middle(self.details[key])
        if key == self.keys[-1]:
            text = f"{title} →"
        elif self.done[key]:
            text = f"{title} ✓" + (f" {detail}" if detail else "")
        else:
            text = f"{title}: {detail}" if detail else title
        button.setText(text.replace("&", "&&"))
        font = button.font()
        font.setBold(key == self.next_step())
        button.setFont(font)

    def _restyle(self) -> None:
        dark = is_dark(QApplication.palette())
        self._dark = dark
        bg, border = self.COLOURS[dark]
        self.setStyleSheet(
            f"#firstSteps {{ background: {bg}; border: 1px solid {border}; border-radius: 4px; }}"
        )

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.type() == QEvent.PaletteChange and self._dark is not None:
            if self._dark != is_dark(QApplication.palette()):
                self._restyle()
        super().changeEvent(event)


__all__ = ["FirstStepsWidget"]
