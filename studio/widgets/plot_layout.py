"""The training plots' widgets and where they sit, made onto a `TrainPlotsWidget` as its attributes
(as a Qt Designer `setupUi` does): the Curves tab (loss with validation and the MoE auxiliary loss,
LoRA ‖ΔW‖ per kind, learning rate, gradient norm, throughput, in a 12-column grid), the Layers &&
experts tab (the two heatmaps and the experts' options), the loss options in the tab bar's corner,
and the placeholder shown before the first run; with each curve's pen, each panel's tooltip and
range keeper.

Layout only: the widgets call the plots' handlers; studio.widgets.plots buffers the events and
decides what each tick draws.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QStackedWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from .heatmap import HeatmapWidget
from .plot_parts import (
    COLORS,
    RangeKeeper,
    make_legend,
    marker,
    paint_legend,
    plot_widget,
    style_plot,
)

# EMA weights of the training-loss smoothing (the weight of the previous smoothed value)
SMOOTHING = {"off": 0.0, "light": 0.6, "medium": 0.85, "strong": 0.95}
DEFAULT_SMOOTHING = "light"


def setup_ui(plots) -> None:
    """Make the widgets onto `plots` (a TrainPlotsWidget whose buffers are set) and connect them."""
    plots.loss_pw = plot_widget()
    plots.loss_plot = style_plot(plots.loss_pw, "Loss (mean cross-entropy)", "loss")
    plots.loss_legend = make_legend(plots.loss_pw, offset=(-10, 10))
    # the raw training loss, faint under its smoothed curve (not in the legend)
    faint = QColor(COLORS[0])
    faint.setAlpha(70)
    plots.train_raw_curve = plots.loss_plot.plot(pen=pg.mkPen(faint, width=1))
    plots.loss_plot.legend.removeItem(plots.train_raw_curve)
    plots.train_curve = plots.loss_plot.plot(name="training", pen=pg.mkPen(COLORS[0], width=2))
    plots.val_curve = plots.loss_plot.plot(
        name="validation", pen=pg.mkPen(COLORS[1], width=1.5), **marker(COLORS[1], size=6)
    )
    plots.loss_legend.removeItem(plots.val_curve)  # shown once the run has a validation split
    plots.aux_curve = plots.loss_plot.plot(pen=pg.mkPen(COLORS[6], width=1.5, style=Qt.DashLine))
    plots.loss_legend.removeItem(plots.aux_curve)  # shown once a step reports it
    plots.lr_pw = plot_widget()
    plots.lr_plot = style_plot(plots.lr_pw, "Learning rate", "lr")
    plots.lr_curve = plots.lr_plot.plot(pen=pg.mkPen(COLORS[2], width=1.5))
    plots.gn_pw = plot_widget()
    plots.gn_plot = style_plot(plots.gn_pw, "Gradient norm", "‖g‖")
    plots.gn_curve = plots.gn_plot.plot(pen=pg.mkPen(COLORS[3], width=1.5))
    plots.tps_pw = plot_widget()
    plots.tps_plot = style_plot(plots.tps_pw, "Throughput", "tokens/s")
    plots.tps_curve = plots.tps_plot.plot(pen=pg.mkPen(COLORS[4], width=1.5))
    plots.norms_pw = plot_widget()
    plots.norms_plot = style_plot(plots.norms_pw, "LoRA ‖ΔW‖ per tensor kind", "‖ΔW‖_F")
    # one curve per tensor kind: up to 14 entries, so the legend goes under the plot, not over it
    plots.norms_legend = pg.LegendItem(labelTextSize="8pt", colCount=3, horSpacing=10)
    paint_legend(plots.norms_legend, plots.norms_pw.palette(), background=False)
    plots.norms_plot.layout.addItem(plots.norms_legend, 5, 1)
    plots.norms_pw.installEventFilter(plots)  # its legend's columns follow its width
    plots.norms_plot.legend = plots.norms_legend  # plot(name=...) adds its curve here
    plots.norms_legend_over = False  # the legend is over the plot (a short plot), not under it
    for pw, tip in (
        (plots.loss_pw, "Mean cross-entropy of each step's trained tokens (smoothed; raw values faint) "
                       "and, with a validation split, of the held-out samples at each evaluation."),
        (plots.lr_pw, "Learning rate of each step (warm-up, then the schedule's decay)."),
        (plots.gn_pw, "Global norm of the gradient of each step, before clipping (Max gradient norm)."),
        (plots.tps_pw, "Sample tokens processed per second in each step."),
        (plots.norms_pw, "Frobenius norm of each tensor kind's LoRA update ΔW = B·A·alpha/r, "
                        "over the layers."),
    ):  # fmt: skip
        pw.setToolTip(tip)
    plots.step_curves = {
        "loss": plots.train_raw_curve,
        "lr": plots.lr_curve,
        "grad_norm": plots.gn_curve,
        "tokens_per_s": plots.tps_curve,
    }
    # the curve that shows a series' points as markers while it has fewer than two, and its colour
    plots.marked_curves = {
        "loss": (plots.train_curve, COLORS[0]),
        "lr": (plots.lr_curve, COLORS[2]),
        "grad_norm": (plots.gn_curve, COLORS[3]),
        "tokens_per_s": (plots.tps_curve, COLORS[4]),
    }
    plots.kind_colors: dict[str, str] = {}
    plots.ranges = {
        "loss": RangeKeeper(plots.loss_plot),
        "lr": RangeKeeper(plots.lr_plot),
        "grad_norm": RangeKeeper(plots.gn_plot),
        "tokens_per_s": RangeKeeper(plots.tps_plot),
        "norms": RangeKeeper(plots.norms_plot),
    }

    curves = plots.curves_tab = QWidget()
    curves.installEventFilter(plots)  # shown while a run draws: its panels appear one per tick
    grid = QGridLayout(curves)
    grid.setContentsMargins(2, 2, 2, 2)
    grid.setSpacing(4)
    grid.addWidget(plots.loss_pw, 0, 0, 1, 6)  # a 12-column grid: halves above, thirds below
    grid.addWidget(plots.norms_pw, 0, 6, 1, 6)
    grid.addWidget(plots.lr_pw, 1, 0, 1, 4)
    grid.addWidget(plots.gn_pw, 1, 4, 1, 4)
    grid.addWidget(plots.tps_pw, 1, 8, 1, 4)
    grid.setRowStretch(0, 3)
    grid.setRowStretch(1, 2)
    for c in range(12):
        grid.setColumnStretch(c, 1)

    plots.norm_map = HeatmapWidget("LoRA ‖ΔW‖ per tensor", "layer", "tensor kind", "‖ΔW‖_F")
    plots.expert_map = HeatmapWidget("Tokens routed to each expert", "layer", "expert", "tokens")
    plots.expert_latest_box = QCheckBox("Latest step only")
    plots.expert_latest_box.setToolTip(
        "Show the tokens routed to each expert during the latest step instead of the sum since "
        "the run started. Default: off (sum)."
    )
    plots.expert_latest_box.toggled.connect(plots._expert_mode_changed)
    plots.expert_census_box = QCheckBox("Compare with the base model's census")
    plots.expert_census_box.setToolTip(
        "Show each expert's share of its layer's tokens in this run minus its share in the base model's\n"
        "routing census of the dataset (Targets page), in percentage points: where the routing moved."
    )
    plots.expert_census_box.setEnabled(False)
    plots.expert_census_box.toggled.connect(plots._expert_mode_changed)
    expert_panel = QWidget()
    ev = QVBoxLayout(expert_panel)
    ev.setContentsMargins(0, 0, 0, 0)
    ev.addWidget(plots.expert_map, 1)
    ev.addWidget(plots.expert_latest_box)
    ev.addWidget(plots.expert_census_box)
    plots.expert_panel = expert_panel
    layers = QWidget()
    lg = QGridLayout(layers)
    lg.setContentsMargins(2, 2, 2, 2)
    lg.addWidget(plots.norm_map, 0, 0)
    lg.addWidget(expert_panel, 0, 1)

    # loss display: smoothing and log scale, in the tab bar's corner (no height taken)
    plots.smoothing_combo = QComboBox()
    for name in SMOOTHING:
        plots.smoothing_combo.addItem(name, name)
    plots.smoothing_combo.setCurrentIndex(plots.smoothing_combo.findData(DEFAULT_SMOOTHING))
    plots.smoothing_combo.setToolTip(
        "Smoothing of the training-loss curve: an exponential moving average (weights "
        + ", ".join(f"{k} {v:g}" for k, v in SMOOTHING.items())
        + "); the raw losses stay as a faint line. Default: light."
    )
    plots.smoothing_combo.currentIndexChanged.connect(
        lambda i: plots.set_smoothing(plots.smoothing_combo.itemData(i))
    )
    plots.log_box = QCheckBox("Log scale")
    plots.log_box.setToolTip(
        "Show the loss on a logarithmic axis (small late changes stay visible). Default: off."
    )
    plots.log_box.toggled.connect(plots.set_log_loss)
    corner = QWidget()
    cl = QHBoxLayout(corner)
    cl.setContentsMargins(0, 0, 4, 0)
    cl.setSpacing(4)
    smoothing_label = QLabel("Loss smoothing:")
    smoothing_label.setToolTip(plots.smoothing_combo.toolTip())
    cl.addWidget(smoothing_label)
    cl.addWidget(plots.smoothing_combo)
    cl.addWidget(plots.log_box)
    plots.loss_options = corner

    plots.tabs = QTabWidget()
    plots.tabs.setDocumentMode(True)
    plots.tabs.addTab(curves, "Curves")
    plots.tabs.addTab(layers, "Layers && experts")
    plots.tabs.setCornerWidget(corner, Qt.TopRightCorner)
    plots.tabs.currentChanged.connect(plots._tab_changed)

    # before the first run: what to do, in place of empty plots
    plots.placeholder = QLabel()
    plots.placeholder.setObjectName("plotsPlaceholder")
    plots.placeholder.setWordWrap(True)
    plots.placeholder.setAlignment(Qt.AlignCenter)
    plots.placeholder.setTextFormat(Qt.RichText)
    plots.placeholder.setTextInteractionFlags(Qt.TextBrowserInteraction)
    plots.placeholder.setOpenExternalLinks(False)
    plots.placeholder.linkActivated.connect(plots.sig_link_activated)
    plots.placeholder.setMargin(16)
    plots.placeholder.setMinimumSize(120, 90)
    plots.stack = QStackedWidget()
    plots.stack.addWidget(plots.placeholder)
    plots.stack.addWidget(plots.tabs)
    plots.stack.setCurrentWidget(plots.tabs)
    layout = QVBoxLayout(plots)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(plots.stack)

    plots.panel_widgets = {
        "loss": plots.loss_pw,
        "norms": plots.norms_pw,
        "lr": plots.lr_pw,
        "grad_norm": plots.gn_pw,
        "tokens_per_s": plots.tps_pw,
        "norm_map": plots.norm_map,
        "experts": plots.expert_map,
    }
    for panel in plots.CURVE_PANELS:  # hidden while waiting to be revealed, they keep their place
        policy = plots.panel_widgets[panel].sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        plots.panel_widgets[panel].setSizePolicy(policy)
