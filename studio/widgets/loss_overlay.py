"""Loss curves of several runs in one plot, for the Runs page's comparison.

`LossOverlayWidget.set_runs(runs)` draws each run's training loss (a solid line) and validation
loss (dashed, same colour) from its record (`RunRecord.losses`, `val_losses`), with a legend naming
the runs. Colours follow the order of the runs and are readable on the light and the dark palette.

It draws what it is given; it reads no files and keeps nothing the engine needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from .theme import is_dark

LIGHT_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
DARK_COLOURS = ("#5dade2", "#ff6b6b", "#58d68d", "#c39bd3", "#f5b041", "#48c9b0", "#d7bde2", "#f1948a")


class LossOverlayWidget(QWidget):
    """Training (solid) and validation (dashed) loss of the given runs over their steps."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        pal = self.palette()
        text = pal.color(QPalette.WindowText)
        self.plot = pg.PlotWidget(background=pal.color(QPalette.Base))
        item = self.plot.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.showGrid(x=True, y=True, alpha=0.2)
        item.setLabel("left", "loss (mean cross-entropy)", color=text.name())
        item.setLabel("bottom", "step", color=text.name())
        for name in ("left", "bottom"):
            axis = item.getAxis(name)
            axis.setPen(pg.mkPen(text))
            axis.setTextPen(pg.mkPen(text))
            axis.enableAutoSIPrefix(False)
        base = QColor(pal.color(QPalette.Base))
        base.setAlpha(215)
        self.legend = item.addLegend(
            offset=(-8, 8), labelTextSize="8pt", labelTextColor=text, brush=pg.mkBrush(base)
        )
        self.plot.setMinimumHeight(90)
        self.hint = QLabel()
        self.hint.setWordWrap(True)
        self.hint.setAlignment(Qt.AlignCenter)
        self.hint.setStyleSheet(f"QLabel {{ color: {pal.color(QPalette.PlaceholderText).name()}; }}")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.hint)
        self.curves: dict[str, pg.PlotDataItem] = {}  # "<run name>" and "<run name> (validation)"
        self.set_runs([])

    def colours(self) -> tuple[str, ...]:
        return DARK_COLOURS if is_dark(self.palette()) else LIGHT_COLOURS

    def set_runs(self, runs: Sequence) -> None:
        """Draw these runs (RunRecord: name, losses, val_losses); an empty list clears the plot."""
        item = self.plot.getPlotItem()
        for curve in self.curves.values():
            item.removeItem(curve)
        self.legend.clear()
        self.curves = {}
        colours = self.colours()
        drawn = 0
        for i, run in enumerate(runs):
            colour = colours[i % len(colours)]
            for points, suffix, style in ((run.losses, "", Qt.SolidLine),
                                          (run.val_losses, " (validation)", Qt.DashLine)):  # fmt: skip
                if not points:
                    continue
                xy = np.asarray(points, dtype=float).reshape(-1, 2)
                name = f"{run.name}{suffix}"
                curve = self.plot.plot(
                    xy[:, 0], xy[:, 1], pen=pg.mkPen(colour, width=2, style=style), name=name
                )
                self.curves[name] = curve
                drawn += 1
        if not runs:
            self.hint.setText("Select runs in the table (Ctrl or Shift for several) to compare their loss.")
        elif not drawn:
            self.hint.setText("The selected runs have no loss recorded yet.")
        else:
            self.hint.setText("")
        self.hint.setVisible(bool(self.hint.text()))
        item.enableAutoRange()

    def points(self) -> dict[str, int]:
        """How many points each curve holds, by name (tests)."""
        out = {}
        for name, curve in self.curves.items():
            x, _ = curve.getData()
            out[name] = 0 if x is None else len(x)
        return out


__all__ = ["LossOverlayWidget"]
