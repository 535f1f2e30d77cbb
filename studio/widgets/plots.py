"""Live training plots for the Train page, fed by engine events and redrawn from a timer.

`TrainPlotsWidget.add_event(event)` only appends to growing NumPy buffers (cheap, so a flood of
events from a fast run never stalls the UI thread); a QTimer at 20 Hz redraws what changed since
the last tick with `setData` on curves created once, one plot per tick, with axis limits that change
rarely (every change of limits re-renders an axis's text, the costliest part of a repaint).

Plots: training loss (mean cross-entropy) and validation loss, learning rate, gradient norm,
tokens/s, LoRA ‖ΔW‖ per tensor kind, a layers × kinds heatmap of the latest ‖ΔW‖ of each adapted
tensor, and for MoE models a layers × experts heatmap of the tokens routed to each expert (summed
since the run started, or the latest step only).

Readability: a curve with fewer than two points is drawn as markers (a line of one point is
invisible); the y range of a flat or nearly flat series is padded around it (at least ±5 % of its
value), so ticks keep a sane precision (`ReadableAxisItem`); "validation" is in the loss legend
only once the run has a validation split; the training loss is drawn smoothed by an exponential
moving average (`SMOOTHING`: off, light (default), medium, strong; debiased, as TensorBoard's),
with the raw points kept as a faint line, and can be shown on a log scale. Before the first run a
placeholder says what to do (`show_placeholder`). Colours follow the palette, also when the theme
changes while the app runs.

Made of: studio.widgets.plot_layout (the panels, tabs and controls, and where they sit),
studio.widgets.plot_parts (series buffers, styled plots and legends, axes and ranges),
studio.widgets.heatmap (the two heatmaps) and studio.widgets.redraws (which panels a tick draws).
It draws; it does not run training or keep anything the engine needs.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QTimer, Signal
from PySide6.QtWidgets import (
    QWidget,
)

from engine import Eval, ExpertUsage, LoraNorms, Started, Step, split_name

from .plot_layout import DEFAULT_SMOOTHING, SMOOTHING, setup_ui
from .plot_parts import (
    COLORS,
    Series,
    legend_names,
    mark_sparse,
    marker,
    paint_legend,
    paint_plot,
)
from .redraws import PanelRedraws

REDRAW_HZ = 20
# new LoRA-norm curves (and legend entries) made per timer tick: one costs 4-8 ms of CPU, 10-12 ms
# with the engine running, and a run adapting 7-14 tensor kinds made them all in one tick (35-75 ms);
# two per tick still made the longest timer tick of a run (17-30 ms), one makes 10-12 ms
NEW_CURVES_PER_TICK = 1
NORMS_LEGEND_UNDER_MIN_HEIGHT = 300  # a shorter LoRA-norm plot has its legend over the plot, not under it
# tensor kinds in the order people read a block: attention, then the feed-forward parts
KIND_ORDER = (
    "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output",
    "ffn_gate_inp", "ffn_gate", "ffn_up", "ffn_down",
    "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
    "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
)  # fmt: skip


def short_kind(kind: str) -> str:
    """ "attn_q.weight" -> "attn_q" (the legend and axis labels)."""
    return kind[: -len(".weight")] if kind.endswith(".weight") else kind


def kind_sort_key(kind: str) -> tuple[int, str]:
    k = short_kind(kind)
    return (KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER), k)


def ema(
    y: np.ndarray, weight: float, state: tuple[float, int] = (0.0, 0)
) -> tuple[np.ndarray, tuple[float, int]]:
    """Debiased exponential moving average of `y` continuing from `state` (the biased average and
    the finite points seen); NaN stays NaN. Returns the smoothed values and the new state."""
    out = np.empty(len(y))
    last, n = state
    if weight <= 0.0:
        return np.asarray(y, dtype=np.float64).copy(), state
    for i, v in enumerate(np.asarray(y, dtype=np.float64).tolist()):
        if v != v or v in (math.inf, -math.inf):
            out[i] = v
            continue
        n += 1
        last = weight * last + (1.0 - weight) * v
        out[i] = last / (1.0 - weight**n)
    return out, (last, n)


class TrainPlotsWidget(QWidget):
    """All the live plots of a run, in two tabs: Curves, and Layers (& experts for MoE models),
    behind a placeholder until the first run starts.

    Drawing is split into panels (loss, lr, grad_norm, tokens_per_s, norms, norm_map, experts);
    `add_event` marks panels dirty, and each timer tick (20 Hz) draws what `redraws`
    (studio.widgets.redraws) gives it: one dirty visible panel a tick, round robin. `flush()` draws all.
    For the same reason the panels appear one per tick when the plots first replace the placeholder,
    when a new run empties them and when they are shown again during a run, and a tick makes at most
    NEW_CURVES_PER_TICK new LoRA-norm curves.
    """

    PANELS = ("loss", "norms", "lr", "grad_norm", "tokens_per_s", "norm_map", "experts")
    CURVE_PANELS = PANELS[:5]  # the Curves tab's
    sig_link_activated = Signal(str)  # a link in the placeholder ("page:Dataset")

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.n_layers: int | None = None  # from the model info, when known
        self.n_experts = 0
        self.total_steps = 0
        self._draining = False
        self.step_series = {k: Series() for k in ("loss", "lr", "grad_norm", "tokens_per_s")}
        self.val_series = Series()
        self.aux_series = Series()  # the MoE load-balancing loss per step (router_aux_coef), on the loss plot
        self.census = None  # the base model's routing census (engine.Census), to compare the run's with
        self.kind_series: dict[str, Series] = {}
        self.kind_curves: dict[str, pg.PlotDataItem] = {}
        self.latest_norms: LoraNorms | None = None
        self.expert_total: np.ndarray | None = None
        self.expert_latest: np.ndarray | None = None
        self.expert_steps = (0, 0)  # first and last step summed into expert_total
        self.has_validation = False
        self.smoothing = DEFAULT_SMOOTHING
        self._smooth = Series()  # the EMA of the training loss, as far as it was computed
        self._smooth_state: tuple[float, int] = (0.0, 0)
        self.redraws = PanelRedraws(self.PANELS)
        self._unrevealed: list[QWidget] = []  # curve panels to show again, one per tick
        self.curves_tab: QWidget | None = None

        setup_ui(self)
        self.timer = QTimer(self)
        self.timer.setInterval(int(1000 / REDRAW_HZ))
        self.timer.timeout.connect(self.redraw)
        self.panel_draws = 0  # panels drawn so far (tests, diagnostics)
        self.set_moe(0)

    # --- placeholder ------------------------------------------------------------------------
    def show_placeholder(self, html: str) -> None:
        """Show `html` (links emit sig_link_activated) instead of the plots."""
        self.placeholder.setText(html)
        self.stack.setCurrentWidget(self.placeholder)

    def show_plots(self) -> None:
        self.stack.setCurrentWidget(self.tabs)

    @property
    def placeholder_shown(self) -> bool:
        return self.stack.currentWidget() is self.placeholder

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if watched is self.norms_pw and event.type() == QEvent.Resize:
            self._fit_norms_legend()
        elif watched is self.curves_tab and event.type() == QEvent.Show and self.timer.isActive():
            self._reveal_gradually()  # the Train page or the Curves tab came back during a run
        return super().eventFilter(watched, event)

    def _fit_norms_legend(self) -> None:
        """Fit the legend of the LoRA-norm curves to the plot's size: under the plot, in as many
        columns as its width takes (1 to 4); over the plot's top left corner, on a translucent
        background, when the plot is too short to give a legend of its own rows (a 1024x640 window),
        so that the curves keep their height and no entry is cut."""
        pw, legend = self.norms_pw, self.norms_legend
        width, short = pw.width(), pw.height() < NORMS_LEGEND_UNDER_MIN_HEIGHT
        size = "7pt" if width < 420 or short else "8pt"
        if legend.opts["labelTextSize"] != size:
            legend.setLabelTextSize(size)
            for _, label in legend.items:
                label.setText(label.text, size=size)
        if short != self.norms_legend_over:
            self.norms_legend_over = short
            if short:
                self.norms_plot.layout.removeItem(legend)
                legend.setParentItem(self.norms_plot.vb)  # its top left corner stays at the view's
            else:
                legend.setParentItem(self.norms_plot)
                self.norms_plot.layout.addItem(legend, 5, 1)
            paint_legend(legend, pw.palette(), background=short)
            if not short:
                legend.setBrush(pg.mkBrush(None))
                legend.setPen(pg.mkPen(None))
        widest = max((label.item.boundingRect().width() for _, label in legend.items), default=60.0)
        per_column = widest + 20 + 10  # the sample, the spacing
        room = (width - 80) if short else width - 24  # over the plot: not over its axis
        columns = max(1, min(4, int(room // per_column)))
        if columns != legend.columnCount:
            legend.setColumnCount(columns)
        else:
            legend.updateSize()
        if short:
            legend.setPos(4, 2)  # (updateSize puts it at the parent's origin)

    # --- palette ----------------------------------------------------------------------------
    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.type() == QEvent.PaletteChange:
            self.apply_palette()
        super().changeEvent(event)

    def apply_palette(self) -> None:
        """Recolour every plot, legend and heatmap for the current palette (the theme changed).
        Called on this widget's PaletteChange, before its children have the new palette: they are
        painted with this widget's."""
        pal = self.palette()
        for pw in (self.loss_pw, self.lr_pw, self.gn_pw, self.tps_pw, self.norms_pw):
            paint_plot(pw, pal)
        paint_legend(self.loss_legend, pal, background=True)
        paint_legend(self.norms_legend, pal, background=self.norms_legend_over)
        self.norm_map.apply_palette(pal)
        self.expert_map.apply_palette(pal)

    # --- model ------------------------------------------------------------------------------
    def set_model_shape(self, n_layers: int | None, n_experts: int) -> None:
        self.n_layers = n_layers
        self.set_moe(n_experts)

    def set_moe(self, n_experts: int) -> None:
        """Show the expert heatmap for MoE models (n_experts > 0); dense models have none."""
        self.n_experts = n_experts
        if n_experts and self.expert_total is None:
            self.expert_map.show_placeholder("no routing data yet")
        self.expert_panel.setVisible(bool(n_experts))
        self.tabs.setTabText(1, "Layers && experts" if n_experts else "Layers")

    def set_total_steps(self, total: int) -> None:
        """Fix the step axes to [0, total] (they then never rescale during the run)."""
        self.total_steps = total
        for keeper in self.ranges.values():
            keeper.set_total(total)

    def set_validation(self, on: bool) -> None:
        """Name the validation curve in the legend (the run has a validation split) or not."""
        if on == self.has_validation:
            return
        self.has_validation = on
        if on:
            self.loss_legend.addItem(self.val_curve, "validation")
            paint_legend(self.loss_legend, self.loss_pw.palette(), background=True)
        else:
            self.loss_legend.removeItem(self.val_curve)

    # --- loss display -----------------------------------------------------------------------
    def set_smoothing(self, name: str) -> None:
        """EMA smoothing of the training loss: a key of SMOOTHING."""
        if name not in SMOOTHING:
            raise ValueError(f"smoothing must be one of {', '.join(SMOOTHING)}, got {name!r}")
        self.smoothing = name
        i = self.smoothing_combo.findData(name)
        if self.smoothing_combo.currentIndex() != i:
            self.smoothing_combo.setCurrentIndex(i)
        self._smooth.clear()
        self._smooth_state = (0.0, 0)
        self.redraws.mark(("loss",))
        self.redraw(everything=True)

    def set_loss_title(self, title: str) -> None:
        """The loss plot's title ("Loss (mean cross-entropy)"; a preference run's objective)."""
        plot = self.loss_plot
        plot.texts = (title, *plot.texts[1:])
        paint_plot(self.loss_pw)

    def set_log_loss(self, on: bool) -> None:
        """The loss on a log10 axis."""
        if self.log_box.isChecked() != on:
            self.log_box.setChecked(on)
        self.loss_plot.setLogMode(y=on)
        self.ranges["loss"].set_log(on)
        self.redraws.mark(("loss",))
        self.redraw(everything=True)

    def smoothed_loss(self) -> tuple[np.ndarray, np.ndarray]:
        """(steps, smoothed training loss) as far as the raw series goes."""
        x, y = self.step_series["loss"].view()
        if self._smooth.n > len(x):  # the series was cut (a resume): start again
            self._smooth.clear()
            self._smooth_state = (0.0, 0)
        done = self._smooth.n
        if done < len(x):
            values, self._smooth_state = ema(y[done:], SMOOTHING[self.smoothing], self._smooth_state)
            for xi, vi in zip(x[done:], values, strict=True):
                self._smooth.append(xi, vi)
        return self._smooth.view()

    # --- data -------------------------------------------------------------------------------
    def clear(self) -> None:
        for s in self.step_series.values():
            s.clear()
        self.val_series.clear()
        self.aux_series.clear()
        self.loss_legend.removeItem(self.aux_curve)
        for s in self.kind_series.values():
            s.clear()
        for keeper in self.ranges.values():
            keeper.reset()
        self._smooth.clear()
        self._smooth_state = (0.0, 0)
        self.latest_norms = None
        self.expert_total = self.expert_latest = None
        self.expert_steps = (0, 0)
        self.total_steps = 0
        self.set_validation(False)
        self.norm_map.show_placeholder("no data yet")
        self.set_moe(self.n_experts)
        self.redraws.dirty = {"loss", "lr", "grad_norm", "tokens_per_s", "norms"}
        self.redraw(everything=True)  # the previous run's curves go at once ...
        # ... but the emptied panels come back one per tick: all five repainted in one event-loop
        # pass stalled the UI for 50-60 ms as the next run started
        self._reveal_gradually()
        if not self.timer.isActive():
            self.stop()

    def truncate_after(self, step: int) -> None:
        """A run resuming at `step`: forget later points of an earlier attempt."""
        for s in (*self.step_series.values(), self.val_series, self.aux_series, *self.kind_series.values()):
            s.truncate_after(step)
        self._smooth.clear()
        self._smooth_state = (0.0, 0)
        self.redraws.mark({"loss", "lr", "grad_norm", "tokens_per_s", "norms"})

    def add_history(self, losses, val_losses=()) -> None:
        """The loss curve a run drew before this window saw it ([step, loss] pairs of its record): a
        resumed run shows its whole curve, not only the steps after the checkpoint."""
        for step, loss in losses:
            self.step_series["loss"].append(step, loss)
        for step, loss in val_losses:
            self.val_series.append(step, loss)
        if val_losses:
            self.set_validation(True)
        self.redraws.mark(("loss",))

    def add_event(self, event: object) -> None:
        """Buffer one engine event (cheap); the timer draws it."""
        if isinstance(event, Step):
            s = self.step_series
            if event.router_aux is not None:
                self.aux_series.append(event.step, event.router_aux)
            s["loss"].append(event.step, event.mean_ce)
            s["lr"].append(event.step, event.lr)
            s["grad_norm"].append(event.step, event.grad_norm)
            s["tokens_per_s"].append(event.step, event.tokens_per_s)
            self.redraws.mark({"loss", "lr", "grad_norm", "tokens_per_s"})
        elif isinstance(event, LoraNorms):
            for kind, value in event.by_kind.items():
                series = self.kind_series.get(kind)
                if series is None:
                    series = self.kind_series[kind] = Series()
                series.append(event.step, value)
            self.latest_norms = event
            self.redraws.mark({"norms", "norm_map"})
        elif isinstance(event, ExpertUsage):
            counts = np.asarray(event.counts, dtype=np.float64)
            self.expert_latest = counts
            if self.expert_total is None or self.expert_total.shape != counts.shape:
                self.expert_total = counts.copy()
                self.expert_steps = (event.step, event.step)
            else:
                self.expert_total += counts
                self.expert_steps = (self.expert_steps[0], event.step)
            if not self.n_experts:
                self.set_moe(counts.shape[1])
            self.redraws.mark(("experts",))
        elif isinstance(event, Eval):
            self.val_series.append(event.step, event.mean_ce)
            self.set_validation(True)
            self.redraws.mark(("loss",))
        elif isinstance(event, Started):
            self.truncate_after(event.plan.start_step)
            self.set_total_steps(event.plan.total_steps)
            self.set_validation(event.plan.n_val > 0)

    # --- drawing ----------------------------------------------------------------------------
    def start(self) -> None:
        if self.placeholder_shown:
            self._reveal_gradually()
        self._draining = False
        self.show_plots()
        self.timer.start()

    def _reveal_gradually(self) -> None:
        """Hide the curve panels and show them again one per timer tick (the plots replace the
        placeholder, a new run empties them, or they are shown again during a run). A panel's
        first paint costs 10-25 ms; all five in one event-loop pass stalled the UI for 80-100 ms at
        Start. Hidden panels keep their place in the layout, so nothing moves as they appear."""
        self._unrevealed = []
        if not self.isVisible():
            return  # nothing is painted now: nothing to spread
        for panel in self.CURVE_PANELS:
            w = self.panel_widgets[panel]
            w.hide()
            self._unrevealed.append(w)

    def _reveal_all(self) -> None:
        while self._unrevealed:
            self._unrevealed.pop(0).show()

    def stop(self) -> None:
        """The run ended: keep ticking until every dirty panel is drawn, then stop the timer."""
        self._draining = True
        if not self.timer.isActive():
            self.timer.start()

    def pending(self) -> set[str]:
        """Panels with data not drawn yet."""
        return set(self.redraws.dirty)

    def flush(self) -> None:
        """Draw every dirty panel now and show every panel (screenshots, tests)."""
        self._reveal_all()
        self.redraw(everything=True)

    def redraw(self, everything: bool = False, visible_only: bool = False) -> None:
        """Draw dirty panels: what `redraws.take` gives (a tick: the dirty hidden panels and one dirty
        visible one, round robin; everything=True: all dirty panels, visible_only: the visible ones).
        While panels wait to be revealed (start), a tick shows one of them instead."""
        if self._unrevealed and not everything:
            self._unrevealed.pop(0).show()
            return
        if not self.redraws.dirty:
            if self._draining:
                self.timer.stop()
            return
        visible = lambda panel: self.panel_widgets[panel].isVisible()  # noqa: E731
        for panel in self.redraws.take(visible, everything=everything, visible_only=visible_only):
            self._draw(panel, new_curves=None if everything else NEW_CURVES_PER_TICK)
            self.panel_draws += 1

    def _draw(self, panel: str, new_curves: int | None = None) -> None:
        """Give `panel` its data. new_curves: at most this many new LoRA-norm curves now (the panel
        stays dirty for the rest); None: all."""
        if panel in self.step_curves:
            x, y = self.step_series[panel].view()
            if panel == "loss":
                sx, sy = self.smoothed_loss()
                smoothing = SMOOTHING[self.smoothing] > 0
                self.train_curve.setData(sx, sy)
                self.train_raw_curve.setData(x, y)
                self.train_raw_curve.setVisible(smoothing)
                mark_sparse(self.train_curve, len(x), COLORS[0])
                vx, vy = self.val_series.view()
                self.val_curve.setData(vx, vy)
                if len(vy):
                    y = np.concatenate([y, vy])
                ax, ay = self.aux_series.view()
                self.aux_curve.setData(ax, ay)
                if len(ay):
                    if "load-balancing loss" not in legend_names(self.loss_legend):
                        self.loss_legend.addItem(self.aux_curve, "load-balancing loss")
                    y = np.concatenate([y, ay])
            else:
                self.step_curves[panel].setData(x, y)
                curve, color = self.marked_curves[panel]
                mark_sparse(curve, len(x), color)
            self.ranges[panel].fit(x, y)
        elif panel == "norms":
            ys = []
            added = 0
            for kind in sorted(self.kind_series, key=kind_sort_key):
                curve = self.kind_curves.get(kind)
                if curve is None:
                    if new_curves is not None and added >= new_curves:
                        self.redraws.mark(("norms",))  # the next tick makes the next ones
                        continue
                    color = self.kind_colors[kind] = COLORS[len(self.kind_curves) % len(COLORS)]
                    x, y = self.kind_series[kind].view()
                    # made with its final data and markers: restyling a new curve rebuilds it
                    curve = self.norms_plot.plot(
                        x,
                        y,
                        name=short_kind(kind),
                        pen=pg.mkPen(color, width=1.5),
                        **(marker(color) if len(x) < 2 else {}),
                    )
                    self.kind_curves[kind] = curve
                    added += 1
                    ys.append(y)
                    continue
                x, y = self.kind_series[kind].view()
                curve.setData(x, y)
                mark_sparse(curve, len(x), self.kind_colors[kind])
                ys.append(y)
            if added:
                paint_legend(self.norms_legend, self.norms_pw.palette(), background=self.norms_legend_over)
                self._fit_norms_legend()
            if ys:
                self.ranges["norms"].fit(x, np.concatenate(ys))
        elif panel == "norm_map" and self.latest_norms is not None:
            values, layers, kinds = self.norm_grid()
            if values.size:
                self.norm_map.set(values, layers, kinds)
                self.norm_map.set_caption(
                    f"Step {self.latest_norms.step}: ‖ΔW‖_F of each adapted tensor in the layers "
                    "(hover a cell for its value)"
                )
        elif panel == "experts":
            self._draw_experts()

    def norm_grid(self) -> tuple[np.ndarray, list[str], list[str]]:
        """(values (L, n_kinds), layer labels, kind labels) of the latest LoraNorms; NaN where a
        tensor is not adapted. Tensors outside the layers (token_embd, output) are not in the grid."""
        per = {}
        for name, value in self.latest_norms.per_tensor.items():
            layer, kind = split_name(name)
            if layer is not None:
                per[(layer, kind)] = value
        if not per:
            return np.zeros((0, 0)), [], []
        kinds = sorted({k for _, k in per}, key=kind_sort_key)
        n_layers = max(self.n_layers or 0, max(layer for layer, _ in per) + 1)
        values = np.full((n_layers, len(kinds)), np.nan)
        for (layer, kind), v in per.items():
            values[layer, kinds.index(kind)] = v
        return values, [str(i) for i in range(n_layers)], [short_kind(k) for k in kinds]

    def expert_values(self) -> np.ndarray | None:
        """The (L, E) array the expert heatmap shows: the sum since the start, or the latest step."""
        return self.expert_latest if self.expert_latest_box.isChecked() else self.expert_total

    def set_census(self, census) -> None:
        """The base model's routing census of the dataset (an engine.Census; None: none) to compare the
        run's routing with."""
        self.census = census
        self.expert_census_box.setEnabled(census is not None)
        if census is None:
            self.expert_census_box.setChecked(False)
        self._draw_experts()

    def census_difference(self) -> np.ndarray | None:
        """(MoE layers, E): each expert's share of its layer's token-choices in the run (as the heatmap's
        mode shows: summed or the latest step) minus its share in the census, in percentage points; None
        without a census, run counts, or when their shapes disagree."""
        values, c = self.expert_values(), self.census
        if values is None or c is None or values.shape[1] != c.n_experts or max(c.layers) >= values.shape[0]:
            return None
        run = values[list(c.layers)]
        share = run / np.maximum(run.sum(axis=1, keepdims=True), 1)
        return 100.0 * (share - c.shares())

    def _draw_experts(self) -> None:
        values = self.expert_values()
        if values is None:
            return
        first, last = self.expert_steps
        span = f"step {last}" if self.expert_latest_box.isChecked() else f"steps {first}–{last}"
        diff = self.census_difference() if self.expert_census_box.isChecked() else None
        if diff is not None:
            self.expert_map.set_title("Share of tokens: run minus the base model's census", "pp")
            E = diff.shape[1]
            self.expert_map.set(diff, [str(i) for i in self.census.layers], [str(e) for e in range(E)])
            self.expert_map.set_caption(
                f"Share of each layer's tokens, {span} minus the base model's census, in percentage points "
                "(hover a cell for its value)"
            )
            return
        self.expert_map.set_title("Tokens routed to each expert", "tokens")
        L, E = values.shape
        self.expert_map.set(values, [str(i) for i in range(L)], [str(e) for e in range(E)])
        if self.expert_latest_box.isChecked():
            what = f"Tokens routed to each expert during step {last}"
        else:
            what = f"Tokens routed to each expert, summed over steps {first}–{last}"
        self.expert_map.set_caption(f"{what} (hover a cell for its count)")

    def _tab_changed(self, _index: int) -> None:
        self.loss_options.setVisible(self.tabs.currentIndex() == 0)
        if not self.timer.isActive():  # no run: draw the newly shown panels now
            self.redraw(everything=True, visible_only=True)

    def _expert_mode_changed(self) -> None:
        self._draw_experts()

    # --- reading back (tests, screenshots) --------------------------------------------------
    def curve_data(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The full data each curve was given (before clipping and downsampling), by name:
        loss (raw), loss_smoothed, lr, grad_norm, tokens_per_s, val, router_aux (the load-balancing
        loss), and norm:<kind> per tensor kind."""
        curves = {**self.step_curves, "loss_smoothed": self.train_curve, "val": self.val_curve,
                  "router_aux": self.aux_curve}  # fmt: skip
        curves.update({f"norm:{short_kind(k)}": c for k, c in self.kind_curves.items()})
        out = {}
        for name, c in curves.items():
            x, y = c.getOriginalDataset()
            out[name] = (np.array(x if x is not None else []), np.array(y if y is not None else []))  # copies
        return out


__all__ = ["SMOOTHING", "TrainPlotsWidget", "ema", "kind_sort_key", "short_kind"]
