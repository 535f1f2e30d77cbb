"""`HeatmapWidget`: a titled heatmap with labelled axes, a caption, a colour bar in the palette's colours
and the value of the cell under the pointer; a placeholder until it has values. The Train page shows
the LoRA norms by layer and kind and the tokens routed to each expert in it; the Targets page the
routing census.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QFontMetrics, QPalette
from PySide6.QtWidgets import (
    QVBoxLayout,
    QWidget,
)

from .plot_parts import axis_ticks, nice_ceil, paint_plot, plot_widget, short_number, style_plot
from .wrapping_label import wrapping_label


class HeatmapWidget(QWidget):
    """An ImageItem in a plot with labelled axes and a colour bar; `set(values, x_labels, y_labels)`.

    The caption under the plot says what is shown (`set_caption`) and, under the mouse, the value of
    the hovered cell. Colour levels only grow to "nice" values, so the bar is not redrawn every time.
    """

    def __init__(self, title: str, x_title: str, y_title: str, unit: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.unit = unit
        self.pw = plot_widget()
        self.plot = style_plot(self.pw, title, y_title, x_title)
        self.plot.showGrid(x=False, y=False)
        self.plot.invertY(True)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.setMenuEnabled(False)
        self.image = pg.ImageItem(axisOrder="col-major")
        self.plot.addItem(self.image)
        self.bar = pg.ColorBarItem(
            values=(0, 1), colorMap=pg.colormap.get("viridis"), width=12, interactive=False
        )
        self.bar.setImageItem(self.image, insert_in=self.plot)
        text = self.pw.palette().color(QPalette.WindowText)
        self.bar.axis.setTextPen(pg.mkPen(text))
        self.bar.axis.setPen(pg.mkPen(text))
        self.bar.axis.setLabel(unit, color=text.name())
        self.bar.axis.enableAutoSIPrefix(False)
        self.caption = wrapping_label(" ")
        self._caption = " "
        self.placeholder = pg.TextItem("", color=text, anchor=(0.5, 0.5))
        self.plot.addItem(self.placeholder)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.pw, 1)
        layout.addWidget(self.caption)
        self.values: np.ndarray | None = None
        self.levels = (0.0, 1.0)
        self.x_labels: list[str] = []
        self.y_labels: list[str] = []
        self.pw.scene().sigMouseMoved.connect(self._mouse_moved)
        self.show_placeholder("no data yet")

    def apply_palette(self, pal: QPalette | None = None) -> None:
        """Recolour for the current palette (the theme changed)."""
        pal = pal or self.palette()
        paint_plot(self.pw, pal)
        text = pal.color(QPalette.WindowText)
        self.bar.axis.setTextPen(pg.mkPen(text))
        self.bar.axis.setPen(pg.mkPen(text))
        self.bar.axis.setLabel(self.unit, color=text.name())
        self.placeholder.setColor(text)

    def set_title(self, title: str, unit: str) -> None:
        """A new title and colour-bar unit (the same cells showing another quantity)."""
        if (self.plot.texts[0], self.unit) == (title, unit):
            return
        self.plot.texts = (title, *self.plot.texts[1:])
        self.unit = unit
        self.apply_palette()

    def show_placeholder(self, text: str) -> None:
        self.values = None
        self.x_labels, self.y_labels = [], []
        self.levels = (0.0, 1.0)
        self.image.clear()
        self.placeholder.setText(text)
        self.placeholder.setPos(0.5, 0.5)
        self.placeholder.show()
        self.plot.getAxis("bottom").setTicks(None)
        self.plot.getAxis("left").setTicks(None)
        self.plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
        self.set_caption(" ")

    def set_caption(self, text: str) -> None:
        self._caption = text
        self.caption.setText(text)

    def set(self, values: np.ndarray, x_labels: list[str], y_labels: list[str]) -> None:
        """values[x, y]: x along the bottom axis (layers), y down the left axis."""
        values = np.asarray(values, dtype=np.float64)
        shape_changed = self.values is None or self.values.shape != values.shape
        self.values = values
        self.placeholder.hide()
        finite = values[np.isfinite(values)]
        hi = float(finite.max()) if finite.size else 1.0
        lo = min(float(finite.min()) if finite.size else 0.0, 0.0)
        old_lo, old_hi = self.levels
        if shape_changed or lo < old_lo or hi > old_hi or hi < 0.3 * old_hi:
            self.levels = (lo, nice_ceil(hi) if hi > lo else lo + 1.0)
            self.bar.setLevels(self.levels)
            # room for the longest tick label plus the axis title (ColorBarItem fixes it to 45 px)
            fm = QFontMetrics(self.bar.axis.style["tickFont"] or self.font())
            longest = max(fm.horizontalAdvance(f"{v:g}") for v in (*self.levels, self.levels[1] * 0.75))
            self.bar.axis.setWidth(longest + fm.height() + 14)
        self.image.setImage(values, autoLevels=False, levels=self.levels)
        if shape_changed or x_labels != self.x_labels or y_labels != self.y_labels:
            self.x_labels, self.y_labels = list(x_labels), list(y_labels)
            nx, ny = values.shape
            self.image.setRect(0, 0, nx, ny)
            self.plot.getAxis("bottom").setTicks([axis_ticks(x_labels, 12)])
            left = self.plot.getAxis("left")
            left.setTicks([axis_ticks(y_labels, 24)])
            # size the axis for its longest label now: pyqtgraph would only widen it after a first
            # paint, and meanwhile drops the labels that do not fit
            widest = max((QFontMetrics(left.style["tickFont"] or self.font()).horizontalAdvance(t)
                          for t in y_labels), default=0)  # fmt: skip
            left.setWidth(widest + 30)
            self.plot.setRange(xRange=(0, nx), yRange=(0, ny), padding=0)

    def _mouse_moved(self, pos) -> None:
        if self.values is None:
            return
        p = self.plot.vb.mapSceneToView(pos)
        i, j = int(np.floor(p.x())), int(np.floor(p.y()))
        nx, ny = self.values.shape
        if self.plot.vb.sceneBoundingRect().contains(pos) and 0 <= i < nx and 0 <= j < ny:
            self.caption.setText(
                f"{self.x_labels[i]} · {self.y_labels[j]}: {short_number(self.values[i, j])} {self.unit}"
            )
        else:
            self.caption.setText(self._caption)
