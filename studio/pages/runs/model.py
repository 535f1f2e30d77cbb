"""The runs table's Qt model: one row per run record (engine `RunRecord`), newest first.

`RunsModel` shows what `engine.find_runs` read: name, model, dataset, targets, steps done of
planned, final and best loss, status and adapter. Runs of a model other than the open one are
marked (`set_model`). It holds the records it was given and reads nothing itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QColor, QFont, QPalette
from PySide6.QtWidgets import QApplication

from engine import RunRecord

from ...widgets import roles
from ...widgets.runs import has_adapter, model_name, same_model, status_text
from ...widgets.theme import is_dark

COLUMNS = ("Run", "Status", "Steps", "Final loss", "Best loss", "Model", "Dataset", "Targets", "Adapter")
TIPS = (
    "The run's name (training: the dataset and the time it started; rating rounds: when they began)",
    "finished, stopped at step N, failed (with why), paused or running",
    "Optimizer steps done / planned",
    "Mean cross-entropy of the last step",
    "Lowest mean cross-entropy of any step (validation loss in the tooltip, when measured)",
    "The base model it trained (marked when it is not the open model)",
    "What it trained on (rating rounds: the ratings file)",
    "The adapted tensor kinds, how many tensors, and the rank",
    "The adapter file it wrote (the tooltip has the folder and its checkpoints)",
)
RUN, STATUS, STEPS, FINAL, BEST, MODEL, DATASET, TARGETS, ADAPTER = range(len(COLUMNS))
STATUS_COLOURS = {  # light, dark
    "finished": ("#1e7a34", "#7dcea0"),
    "stopped": ("#9a5b00", "#f5c26b"),
    "failed": ("#b03a2e", "#ff8a80"),
    "paused": ("#1b4f72", "#8fc1ff"),
    "running": ("#1b4f72", "#8fc1ff"),
}
_ROOT = QModelIndex()


def _loss(x: float | None) -> str:
    return f"{x:.4f}" if isinstance(x, (int, float)) else "–"


class RunsModel(QAbstractTableModel):
    """Run records as a table; see the module docstring."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.runs: list[RunRecord] = []
        self.model_path: str | None = None

    def set_runs(self, runs: Sequence[RunRecord]) -> None:
        self.beginResetModel()
        self.runs = list(runs)
        self.endResetModel()

    def set_model(self, path: str | None) -> None:
        self.model_path = path
        if self.runs:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self.runs) - 1, len(COLUMNS) - 1))

    def other_model(self, run: RunRecord) -> bool:
        return not same_model(run, self.model_path)

    def rowCount(self, parent=_ROOT) -> int:  # noqa: N802 - Qt override
        return 0 if parent.isValid() else len(self.runs)

    def columnCount(self, parent=_ROOT) -> int:  # noqa: N802 - Qt override
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802 - Qt override
        if orientation == Qt.Horizontal and 0 <= section < len(COLUMNS):
            if role == roles.DISPLAY:
                return COLUMNS[section]
            if role == roles.TOOLTIP:
                return TIPS[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid() or not (0 <= index.row() < len(self.runs)):
            return None
        r = self.runs[index.row()]
        col = index.column()
        if role == roles.DISPLAY:
            return self._text(r, col)
        if role == roles.TOOLTIP:
            return self._tip(r, col)
        if role == roles.USER:
            return r
        if role == roles.ALIGNMENT and col in (STEPS, FINAL, BEST):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        if role == roles.FOREGROUND:
            dark = is_dark(QApplication.palette())
            if col == STATUS and r.status in STATUS_COLOURS:
                return QColor(STATUS_COLOURS[r.status][1 if dark else 0])
            if (col == MODEL and self.other_model(r)) or (col == ADAPTER and not has_adapter(r)):
                return QApplication.palette().color(QPalette.PlaceholderText)
        if role == roles.FONT and col == MODEL and self.other_model(r):
            font = QFont()
            font.setItalic(True)
            return font
        return None

    def _text(self, r: RunRecord, col: int) -> str:
        if col == RUN:
            return r.name
        if col == MODEL:
            return ("other model: " if self.other_model(r) else "") + model_name(r.model)
        if col == DATASET:
            return os.path.basename(r.dataset) if os.path.sep in r.dataset else r.dataset
        if col == TARGETS:
            kinds = ", ".join(r.targets) if r.targets else "–"
            return f"{kinds} ({r.n_targets}, r{r.rank})" if r.n_targets else kinds
        if col == STEPS:
            return f"{r.steps_done}/{r.steps_planned or '?'}"
        if col == FINAL:
            return _loss(r.final_loss)
        if col == BEST:
            return _loss(r.best_loss)
        if col == STATUS:
            return status_text(r)
        if col == ADAPTER:
            if not r.adapter:
                return "–"
            return os.path.basename(r.adapter) + ("" if has_adapter(r) else " (not written)")
        return ""

    def _tip(self, r: RunRecord, col: int) -> str:
        if col == RUN:
            kind = "rating rounds (Rewards page)" if r.kind == "rewards" else "training run"
            return f"{r.name}: {kind}\nStarted {r.started}\nUpdated {r.updated}\nRecord: {r.path}"
        if col == MODEL:
            other = "\nNot the open model: open this model to chat with or export the run"
            return r.model + (other if self.other_model(r) else "")
        if col == DATASET:
            return r.dataset
        if col == TARGETS:
            return f"{', '.join(r.targets)}\n{r.n_targets} tensors, rank {r.rank}, alpha {r.alpha:g}"
        if col == BEST:
            return (
                f"best validation loss {r.best_val_loss:.4f}" if r.best_val_loss is not None else TIPS[BEST]
            )
        if col == STATUS:
            return r.message or status_text(r)
        if col == ADAPTER:
            parts = [r.adapter or "no adapter file named"]
            if r.checkpoints:
                parts.append(f"Checkpoints: {r.checkpoints}")
            if r.last_checkpoint:
                parts.append(f"Last checkpoint: {r.last_checkpoint}")
            return "\n".join(parts)
        return self._text(r, col)


__all__ = ["COLUMNS", "RunsModel"]
