"""Which plot panels a redraw draws (studio.widgets.redraws), without Qt."""

from __future__ import annotations

from studio.widgets.redraws import PanelRedraws


def test_a_tick_draws_one_visible_panel_in_turn_and_every_hidden_one():
    r = PanelRedraws(("loss", "lr", "norms", "experts"))
    shown = {"loss", "lr", "norms"}  # the experts' heatmap is on another tab
    r.mark(("loss", "lr", "experts"))
    assert r.take(shown.__contains__) == ["loss", "experts"]
    assert r.dirty == {"lr"}
    r.mark(("loss",))
    assert r.take(shown.__contains__) == ["lr"]  # its turn: loss was drawn last
    assert r.take(shown.__contains__) == ["loss"]
    assert r.take(shown.__contains__) == [] and not r.dirty


def test_everything_draws_every_dirty_panel_or_every_visible_one():
    r = PanelRedraws(("loss", "lr", "norms"), per_tick=1)
    r.mark_all()
    assert r.take(lambda p: p != "norms", everything=True, visible_only=True) == ["loss", "lr"]
    assert r.dirty == {"norms"}
    assert r.take(lambda p: False, everything=True) == ["norms"]


def test_per_tick_bounds_the_visible_panels_of_a_tick():
    r = PanelRedraws(("a", "b", "c", "d"), per_tick=2)
    r.mark_all()
    assert r.take(lambda p: True) == ["a", "b"]
    assert r.take(lambda p: True) == ["c", "d"]
