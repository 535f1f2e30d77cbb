"""The Rewards page's Side by side tab: one prompt and seed through the base model and through the
adapter trained on the page, the two answers side by side with the words that differ marked.

`SideBySideWidget` is the tab: the prompt (the Rate tab's when empty), the seed, Compare, and an
`AnswerPaneWidget` per model; `compare` samples both answers as a job of the page's engine worker,
on the page's rating session (made first when there is none). `word_diff_html` marks the words that
differ.
"""

from __future__ import annotations

import difflib
import html
import re

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import EngineError

from ...widgets.buttons import action_button
from ...widgets.faint_label import FaintLabel
from ...widgets.page_layout import splitter
from ...widgets.theme import is_dark
from ..generation import invalid_setting
from .cards import STOP_REASONS


class AnswerPaneWidget(QFrame):
    """One side of the comparison: a title, the answer text, its length and stop reason."""

    def __init__(self, title: str, tip: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("answerPane")
        self.setFrameShape(QFrame.StyledPanel)
        self.title = QLabel(f"<b>{title}</b>")
        self.title.setToolTip(tip)
        self.text = QTextBrowser()
        self.text.setPlaceholderText("Press Compare.")
        font = self.text.font()
        font.setPointSizeF(font.pointSizeF() * 1.1)
        self.text.setFont(font)
        self.meta = FaintLabel()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addWidget(self.title)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.meta)

    def set_answer(self, answer, html: str | None = None) -> None:
        """Show an answer (None: clear); `html` is its text with the differences marked."""
        if answer is None:
            self.text.setPlainText("")
            self.meta.setText("")
            return
        if html is None:
            self.text.setPlainText(answer.text)
        else:
            self.text.setHtml(html)
        n = len(answer.tokens)
        self.meta.setText(
            f"{n} token{'s' if n != 1 else ''} · {STOP_REASONS.get(answer.stop_reason, answer.stop_reason)}"
        )


class SideBySideWidget(QWidget):
    """The Side by side tab; see the module docstring. page: the RewardsPage."""

    def __init__(self, page, parent: QWidget | None = None):
        super().__init__(parent)
        self.page = page
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText(
            "A prompt to compare (the Rate tab's prompt is used when this is empty)"
        )
        self.prompt.setTabChangesFocus(True)
        self.prompt.setMaximumHeight(70)
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.seed.setValue(0)
        self.seed.setToolTip(
            "Both answers are sampled with this seed, so the only difference is the adapter. Default: 0."
        )
        dice = QToolButton()
        dice.setText("⚄")
        dice.setToolTip("A random seed")
        dice.clicked.connect(lambda: self.seed.setValue(int(np.random.default_rng().integers(0, 2**31 - 1))))
        self.compare_button = action_button(
            "Compare",
            self._compare,
            "Sample one answer from the base model (adapter off) and one with the adapter, same prompt and "
            "seed (Ctrl+Enter).",
            "Ctrl+Return",
        )
        self.status = FaintLabel()
        row = QHBoxLayout()
        row.addWidget(QLabel("Seed:"))
        row.addWidget(self.seed)
        row.addWidget(dice)
        row.addSpacing(8)
        row.addWidget(self.compare_button)
        row.addStretch(1)
        self.status.setWordWrap(True)
        self.base = AnswerPaneWidget("Base model", "The model file as it is, without the adapter")
        self.adapted = AnswerPaneWidget("With the adapter", "The model with the adapter trained on this page")
        panes = splitter(Qt.Horizontal, (self.base, self.adapted))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(QLabel("<b>Prompt</b>"))
        layout.addWidget(self.prompt)
        layout.addLayout(row)
        layout.addWidget(self.status)
        layout.addWidget(panes, 1)
        self.fallback_prompt = ""

    def _compare(self) -> None:
        text = self.prompt.toPlainText().strip() or self.fallback_prompt.strip()
        if text:
            self.compare(text, self.seed.value())
        else:
            self.status.setText("Type a prompt first.")

    def compare(self, prompt: str, seed: int) -> bool:
        """One answer from the base model and one with the adapter, same prompt and seed, in the worker;
        False (and why, in the page) if they cannot be sampled."""
        page = self.page
        if page.busy or not page._check_ready():
            return False
        try:
            config = page.reward_settings.reward_config()
        except EngineError as exc:
            page.show_error(invalid_setting(exc, "left"))
            return False
        page.banner.hide()
        system = page.system_edit.text().strip() or None

        def work(s) -> tuple:
            base = s.base_answer(prompt, seed=seed, system=system)
            return base, s.adapter_answer(prompt, seed=seed, system=system)

        job, model = page.session_job(config, work)

        def done(result) -> None:
            s, answers, error = result
            page._adopt(s, model)
            if error is not None:
                page._task_failed("comparing", error)
                return
            base, adapted = answers
            self.set_answers(base, adapted, steps=s.step)
            self.status.setText(f"Seed {seed}, the same sampling for both. {self.status.text()}")
            page.sig_compared.emit(base, adapted)

        page._run("loading" if model else "comparing", job, done)
        return True

    def set_answers(self, base, adapted, steps: int | None = None) -> None:
        """Both answers, the words that differ marked (struck out in the base's, marked in the adapter's)."""
        if base is None or adapted is None:
            self.base.set_answer(base)
            self.adapted.set_answer(adapted)
        else:
            old, new = word_diff_html(base.text, adapted.text, is_dark(self.palette()))
            self.base.set_answer(base, old)
            self.adapted.set_answer(adapted, new)
            if base.text == adapted.text:
                self.status.setText("The same answer: the adapter has not changed this one (yet).")
            else:
                self.status.setText("The marked words differ.")
        title = "With the adapter" + (
            f" (after {steps} step{'s' if steps != 1 else ''})" if steps is not None else ""
        )
        self.adapted.title.setText(f"<b>{title}</b>")


def word_diff_html(a: str, b: str, dark: bool = False) -> tuple[str, str]:
    """Both texts as HTML, the words only in `a` struck out on red, those only in `b` on green."""
    wa, wb = re.split(r"(\s+)", a), re.split(r"(\s+)", b)
    removed = "#5c2626" if dark else "#f8d0cc"
    added = "#1f4d2c" if dark else "#cdeed6"
    out_a, out_b = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=wa, b=wb, autojunk=False).get_opcodes():
        ta, tb = html.escape("".join(wa[i1:i2])), html.escape("".join(wb[j1:j2]))
        if op == "equal":
            out_a.append(ta)
            out_b.append(tb)
            continue
        if ta:
            out_a.append(f'<span style="background:{removed}; text-decoration: line-through;">{ta}</span>')
        if tb:
            out_b.append(f'<span style="background:{added};">{tb}</span>')
    wrap = '<div style="white-space: pre-wrap;">{}</div>'
    return wrap.format("".join(out_a)), wrap.format("".join(out_b))


__all__ = ["AnswerPaneWidget", "SideBySideWidget", "word_diff_html"]
