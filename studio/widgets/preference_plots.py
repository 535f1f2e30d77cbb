"""Live plots of a DPO or ORPO run (engine PreferenceStep / PreferenceEval events), the Train page's
"Preferences" tab: the log-probabilities of the chosen and the rejected answers, the reward margin,
and the preference accuracy of the training pairs and of the held-out pairs.

Like the other plots (studio.widgets.plots), `add_event` only appends to buffers; `redraw` (on the
plots' 20 Hz timer) draws what changed, one panel a tick, and only while the tab is shown.
What it is not: it keeps nothing the engine needs.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QGridLayout, QLabel, QWidget

from engine import PreferenceEval, PreferenceStep

from .plot_parts import (
    COLORS,
    RangeKeeper,
    Series,
    make_legend,
    mark_sparse,
    marker,
    paint_plot,
    plot_widget,
    style_plot,
)
from .redraws import PanelRedraws

PANELS = ("logp", "margin", "accuracy")
# series -> (panel, legend name, colour, held out)
SERIES = {
    "chosen_logp": ("logp", "chosen", COLORS[2], False),
    "rejected_logp": ("logp", "rejected", COLORS[3], False),
    "margin": ("margin", "training pairs", COLORS[0], False),
    "val_margin": ("margin", "held-out pairs", COLORS[1], True),
    "accuracy": ("accuracy", "training pairs", COLORS[0], False),
    "val_accuracy": ("accuracy", "held-out pairs", COLORS[1], True),
}


class PreferencePlotsWidget(QWidget):
    """Three plots of a preference run (see the module docstring)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.series = {k: Series() for k in SERIES}
        self.total_steps = 0
        self.objective = "dpo"
        self.redraws = PanelRedraws(PANELS)
        self.pws = {p: plot_widget() for p in PANELS}
        titles = {
            "logp": ("Log-probability per answer token", "mean log p"),
            "margin": ("Reward margin (chosen − rejected)", "margin"),
            "accuracy": ("Preference accuracy", "share of pairs"),
        }
        self.plots = {p: style_plot(self.pws[p], *titles[p]) for p in PANELS}
        # where a run that learns leaves room: log p of the chosen answers climbs to the top right and
        # the rejected ones' falls to the bottom right; margin and accuracy climb from the bottom left
        corners = {"logp": (10, 10), "margin": (-10, -10), "accuracy": (-10, -10)}
        self.legends = {p: make_legend(self.pws[p], offset=corners[p]) for p in PANELS}
        self.curves: dict[str, pg.PlotDataItem] = {}
        for key, (panel, name, color, held) in SERIES.items():
            opts = marker(color, size=6) if held else {}
            self.curves[key] = self.plots[panel].plot(name=name, pen=pg.mkPen(color, width=1.5), **opts)
        self.ranges = {p: RangeKeeper(self.plots[p]) for p in PANELS}
        self.plots["accuracy"].setYRange(-0.02, 1.02, padding=0)
        self.pws["logp"].setToolTip(
            "Mean log-probability per token of the chosen and of the rejected answers of each step's pairs: "
            "training should raise the first above the second."
        )
        self.pws["margin"].setToolTip(
            "Mean reward margin: DPO's implicit reward β·(log π − log π_ref) of the chosen answer minus the "
            "rejected one's (ORPO: λ × mean token log-probability); held-out pairs at each evaluation."
        )
        self.pws["accuracy"].setToolTip(
            "Share of pairs whose chosen answer has the higher reward (a tie counts half: an untrained "
            "adapter scores 0.5 under DPO); held-out pairs at each evaluation."
        )
        self.caption = QLabel()
        self.caption.setWordWrap(True)
        grid = QGridLayout(self)
        grid.setContentsMargins(2, 2, 2, 2)
        grid.setSpacing(4)
        grid.addWidget(self.pws["logp"], 0, 0, 1, 2)
        grid.addWidget(self.pws["margin"], 1, 0)
        grid.addWidget(self.pws["accuracy"], 1, 1)
        grid.addWidget(self.caption, 2, 0, 1, 2)
        grid.setRowStretch(0, 1)
        grid.setRowStretch(1, 1)
        self.latest: PreferenceStep | None = None
        self.latest_eval: PreferenceEval | None = None

    def apply_palette(self) -> None:
        for pw in self.pws.values():
            paint_plot(pw)

    def set_run(self, objective: str, total_steps: int, held_out: bool = True) -> None:
        """A preference run starts: its objective names the margin's reward; the step axis is known;
        without held-out pairs their curves are left out of the legends."""
        self.objective = objective
        self.total_steps = total_steps
        for key, (panel, name, _, held) in SERIES.items():
            if held:
                legend = self.legends[panel]
                legend.removeItem(self.curves[key])
                if held_out:
                    legend.addItem(self.curves[key], name)
        for keeper in self.ranges.values():
            keeper.set_total(total_steps)

    def clear(self) -> None:
        for s in self.series.values():
            s.clear()
        for keeper in self.ranges.values():
            keeper.reset()
        self.latest = self.latest_eval = None
        self.caption.setText("")
        self.redraws.mark_all()
        self.redraw(everything=True)

    def add_event(self, event: object) -> None:
        """Buffer a PreferenceStep or PreferenceEval (cheap); `redraw` draws it."""
        if isinstance(event, PreferenceEval):
            self.series["val_margin"].append(event.step, event.margin)
            self.series["val_accuracy"].append(event.step, event.accuracy)
            self.latest_eval = event
            self.redraws.mark(("margin", "accuracy"))
        elif isinstance(event, PreferenceStep):
            for key in ("chosen_logp", "rejected_logp", "margin", "accuracy"):
                self.series[key].append(event.step, getattr(event, key))
            self.latest = event
            self.redraws.mark_all()

    def redraw(self, everything: bool = False) -> None:
        """Draw one dirty panel (all with `everything`), while shown."""
        if not self.redraws.dirty or not (everything or self.isVisible()):
            return
        for panel in self.redraws.take(lambda _panel: True, everything=everything):
            ys = []
            for key, (p, _, color, _) in SERIES.items():
                if p != panel:
                    continue
                x, y = self.series[key].view()
                self.curves[key].setData(x, y)
                if not SERIES[key][3]:
                    mark_sparse(self.curves[key], len(x), color)
                ys.append((x, y))
            if panel != "accuracy":
                x = np.concatenate([x for x, _ in ys]) if ys else np.zeros(0)
                y = np.concatenate([y for _, y in ys]) if ys else np.zeros(0)
                self.ranges[panel].fit(np.sort(x), y)
        self.caption.setText(self.summary())

    def summary(self) -> str:
        """One line: the latest step's figures and the held-out pairs' (what the caption shows)."""
        parts = []
        if self.latest is not None:
            e = self.latest
            parts.append(
                f"Step {e.step}: {self.objective.upper()} loss {e.loss:.4f}, accuracy {e.accuracy:.0%}, "
                f"margin {e.margin:+.3f}, log p chosen {e.chosen_logp:.3f} / rejected {e.rejected_logp:.3f}"
            )
        if self.latest_eval is not None:
            v = self.latest_eval
            parts.append(
                f"held-out pairs ({v.n_pairs}) at step {v.step}: accuracy {v.accuracy:.0%}, "
                f"margin {v.margin:+.3f}"
            )
        return ". ".join(parts)

    def curve_data(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The data each curve was given, by series name (tests, screenshots)."""
        out = {}
        for key, c in self.curves.items():
            x, y = c.getOriginalDataset()
            out[key] = (np.array(x if x is not None else []), np.array(y if y is not None else []))
        return out


__all__ = ["PreferencePlotsWidget"]
