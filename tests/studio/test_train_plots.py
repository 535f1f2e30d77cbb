"""Readable training plots (studio.widgets.plots) fed with engine events by hand: markers for short
series, padded ranges and sane ticks for flat ones, "validation" in the legend only with a split,
EMA smoothing with the raw points kept faint, a log-scale loss, the placeholder, and colours that
follow the theme."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from engine import Eval, Plan, Started, Step
from studio.widgets.plot_parts import legend_names
from studio.widgets.plots import SMOOTHING, TrainPlotsWidget, ema
from studio.widgets.theme import apply_theme


def step(i: int, loss: float, lr: float = 2e-4, total: int = 10) -> Step:
    return Step(i, total, i / total, loss, loss, lr, 1.0, 100, 1000.0, float(i), float(total - i))


def started(n_val: int, total: int = 10, start: int = 0) -> Started:
    return Started(Plan(10, n_val, 5, 500, 400, 5, total, 1000, ("blk.0.attn_q.weight",), (), {}, (), start))


@pytest.fixture
def plots(qtbot):
    w = TrainPlotsWidget()
    qtbot.addWidget(w)
    w.resize(900, 600)
    w.show()
    return w


def test_a_series_of_one_point_has_markers_then_a_line(plots):
    plots.add_event(started(0))
    plots.add_event(step(1, 2.5))
    plots.flush()
    assert plots.train_curve.opts["symbol"] == "o" and plots.lr_curve.opts["symbol"] == "o"
    assert plots.gn_curve.opts["symbol"] == "o" and plots.tps_curve.opts["symbol"] == "o"
    plots.add_event(step(2, 2.4))
    plots.flush()
    assert plots.train_curve.opts["symbol"] is None and plots.lr_curve.opts["symbol"] is None


def test_flat_series_get_a_padded_range_and_short_tick_labels(plots):
    plots.add_event(started(0))
    for i in range(1, 6):
        plots.add_event(step(i, 2.0 + 1e-9 * i, lr=2e-4))  # flat up to noise in the ninth digit
    plots.flush()
    lo, hi = plots.lr_plot.viewRange()[1]
    assert lo <= 2e-4 * 0.95 and hi >= 2e-4 * 1.05  # at least ±5 % around the value
    assert lo > 0  # and not down to zero: the line is not squashed against an axis
    lo, hi = plots.loss_plot.viewRange()[1]
    assert hi - lo >= 0.2 and lo < 2.0 < hi
    for plot in (plots.lr_plot, plots.loss_plot):
        axis = plot.getAxis("left")
        lo, hi = plot.viewRange()[1]
        spacing = axis.tickSpacing(lo, hi, 200)[-1][0]
        values = list(np.arange(np.ceil(lo / spacing) * spacing, hi, spacing))
        labels = axis.tickStrings(values, 1.0, spacing)
        assert labels and all(len(t) <= 7 for t in labels), labels
        assert len(set(labels)) == len(labels), labels  # neighbouring ticks tell apart
    tiny = plots.lr_plot.getAxis("left").tickStrings([1e-6, 2e-6, 3e-6], 1.0, 1e-6)
    assert tiny == ["1e-6", "2e-6", "3e-6"]


def test_validation_is_in_the_legend_only_with_a_split(plots):
    plots.add_event(started(n_val=0))
    plots.add_event(step(1, 2.0))
    plots.flush()
    assert legend_names(plots.loss_legend) == ["training"]
    plots.clear()
    plots.add_event(started(n_val=3))
    assert legend_names(plots.loss_legend) == ["training", "validation"]
    plots.add_event(Eval(1, 2.2, 40))
    plots.flush()
    assert list(plots.curve_data()["val"][0]) == [1]
    plots.clear()
    assert legend_names(plots.loss_legend) == ["training"]


def test_loss_smoothing_keeps_the_raw_points_faint_and_log_scale(plots, qtbot):
    rng = np.random.default_rng(0)
    losses = 3.0 * np.exp(-np.arange(40) / 10) + 0.3 * rng.random(40) + 0.05
    plots.add_event(started(0, total=40))
    for i, loss in enumerate(losses, 1):
        plots.add_event(step(i, float(loss), total=40))
    plots.flush()
    assert plots.smoothing == "light" and plots.smoothing_combo.currentText() == "light"
    data = plots.curve_data()
    raw, smooth = data["loss"][1], data["loss_smoothed"][1]
    np.testing.assert_allclose(raw, losses)
    np.testing.assert_allclose(smooth, ema(losses, SMOOTHING["light"])[0])
    assert np.abs(np.diff(smooth, 2)).sum() < 0.5 * np.abs(np.diff(raw, 2)).sum()  # smoother
    assert plots.train_raw_curve.isVisible() and plots.train_raw_curve.opts["pen"].color().alpha() < 128
    assert "training" in legend_names(plots.loss_legend)
    plots.smoothing_combo.setCurrentIndex(plots.smoothing_combo.findData("strong"))
    assert plots.smoothing == "strong"
    assert np.abs(np.diff(plots.curve_data()["loss_smoothed"][1], 2)).sum() < np.abs(np.diff(smooth, 2)).sum()
    plots.set_smoothing("off")
    np.testing.assert_allclose(plots.curve_data()["loss_smoothed"][1], losses)
    assert not plots.train_raw_curve.isVisible()
    # a resumed run cuts the series: the smoothing starts again from the cut
    plots.set_smoothing("medium")
    plots.add_event(started(0, total=40, start=20))
    plots.add_event(step(21, 9.0, total=40))
    plots.flush()
    x, y = plots.curve_data()["loss_smoothed"]
    assert len(x) == 21 and y[-1] == pytest.approx(
        ema(np.append(losses[:20], 9.0), SMOOTHING["medium"])[0][-1]
    )
    plots.log_box.setChecked(True)
    assert plots.loss_plot.getAxis("left").logMode
    lo, hi = plots.loss_plot.viewRange()[1]
    assert lo < np.log10(losses[:20].min()) and hi > np.log10(9.0)  # log10 units
    plots.log_box.setChecked(False)
    assert not plots.loss_plot.getAxis("left").logMode


def test_placeholder_before_the_first_run_and_links(plots, qtbot):
    plots.show_placeholder('<h3>Train</h3><a href="page:Dataset">Dataset page</a>')
    assert plots.placeholder_shown and not plots.tabs.isVisible()
    with qtbot.waitSignal(plots.sig_link_activated) as link:
        plots.placeholder.linkActivated.emit("page:Dataset")
    assert link.args == ["page:Dataset"]
    plots.start()
    assert not plots.placeholder_shown and plots.tabs.isVisible()
    plots.stop()


def test_colours_follow_the_theme(plots, qtbot):
    app = QApplication.instance()
    old_palette, old_style = app.palette(), app.style().name()
    try:
        plots.add_event(started(2))
        plots.add_event(step(1, 2.0))
        plots.flush()
        for theme in ("dark", "light"):
            apply_theme(app, theme)
            qtbot.wait(10)
            pal = plots.palette()
            base, text = pal.color(QPalette.Base), pal.color(QPalette.WindowText)
            for pw in (plots.loss_pw, plots.norms_pw, plots.lr_pw, plots.norm_map.pw):
                assert pw.backgroundBrush().color() == base, theme
                assert pw.getPlotItem().getAxis("left").textPen().color() == text, theme
            for _, label in plots.loss_legend.items:
                assert label.opts["color"] == text, theme
            assert plots.loss_legend.opts["brush"].color().rgb() == base.rgb(), theme
            # legend text on its background: readable contrast
            assert abs(text.lightness() - base.lightness()) > 120, theme
    finally:
        app.setPalette(old_palette)
        app.setStyle(old_style)


def test_the_norms_legend_never_cuts_an_entry_nor_squashes_its_plot(plots, qtbot):
    from engine import LoraNorms

    kinds = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    for i in (1, 2):
        plots.add_event(LoraNorms(i, {f"{k}.weight": 0.1 * i for k in kinds}, {}, {}))
    plots.flush()
    for size, over in (((560, 330), True), ((1500, 950), False)):
        plots.resize(*size)
        qtbot.wait(30)
        pw, legend = plots.norms_pw, plots.norms_legend
        assert plots.norms_legend_over == over, size
        assert legend_names(legend) == kinds
        view = pw.mapToScene(pw.viewport().rect()).boundingRect()
        box = legend.sceneBoundingRect()
        assert view.contains(box), (size, box, view)  # no entry cut
        assert plots.norms_plot.vb.height() >= 0.5 * pw.height(), size  # the curves keep their height


def test_a_tick_paints_little_panels_appear_and_norm_curves_are_made_a_few_at_a_time(plots, qtbot):
    """The costly parts of a repaint are spread over timer ticks: the curve panels come back one
    per tick after a new run empties them (and when the plots replace the placeholder), and a tick
    makes at most NEW_CURVES_PER_TICK new LoRA-norm curves; flush() still draws everything."""
    from engine import LoraNorms
    from studio.widgets.plots import NEW_CURVES_PER_TICK

    curve_panels = [plots.panel_widgets[p] for p in ("loss", "norms", "lr", "grad_norm", "tokens_per_s")]
    plots.clear()
    assert not any(w.isVisible() for w in curve_panels)  # emptied at once, shown one per tick
    assert all(w.sizePolicy().retainSizeWhenHidden() for w in curve_panels)  # nothing moves meanwhile
    seen = []
    for _ in curve_panels:
        plots.redraw()
        seen.append(sum(w.isVisible() for w in curve_panels))
    assert seen == [1, 2, 3, 4, 5]
    plots.start()
    kinds = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    plots.add_event(LoraNorms(1, {k: 0.1 for k in kinds}, {}, {}))
    made = []
    while "norms" in plots.pending():
        plots.redraw()
        made.append(len(plots.kind_curves))
    assert made[-1] == len(kinds) and all(
        b - a <= NEW_CURVES_PER_TICK for a, b in zip([0, *made[:-1]], made, strict=True)
    )
    assert legend_names(plots.norms_legend) == kinds  # in the order of the layers
    assert plots.kind_curves["attn_q"].opts["symbol"] == "o"  # one point: a marker
    plots.add_event(LoraNorms(2, {k: 0.2 for k in kinds}, {}, {}))
    plots.flush()
    assert plots.kind_curves["attn_q"].opts["symbol"] is None
    assert list(plots.curve_data()["norm:attn_q"][1]) == [0.1, 0.2]
    plots.stop()


def test_a_new_point_repaints_the_curve_but_not_the_axes(plots, qtbot, monkeypatch):
    """The axes draw the grid over the whole plot, so without their pixmap cache every new point
    repainted them (Python, 2-3 ms each); they repaint only when their range or colours change."""
    import pyqtgraph as pg

    from studio.widgets.plot_parts import ReadableAxisItem

    painted = {"axis": 0, "curve": 0}

    def counting(kind, paint):
        def wrapper(self, *args):
            painted[kind] += 1
            return paint(self, *args)

        return wrapper

    monkeypatch.setattr(ReadableAxisItem, "paint", counting("axis", ReadableAxisItem.paint))
    monkeypatch.setattr(pg.PlotCurveItem, "paint", counting("curve", pg.PlotCurveItem.paint))
    plots.add_event(started(0, total=100))
    for i in range(1, 4):
        plots.add_event(step(i, 2.5 - 0.1 * i, total=100))
    plots.flush()
    qtbot.wait(60)
    assert painted["axis"] > 0 and painted["curve"] > 0  # first paint: everything
    painted.update(axis=0, curve=0)
    plots.add_event(step(4, 2.3, total=100))  # inside the ranges already shown
    plots.flush()
    qtbot.waitUntil(lambda: painted["curve"] > 0, timeout=2000)
    qtbot.wait(30)
    assert painted["axis"] == 0
    plots.add_event(step(5, 40.0, total=100))  # the loss axis must grow
    plots.flush()
    qtbot.waitUntil(lambda: painted["axis"] > 0, timeout=2000)


def test_many_runs_do_not_grow_the_marker_pictures(plots):
    """Each run's first point shows a marker; its brush is the same object every run, so pyqtgraph's
    symbol atlas (keyed by the brush object) stops growing (bench/soak.py app grew ~0.15 MiB a run)."""
    from pyqtgraph.graphicsItems.ScatterPlotItem import ScatterPlotItem

    def atlas_keys() -> int:
        scatters = [c.scatter for c in (plots.train_curve, plots.lr_curve, plots.gn_curve, plots.tps_curve)]
        return sum(len(s.fragmentAtlas._coords) for s in scatters if isinstance(s, ScatterPlotItem))

    sizes = []
    for run in range(6):
        plots.clear()
        plots.add_event(started(0))
        plots.add_event(step(1, 2.5 - run * 0.1))
        plots.flush()
        plots.grab()  # paint: the atlas draws each marker picture it has not drawn yet
        sizes.append(atlas_keys())
    assert sizes[-1] == sizes[1] > 0, sizes
