"""Panels of the Rewards page around the answer cards: diagnostics, history, side by side, prompts.

- `DiagnosticsWidget`: what the next Apply will do, from the session's `Preview`: how many answers
  are rated, the group's mean and spread, a bar per answer with the weight or advantage it will
  get, and a warning when the ratings carry no signal (all equal).
- `RoundsModel` + `RewardHistoryWidget`: the rounds so far (a table) and mean reward and loss per
  round (two pyqtgraph plots sharing the round axis).
- `PromptPickerDialog` and `dataset_prompts`: choose a prompt from the dataset's samples.

These widgets draw what they are given; the page owns the reward session and runs the engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QGroupBox,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QSizePolicy,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from ...widgets import roles
from ...widgets.banner import MessageBar
from ...widgets.faint_label import FaintLabel
from ...widgets.page_layout import splitter
from ...widgets.plot_parts import marker
from ...widgets.theme import is_dark
from .cards import format_reward, rating_colour

MODE_HELP = {
    "group": "Group mode: each answer gets the advantage (rating − mean) / spread. Answers above the "
    "mean are made more likely, answers below it less likely.",
    "weighted": "Weighted mode: ratings are scaled to loss weights in [0, 1] (the worst answer 0, the best "
    "1); the model is trained on each answer in proportion.",
}


# --- diagnostics ------------------------------------------------------------------------------
class WeightBarsWidget(QWidget):
    """One row per answer: its number, a bar for its weight (0..1) or advantage (around 0), the value."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.rows: list[tuple[float | None, float | None, str]] = []  # (weight, rating, state)
        self.kind = "advantage"
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def set_rows(self, rows: Sequence[tuple[float | None, float | None, str]], kind: str) -> None:
        self.rows, self.kind = list(rows), kind
        self.setFixedHeight(self.sizeHint().height())
        self.update()

    def _row_height(self) -> int:
        return QFontMetrics(self.font()).height() + 6

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(220, max(1, len(self.rows)) * self._row_height() + 4)

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        fm = QFontMetrics(self.font())
        rh = self._row_height()
        text_col = self.palette().color(QPalette.Text)
        faint = self.palette().color(QPalette.PlaceholderText)
        name_w = fm.horizontalAdvance("#00") + 6
        value_w = fm.horizontalAdvance("−0.00 ") + 6
        x0, x1 = name_w, self.width() - value_w
        limit = 1.0
        if self.kind == "advantage":
            limit = max([1.0] + [abs(w) for w, _, _ in self.rows if w is not None and math.isfinite(w)])
        zero = (x0 + x1) / 2 if self.kind == "advantage" else x0
        span = (x1 - x0) / 2 if self.kind == "advantage" else (x1 - x0)
        track = self.palette().color(QPalette.Mid)
        track.setAlpha(60)
        for i, (w, rating, state) in enumerate(self.rows):
            y = 2 + i * rh
            p.setPen(text_col)
            p.drawText(QRectF(0, y, name_w, rh), Qt.AlignLeft | Qt.AlignVCenter, f"#{i + 1}")
            p.fillRect(QRectF(x0, y + 3, x1 - x0, rh - 6), track)
            if w is None or not math.isfinite(w):
                p.setPen(faint)
                label = "skipped" if state == "skipped" else "not rated"
                p.drawText(QRectF(x0 + 4, y, x1 - x0, rh), Qt.AlignLeft | Qt.AlignVCenter, label)
                continue
            length = (w / limit) * span
            left = min(zero, zero + length)
            colour = rating_colour(rating if rating is not None else 0.0)
            if self.kind == "advantage":
                colour = QColor("#27ae60") if w > 0 else QColor("#d64541") if w < 0 else QColor("#9aa0a6")
            p.fillRect(QRectF(left, y + 3, max(abs(length), 1.5), rh - 6), colour)
            p.setPen(text_col)
            value = format_reward(w) if self.kind == "advantage" else f"{w:.2f}"
            p.drawText(QRectF(x1, y, value_w, rh), Qt.AlignRight | Qt.AlignVCenter, value)
        if self.kind == "advantage" and self.rows:
            p.setPen(faint)
            p.drawLine(int(zero), 0, int(zero), self.height())
        p.end()


