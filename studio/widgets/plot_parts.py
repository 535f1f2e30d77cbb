"""The parts the plot widgets are made of: series buffers, plot and legend styling that follows the
palette, readable axes, range keeping, markers and the colour cycle.

`Series` is a growing NumPy buffer of (x, y) points; `plot_widget`/`style_plot` make a styled pyqtgraph
plot, `paint_plot`/`paint_legend` colour it from the palette; `ReadableAxisItem` keeps tick labels at a
sane precision and `RangeKeeper` changes a plot's limits rarely (each change re-renders the axis text,
the costliest part of a repaint). Used by the training plots (studio.widgets.plots), the preference
plots and the Rewards page's round plots.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QBrush, QColor, QPalette, QPen
from PySide6.QtWidgets import (
    QGraphicsItem,
)

FLAT_SPAN = 0.1  # a series whose values span less than this fraction of their size is padded to it
COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#7b4173",
)  # fmt: skip


class Series:
    """x/y values in NumPy buffers that double when full; `view()` gives the filled part."""

    def __init__(self, capacity: int = 256):
        self.x = np.empty(capacity)
        self.y = np.empty(capacity)
        self.n = 0

    def append(self, x: float, y: float) -> None:
        if self.n == len(self.x):
            self.x = np.concatenate([self.x, np.empty_like(self.x)])
            self.y = np.concatenate([self.y, np.empty_like(self.y)])
        self.x[self.n] = x
        self.y[self.n] = y
        self.n += 1

    def truncate_after(self, x: float) -> None:
        """Drop the points beyond x (a run resumed from an earlier checkpoint redoes those steps)."""
        self.n = int(np.searchsorted(self.x[: self.n], x, side="right"))

    def clear(self) -> None:
        self.n = 0

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        return self.x[: self.n], self.y[: self.n]

    def __len__(self) -> int:
        return self.n


class ReadableAxisItem(pg.AxisItem):
    """Tick labels with as many digits as the tick spacing needs, in scientific notation when
    they would need more than five decimals ("2.5e-6", not "0.00000250")."""

    def tickStrings(self, values, scale, spacing):  # noqa: N802 - pyqtgraph override
        if self.logMode or not spacing:
            return super().tickStrings(values, scale, spacing)
        step = spacing * scale
        places = max(0, math.ceil(-math.log10(step) - 1e-9))
        biggest = max((abs(v * scale) for v in values), default=0.0)
        if places <= 5 and biggest < 1e6:
            return [f"{v * scale:.{places}f}" for v in values]
        # scientific: the digits that tell neighbouring ticks apart
        digits = max(1, math.floor(math.log10(biggest or step)) - math.floor(math.log10(step)) + 1)
        return [_sci(v * scale, digits) if abs(v * scale) > step * 1e-6 else "0" for v in values]


def _sci(v: float, digits: int) -> str:
    mantissa, exponent = f"{v:.{digits - 1}e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def plot_widget() -> pg.PlotWidget:
    return pg.PlotWidget(axisItems={"left": ReadableAxisItem("left"), "bottom": ReadableAxisItem("bottom")})


def style_plot(pw: pg.PlotWidget, title: str, left: str, bottom: str = "step") -> pg.PlotItem:
    plot = pw.getPlotItem()
    plot.texts = (title, left, bottom)  # kept to recolour them when the palette changes
    for name in ("left", "bottom"):
        axis = plot.getAxis(name)
        axis.enableAutoSIPrefix(False)  # "0.0002", not "200" with "(x1e-06)" in the label
        # An axis draws its grid lines over the whole plot, so every new point repainted it (Python,
        # 2-3 ms a paint, 500 paints in the demo's run); cached as a pixmap, only a new range redraws it.
        axis.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
    paint_plot(pw)
    plot.showGrid(x=True, y=True, alpha=0.2)
    plot.setDownsampling(auto=True, mode="peak")
    plot.setClipToView(True)
    pw.setMinimumSize(120, 90)
    return plot


def paint_plot(pw: pg.PlotWidget, pal: QPalette | None = None) -> None:
    """Background, axes, title and axis labels in the palette's colours (`pal`: the plot's own by
    default; a parent's new palette while a change is still propagating to its children)."""
    pal = pal or pw.palette()
    text = pal.color(QPalette.WindowText)
    pw.setBackground(pal.color(QPalette.Base))
    plot = pw.getPlotItem()
    title, left, bottom = plot.texts
    plot.setTitle(title, color=text.name(), size="9pt")
    for name in ("left", "bottom"):
        axis = plot.getAxis(name)
        axis.setPen(pg.mkPen(text))
        axis.setTextPen(pg.mkPen(text))
    plot.setLabel("left", left, color=text.name())
    plot.setLabel("bottom", bottom, color=text.name())


@functools.cache
def marker_brush(color: str) -> QBrush:
    """One brush per colour: pyqtgraph's symbol atlas keys its pictures by the brush and pen
    objects, so a new brush for every run's first point grew the atlas without end (bench/soak.py app)."""
    return pg.mkBrush(color)


@functools.cache
def marker_pen() -> QPen:
    """The markers' one (empty) pen: `symbolPen=None` made a new pen, so a new atlas key, every run."""
    return pg.mkPen(None)


