"""Which plot panels a redraw draws: the dirty ones, a few visible ones a tick, round robin.

Plots buffer their data when an event comes (cheap) and mark the panels it changes dirty
(`PanelRedraws.mark`); a timer tick then draws at most `per_tick` of the dirty panels that are
visible, taking turns so that every panel gets drawn, plus every dirty hidden one (no painting: it
costs next to nothing). Repainting every plot at once, with a training thread competing for the
interpreter lock, stalled the UI for 100-250 ms; one visible panel a tick keeps a tick near 35 ms
(bench/ui_stall.py). `take(everything=True)` gives every dirty panel (screenshots, a run's end).

No Qt here: the widget says which panels are visible and draws what `take` gives it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


class PanelRedraws:
    """The dirty panels of a plot widget and the order they are drawn in; see the module docstring."""

    def __init__(self, panels: Sequence[str], per_tick: int = 1):
        self.panels = tuple(panels)
        self.per_tick = per_tick
        self.dirty: set[str] = set()
        self._turn = 0  # where the round robin starts next

    def mark(self, panels: Iterable[str]) -> None:
        """These panels' data changed."""
        self.dirty.update(panels)

    def mark_all(self) -> None:
        self.dirty = set(self.panels)

    def take(
        self, visible: Callable[[str], bool], *, everything: bool = False, visible_only: bool = False
    ) -> list[str]:
        """The panels to draw now, no longer dirty: every dirty hidden one and at most `per_tick` dirty
        visible ones, the next in turn first; everything: every dirty one (visible_only: the visible)."""
        order = self.panels[self._turn :] + self.panels[: self._turn]
        todo = [p for p in order if p in self.dirty]
        if everything:
            if visible_only:
                todo = [p for p in todo if visible(p)]
        else:
            shown = [p for p in todo if visible(p)][: self.per_tick]
            if shown:
                self._turn = (self.panels.index(shown[-1]) + 1) % len(self.panels)
            todo = [p for p in todo if p in shown or not visible(p)]
        self.dirty.difference_update(todo)
        return todo


__all__ = ["PanelRedraws"]