class DiagnosticsWidget(QGroupBox):
    """What the next Apply will do; fed with the session's Preview after every rating."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Before you apply", parent)
        self.counts = QLabel()
        self.counts.setWordWrap(True)
        self.stats = QLabel()
        self.stats.setTextFormat(Qt.RichText)
        self.stats.setWordWrap(True)
        self.mode_help = FaintLabel(wrap=True)
        self.warning = MessageBar()
        self.bars = WeightBarsWidget()
        self.bars_title = QLabel()
        self.bars_title.setWordWrap(True)
        # every label wraps at the panel's width, whatever its text: none may widen the panel
        for label in (self.counts, self.stats, self.mode_help, self.bars_title, self.warning.label):
            label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.warning.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.same: list[list[int]] = []
        self.message = FaintLabel(wrap=True, squeeze=True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.setSpacing(4)
        layout.addWidget(self.counts)
        layout.addWidget(self.stats)
        layout.addWidget(self.warning)
        layout.addWidget(self.bars_title)
        layout.addWidget(self.bars)
        layout.addWidget(self.message)
        layout.addWidget(self.mode_help)
        layout.addStretch(1)
        self.set_empty("group")

    def set_empty(self, mode: str) -> None:
        self.counts.setText("No answers to rate yet.")
        self.same = []
        self.stats.setText("")
        self.stats.hide()
        self.warning.hide()
        self.bars_title.hide()
        self.bars.set_rows([], "advantage" if mode == "group" else "weight")
        self.bars.hide()
        self.message.setText("")
        self.message.hide()
        self.mode_help.setText(MODE_HELP.get(mode, ""))
        self.mode_help.show()

    def set_same_answers(self, groups: Sequence[Sequence[int]], n: int) -> None:
        """Groups of answers (indexes) with the same text; with nothing rated yet, says so at once
        when all `n` answers are one text."""
        self.same = [list(g) for g in groups if len(g) > 1]
        if self.all_same(n):
            self.warning.show_message("warning", self._all_same_text(n))

    def all_same(self, n: int) -> bool:
        return n > 1 and len(self.same) == 1 and len(self.same[0]) == n

    @staticmethod
    def _all_same_text(n: int) -> str:
        return (
            f"<b>No signal:</b> all {n} answers are the same text, so there is nothing to compare and "
            "ratings cannot tell the model which is better. Write a better answer with Edit…, or Generate "
            "again with a higher temperature (Sampling, on the left)."
        )

    def set_preview(self, preview, mode: str, states: Sequence[str], ratings: Sequence[float | None],
                    n_corrected: int = 0) -> None:  # fmt: skip
        n = len(states)
        skipped = sum(s == "skipped" for s in states)
        parts = [f"<b>{preview.n_rated}</b> of {n} rated"]
        if skipped:
            parts.append(f"{skipped} skipped")
        if n_corrected:
            parts.append(f"{n_corrected} better answer{'s' if n_corrected > 1 else ''} written")
        self.counts.setText(" · ".join(parts))
        self.stats.show()
        if preview.n_rated:
            mean = preview.mean if preview.mean is not None else float("nan")
            std = preview.std if preview.std is not None else float("nan")
            self.stats.setText(
                f"Mean reward <b>{format_reward(mean) if math.isfinite(mean) else '–'}</b> · "
                f"spread (std) <b>{std:.2f}</b>"
                if math.isfinite(std)
                else f"Mean reward <b>{format_reward(mean)}</b>"
            )
        else:
            self.stats.setText("Rate the answers: keys 1–5 on a card, thumbs up / down, or the slider.")
        rated = [r for r, st in zip(ratings, states, strict=False) if st == "rated" and r is not None]
        cancelling = [
            g for g in self.same
            if len({ratings[i] for i in g if states[i] == "rated" and ratings[i] is not None}) > 1
        ]  # fmt: skip
        if self.all_same(n) and not n_corrected:
            self.warning.show_message("warning", self._all_same_text(n))
        elif preview.no_signal and len(rated) > 1:
            how = (
                "each answer's advantage is its rating minus the mean: 0 for all"
                if mode == "group"
                else "ratings become weights relative to each other: all the same"
            )
            self.warning.show_message(
                "warning",
                f"<b>No signal:</b> all {len(rated)} rated answers got the same rating "
                f"({format_reward(rated[0])}), and a step learns only from the differences between them "
                f"({how}), so it would teach the model nothing. Rate better answers higher than worse ones, "
                "or write a better answer with Edit….",
            )
        elif cancelling:
            names = "; ".join(" and ".join(str(i + 1) for i in g) for g in cancelling)
            self.warning.show_message(
                "warning",
                f"Answers {names} are the same text but rated differently: their pulls cancel out. Rate "
                "them the same, or skip all but one (key S).",
            )
        else:
            self.warning.hide()
        kind = "advantage" if mode == "group" else "weight"
        weights = list(preview.weights) + [None] * (n - len(preview.weights))
        self.bars_title.setText(
            f"<b>{'Advantage' if kind == 'advantage' else 'Loss weight'}</b> each answer gets:"
        )
        self.bars_title.show()
        self.bars.set_rows([(weights[i], ratings[i], states[i]) for i in range(n)], kind)
        self.bars.show()
        self.message.setText(preview.message or "")
        self.message.setVisible(bool(preview.message))
        self.mode_help.setText(MODE_HELP.get(mode, ""))
        self.mode_help.setVisible(not preview.message)  # the engine's message already says how


# --- history ----------------------------------------------------------------------------------
_ROOT = QModelIndex()


class RoundsModel(QAbstractTableModel):
    """The session's rounds (engine RoundResult) as a table: round, prompt, rated, mean, loss, applied."""

    HEADERS = ("#", "Prompt", "Mean", "Loss", "Applied")
    TIPS = (
        "The round (one Generate)",
        "The round's prompt",
        "Mean reward of the rated answers (how many were rated: in the cell's tooltip)",
        "The objective before the step (weighted cross-entropy, + KL)",
        "The optimizer step it took, or no (no signal: all ratings equal)",
    )

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rounds: list = []

    def set_rounds(self, rounds: Sequence) -> None:
        self.beginResetModel()
        self.rounds = list(rounds)
        self.endResetModel()

    def rowCount(self, parent=_ROOT) -> int:  # noqa: N802 - Qt override
        return 0 if parent.isValid() else len(self.rounds)

    def columnCount(self, parent=_ROOT) -> int:  # noqa: N802 - Qt override
        return 0 if parent.isValid() else len(self.HEADERS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802 - Qt override
        if orientation == Qt.Horizontal and role == roles.DISPLAY:
            return self.HEADERS[section]
        if orientation == Qt.Horizontal and role == roles.TOOLTIP:
            return self.TIPS[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        r = self.rounds[index.row()]
        col = index.column()
        if role == roles.DISPLAY:
            if col == 0:
                return str(r.round)
            if col == 1:
                return " ".join(str(r.prompt).split())
            if col == 2:
                return _num(r.mean_reward, signed=True)
            if col == 3:
                return _num(r.loss)
            if col == 4:
                return f"step {r.step}" if r.applied else "no"
        if role == roles.TOOLTIP and col == 1:
            return str(r.prompt)
        if role == roles.TOOLTIP and col == 2:
            return f"{r.n_rated} answer{'s' if r.n_rated != 1 else ''} rated"
        if role == roles.ALIGNMENT and col in (0, 2, 3):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        if role == roles.FOREGROUND and col == 2 and _finite(r.mean_reward):
            return rating_colour(float(r.mean_reward)).darker(115)
        return None


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _num(x, signed: bool = False) -> str:
    if not _finite(x):
        return "–"
    text = format_reward(float(x)) if signed else f"{float(x):.3f}"
    return text.replace("−0.00", "0.00").replace("-0.000", "0.000")


class RewardHistoryWidget(QGroupBox):
    """Mean reward and loss per round (two plots sharing the round axis) above the rounds table."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("History", parent)
        dark = is_dark(self.palette())
        bg = self.palette().color(QPalette.Base)
        fg = self.palette().color(QPalette.Text)
        self.reward_plot = pg.PlotWidget(background=bg)
        self.loss_plot = pg.PlotWidget(background=bg)
        for plot, title in ((self.reward_plot, "mean reward"), (self.loss_plot, "loss")):
            item = plot.getPlotItem()
            item.setMenuEnabled(False)
            item.showGrid(x=True, y=True, alpha=0.25)
            item.getAxis("left").setWidth(60)
            item.getAxis("left").enableAutoSIPrefix(False)
            for axis in ("left", "bottom"):
                item.getAxis(axis).setTextPen(fg)
                item.getAxis(axis).setPen(pg.mkPen(self.palette().color(QPalette.Mid)))
            item.setLabel("left", title, color=fg.name())  # after setPen, which recolours the label
            plot.setMinimumHeight(90)
            plot.setMouseEnabled(x=False, y=False)
            item.hideButtons()
        self.loss_plot.getPlotItem().setLabel("bottom", "round", color=fg.name())
        self.reward_plot.getPlotItem().getAxis("bottom").setStyle(showValues=False)
        self.loss_plot.setXLink(self.reward_plot)
        self.reward_plot.setYRange(-1.05, 1.05, padding=0)
        zero = pg.InfiniteLine(
            0, angle=0, pen=pg.mkPen(self.palette().color(QPalette.Mid), style=Qt.DashLine)
        )
        self.reward_plot.addItem(zero)
        reward_colour = "#2ecc71" if dark else "#1e8449"
        loss_colour = "#5dade2" if dark else "#1f77b4"
        self.reward_curve = self.reward_plot.plot(
            [], [], pen=pg.mkPen(reward_colour, width=2), **marker(reward_colour)
        )
        self.loss_curve = self.loss_plot.plot(
            [], [], pen=pg.mkPen(loss_colour, width=2), **marker(loss_colour)
        )
        self.model = RoundsModel(self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.Stretch)
        header.setMinimumSectionSize(24)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.setTextElideMode(Qt.ElideRight)
        self.table.verticalHeader().setDefaultSectionSize(QFontMetrics(self.font()).height() + 6)
        self.table.setToolTip("One row per round; Apply adds one.")
        plots = QWidget()
        pl = QVBoxLayout(plots)
        pl.setContentsMargins(0, 0, 0, 0)
        pl.setSpacing(0)
        pl.addWidget(self.reward_plot)
        pl.addWidget(self.loss_plot)
        split = splitter(Qt.Vertical, (plots, self.table), stretch=(3, 2))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(split)
        self.set_rounds([])

    def set_rounds(self, rounds: Sequence) -> None:
        self.model.set_rounds(rounds)
        if rounds:
            self.table.scrollToBottom()
        x_r, y_r, x_l, y_l = [], [], [], []
        for r in rounds:
            if _finite(r.mean_reward):
                x_r.append(r.round)
                y_r.append(float(r.mean_reward))
            if r.applied and _finite(r.loss):
                x_l.append(r.round)
                y_l.append(float(r.loss))
        self.reward_curve.setData(np.asarray(x_r, dtype=float), np.asarray(y_r, dtype=float))
        self.loss_curve.setData(np.asarray(x_l, dtype=float), np.asarray(y_l, dtype=float))
        last = max([r.round for r in rounds], default=1)
        first = min([r.round for r in rounds], default=1)
        self.reward_plot.setXRange(first - 0.5, max(last, first + 3) + 0.5, padding=0)
        if y_l:
            lo, hi = min(y_l), max(y_l)
            pad = max(0.05 * (hi - lo), 0.05 * max(abs(lo), abs(hi)), 1e-3)
            self.loss_plot.setYRange(lo - pad, hi + pad, padding=0)

    def points(self) -> tuple[int, int]:
        """How many points each plot holds: (mean reward, loss)."""
        xr, _ = self.reward_curve.getData()
        xl, _ = self.loss_curve.getData()
        return (0 if xr is None else len(xr), 0 if xl is None else len(xl))


# --- prompts from the dataset -----------------------------------------------------------------
def sample_prompt(sample) -> tuple[str, str | None] | None:
    """(first user message or prompt, system message or None) of an engine Sample; None for text."""
    if getattr(sample, "prompt", None):
        return sample.prompt, None
    system, user = None, None
    for m in getattr(sample, "messages", ()) or ():
        role, content = m.get("role"), m.get("content")
        if not isinstance(content, str):
            continue
        if role == "system" and system is None:
            system = content
        elif role == "user":
            user = content
            break
    return (user, system) if user else None


def dataset_prompts(samples: Sequence) -> list[tuple[str, str | None]]:
    """Distinct (prompt, system) pairs of the samples, in order."""
    seen, out = set(), []
    for s in samples:
        p = sample_prompt(s)
        if p is not None and p not in seen:
            seen.add(p)
            out.append(p)
    return out


class PromptPickerDialog(QDialog):
    """Choose one of the dataset's prompts: type to filter, Enter or double-click to take it."""

    def __init__(self, prompts: Sequence[tuple[str, str | None]], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Prompt from the dataset")
        self.resize(560, 460)
        self.prompts = list(prompts)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText(f"Filter {len(self.prompts)} prompts…")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._filter)
        self.list = QListWidget()
        self.list.setAlternatingRowColors(True)
        for i, (prompt, system) in enumerate(self.prompts):
            item = QListWidgetItem(" ".join(prompt.split()))
            item.setData(Qt.UserRole, i)
            item.setToolTip(prompt + (f"\n\nSystem: {system}" if system else ""))
            self.list.addItem(item)
        if self.list.count():
            self.list.setCurrentRow(0)
        self.list.itemActivated.connect(lambda _: self.accept())
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.filter)
        layout.addWidget(self.list, 1)
        layout.addWidget(buttons)
        self.filter.installEventFilter(self)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt override
        # arrow keys in the filter box move through the list
        if (
            obj is self.filter
            and event.type() == event.Type.KeyPress
            and event.key() in (Qt.Key_Up, Qt.Key_Down)
        ):
            self.list.keyPressEvent(event)
            return True
        return super().eventFilter(obj, event)

    def _filter(self, text: str) -> None:
        words = text.lower().split()
        first = None
        for row in range(self.list.count()):
            item = self.list.item(row)
            hidden = not all(w in item.text().lower() for w in words)
            item.setHidden(hidden)
            if not hidden and first is None:
                first = item
        if first is not None:
            self.list.setCurrentItem(first)

    def chosen(self) -> tuple[str, str | None] | None:
        item = self.list.currentItem()
        if item is None or item.isHidden():
            return None
        return self.prompts[item.data(Qt.UserRole)]


__all__ = [
    "DiagnosticsWidget",
    "PromptPickerDialog",
    "RewardHistoryWidget",
    "RoundsModel",
    "WeightBarsWidget",
    "dataset_prompts",
    "sample_prompt",
]