def marker(color: str, size: int = 7) -> dict:
    """The options of a curve's round markers (`size` pixels across, no outline), as the curves
    with a point per round or evaluation show, and any curve while it has fewer than two points."""
    return {"symbol": "o", "symbolSize": size, "symbolBrush": marker_brush(color), "symbolPen": marker_pen()}


def mark_sparse(curve: pg.PlotDataItem, n: int, color: str) -> None:
    """Markers while a curve has fewer than two points (a line of one point is invisible).
    The symbol's options are set together and the curve restyled once (each of pyqtgraph's
    setSymbol* setters rebuilds the scatter: four rebuilds per curve cost ~1.5 ms)."""
    want = "o" if n < 2 else None
    if curve.opts.get("symbol") != want:
        if want:
            curve.opts.update(marker(color))
        else:
            curve.opts["symbol"] = None
        curve.updateItems(styleUpdate=True)


def make_legend(pw: pg.PlotWidget, offset: tuple[int, int], columns: int = 1) -> pg.LegendItem:
    """A legend with the palette's text colour on a translucent background (readable over curves)."""
    legend = pw.getPlotItem().addLegend(offset=offset, labelTextSize="8pt", colCount=columns)
    paint_legend(legend, pw.palette(), background=True)
    return legend


def paint_legend(legend: pg.LegendItem, pal: QPalette, background: bool) -> None:
    text = pal.color(QPalette.WindowText)
    legend.setLabelTextColor(text)
    for _, label in legend.items:
        label.setText(label.text)  # setLabelTextColor only takes effect on the next setText
    if background:
        base = QColor(pal.color(QPalette.Base))
        base.setAlpha(215)
        legend.setBrush(pg.mkBrush(base))
        border = QColor(text)
        border.setAlpha(60)
        legend.setPen(pg.mkPen(border))


def legend_names(legend: pg.LegendItem) -> list[str]:
    """The labels a legend shows, in order (tests, screenshots)."""
    return [label.text for _, label in legend.items]


def nice_ceil(v: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= v (v > 0): stable colour-bar and axis limits."""
    if not np.isfinite(v) or v <= 0:
        return 1.0
    e = 10.0 ** np.floor(np.log10(v))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * e >= v * (1 - 1e-12):
            return float(m * e)
    return float(10 * e)


class RangeKeeper:
    """Axis limits for a growing curve that change rarely (each change redraws the axis's text):
    x is fixed to [0, total steps] once known; y grows with headroom and shrinks only when the data
    fill less than a third of it. A flat series is padded around its value (FLAT_SPAN), so the ticks
    do not show noise in the tenth digit; with `log_y` the limits are worked out in log10 units."""

    def __init__(self, plot: pg.PlotItem):
        self.plot = plot
        plot.disableAutoRange()
        self.x_hi = 0.0
        self.y: tuple[float, float] | None = None
        self.log_y = False

    def reset(self) -> None:
        self.x_hi = 0.0
        self.y = None

    def set_log(self, log_y: bool) -> None:
        self.log_y = log_y
        self.y = None

    def set_total(self, total: int) -> None:
        if total > 0 and total != self.x_hi:
            self.x_hi = float(total)
            self.plot.setXRange(0, self.x_hi, padding=0.02)

    def fit(self, x: np.ndarray, y: np.ndarray) -> None:
        if not len(x):
            return
        if x[-1] > self.x_hi:  # total unknown (or exceeded): double
            self.x_hi = float(max(10.0, 2 * x[-1]))
            self.plot.setXRange(0, self.x_hi, padding=0.02)
        finite = y[np.isfinite(y)]
        if self.log_y:
            finite = np.log10(finite[finite > 0])
        if not finite.size:
            return
        data_lo, data_hi = float(finite.min()), float(finite.max())
        lo, hi = data_lo, data_hi
        size = max(abs(lo), abs(hi))
        least = FLAT_SPAN * size if size > 0 else 1.0
        if self.log_y:
            least = 0.2  # decades
        if hi - lo < least:  # flat: centre it in a range of at least `least`
            mid = (lo + hi) / 2
            lo, hi = mid - least / 2, mid + least / 2
        span = hi - lo
        if self.y is not None:
            ylo, yhi = self.y
            if ylo <= lo and hi <= yhi and span > (yhi - ylo) / 3:
                return
        head = 0.25 * span
        new_lo = lo - 0.05 * span
        if not self.log_y and data_lo >= 0 and new_lo < 0:  # non-negative data: start at 0 (a sliver below)
            new_lo = -0.03 * (hi + head)
        self.y = (new_lo, hi + head)
        self.plot.setYRange(*self.y, padding=0)


def axis_ticks(labels: list[str], max_labels: int) -> list[tuple[float, str]]:
    every = max(1, int(np.ceil(len(labels) / max_labels)))
    return [(i + 0.5, s) for i, s in enumerate(labels) if i % every == 0]


def short_number(v: float) -> str:
    if not np.isfinite(v):
        return str(v)
    if v == int(v) and abs(v) < 1e9:
        return f"{int(v):,}"
    return f"{v:.4g}"
