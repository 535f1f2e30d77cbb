"""Journey: a person with a MoE model opens the Targets page, counts the routing of the dataset through
the base model, sees which experts the data never reaches and what that costs in parameters, ticks
"Leave out experts the data never reaches", sets a load-balancing coefficient and trains: the run
leaves the unreached experts' factors alone, the loss plot has the load-balancing series, and the
expert heatmap compares the run's routing with the census."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt

from engine import LoraAdapter, Model, left_out
from studio.widgets.plot_parts import legend_names
from tests.engine.test_census import _model_with_unreached

from .conftest import TIMEOUT_MS, open_model_and_dataset, train_with


def test_count_routing_leave_out_unreached_and_balance(qtbot, app, facts, tmp_path):
    path, unreached = _model_with_unreached(tmp_path)  # layer 1 expert 2, layer 2 experts 0 and 3
    window = app.launch()
    open_model_and_dataset(qtbot, window, path, facts)
    window.show_page_named("Targets")
    page = window.targets_page
    assert page.apply_preset("all")  # attention, router, experts
    panel = page.census_panel
    assert panel.isVisible() and panel.count_button.isEnabled()
    qtbot.mouseClick(panel.count_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: panel.census is not None, timeout=TIMEOUT_MS)
    census = panel.census
    assert census.layers == (1, 2) and census.unreached() == unreached
    assert "3 of 8 experts receive no token of this data (layer/expert: 1/2, 2/0, 2/3)" in panel.status.text()
    xs, ys = panel.marks.getData()
    assert sorted(zip(xs.tolist(), ys.tolist(), strict=True)) == [
        (0.5, 2.5),
        (1.5, 0.5),
        (1.5, 3.5),
    ]  # crosses
    np.testing.assert_array_equal(panel.heatmap.values, census.counts)
    # what the selection loses: 3 expert kinds x 3 unreached experts of the 2 x 3 x 4 counted
    rank = window.project.config.rank
    shapes = {n: tuple(page.info.tensors[n].shape) for n in page.selected_names()}
    out = left_out(census, shapes, rank)
    assert (out.n_sets, out.n_total_sets) == (9, 24) and out.params == 3 * 3 * rank * (32 + 64)
    trainable = page.summary_labels["Trainable parameters"].text()
    assert (
        f"9 of 24 expert factor sets are never reached by this data: {out.params:,} parameters" in trainable
    )
    assert panel.left_out_label.text().startswith("9 of 24 expert factor sets are never reached")
    panel.skip_box.click()
    assert window.project.config.skip_unreached_experts
    assert f"({out.params:,} left out" in page.summary_labels["Trainable parameters"].text()

    result = train_with(qtbot, window, steps=3, router_aux_coef=0.05, out_type="F32")
    assert result.step == 3
    plots = window.train_page.plots
    plots.flush()  # what the timer draws next
    x, y = plots.curve_data()["router_aux"]
    assert x.tolist() == [1, 2, 3] and (y > 0).all()  # the load-balancing loss, a series of its own
    assert legend_names(plots.loss_legend).count("load-balancing loss") == 1
    # the adapter written: the unreached experts' B factors never left zero, the others did
    adapter = LoraAdapter.load(result.adapter_path, Model.load(path))
    for layer, e in [(1, 0), (1, 2), (2, 0), (2, 1)]:
        B = adapter.pairs[f"blk.{layer}.ffn_up_exps.weight"][1]
        assert (np.abs(B[e]).max() == 0) == ((layer, e) in unreached), (layer, e)
    # the run's routing against the census: the unreached experts are still unreached
    assert plots.expert_census_box.isEnabled()
    plots.expert_census_box.setChecked(True)
    diff = plots.census_difference()
    assert diff.shape == (2, 4) and np.allclose(diff.sum(axis=1), 0)
    for layer, e in unreached:
        assert diff[census.layers.index(layer), e] == 0
    np.testing.assert_allclose(plots.expert_map.values, diff)
    assert "minus the base model's census" in plots.expert_map._caption
    assert plots.expert_map.plot.texts[0].startswith("Share of tokens") and plots.expert_map.unit == "pp"
    plots.expert_census_box.setChecked(False)  # back to the run's own counts
    assert plots.expert_map.unit == "tokens" and plots.expert_map.values.shape == (3, 4)
