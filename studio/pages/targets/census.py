"""The Targets page's routing census (MoE models): how many of the dataset's tokens the base model sends
to each expert of each layer, before training (engine.routing_census), as a layers x experts heatmap
with the experts no token reaches crossed out, what leaving them out would save on the selected
targets, and the option to leave them out (TrainConfig.skip_unreached_experts).

The count runs as a job on the app's engine worker (the open model, no adapter), off the UI thread,
with a progress bar and Cancel; its result is cached by the engine per model file, dataset and
settings, so counting again after a restart reads it back at once. Every token of every sample counts,
prompt tokens included (the router sees them all, and an expert's factors learn from each token routed
to it); a token counts once for each expert it is routed to. The census is of the dataset file as
saved; a change of model, dataset or its settings (context, prompt format, objective) marks it out of
date.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine import Census, CensusCancelled, CensusProgress, EncodeOptions, left_out, routing_census

from ...project import Project
from ...widgets.heatmap import HeatmapWidget

_SUBMITTING = object()  # CensusPanel.job while engine.submit runs
UNREACHED_COLOR = "#e0464e"  # the cross over an expert no token reaches (readable on viridis' dark end)


def census_settings(project: Project) -> tuple:
    """What a census depends on besides the model: the dataset file (path, size, time) and settings."""
    path = project.dataset_path
    try:
        st = os.stat(path) if path else None
    except OSError:
        st = None
    cfg = project.config
    stamp = (st.st_size, st.st_mtime_ns) if st else None
    return (
        project.model_path,
        path,
        stamp,
        cfg.n_ctx,
        cfg.prompt_format,
        cfg.objective,
        project.template_file,
    )


class CensusPanel(QGroupBox):
    """The census section (see the module docstring). `sig_census(Census | None)`: a new census, or
    None when the shown one no longer applies."""

    sig_census = Signal(object)

    def __init__(self, project: Project, engine=None, parent: QWidget | None = None):
        super().__init__("Routing census", parent)
        self.project = project
        self.engine = engine
        self.census: Census | None = None
        self.job = None
        self._settings: tuple | None = None  # census_settings of the census shown
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._rank = 16
        self.setToolTip(
            "Tokens the data sends to each expert: one pass of the base model (no adapter) over the\n"
            "dataset's tokens, prompt tokens included, counting for each MoE layer the tokens routed to\n"
            "each expert (a token counts once for each of its top-k experts). Cached per model, dataset\n"
            "and settings."
        )
        self.count_button = QPushButton("Count routing")
        self.count_button.setAutoDefault(False)
        self.count_button.setToolTip("Run the base model over the dataset and count the routing (cached).")
        self.count_button.clicked.connect(self.count)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAutoDefault(False)
        self.cancel_button.clicked.connect(self.cancel)
        self.cancel_button.hide()
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.status = QLabel("Count how many of the dataset's tokens each expert receives.")
        self.status.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.count_button)
        row.addWidget(self.cancel_button)
        row.addWidget(self.progress, 1)
        self.heatmap = HeatmapWidget("Tokens the data sends to each expert", "layer", "expert", "tokens")
        self.heatmap.setMinimumHeight(180)
        self.marks = pg.ScatterPlotItem(
            symbol="x", size=11, pen=pg.mkPen(UNREACHED_COLOR, width=2), brush=pg.mkBrush(UNREACHED_COLOR)
        )
        self.heatmap.plot.addItem(self.marks)
        self.heatmap.hide()
        self.left_out_label = QLabel()
        self.left_out_label.setWordWrap(True)
        self.skip_box = QCheckBox("Leave out experts the data never reaches")
        self.skip_box.setToolTip(
            "Freeze the LoRA factors of the routed experts this census says receive no token: they get\n"
            "no gradient and no update (weight decay included), and do not count as trainable."
        )
        self.skip_box.toggled.connect(self._skip_toggled)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addLayout(row)
        layout.addWidget(self.status)
        layout.addWidget(self.heatmap, 1)
        layout.addWidget(self.left_out_label)
        layout.addWidget(self.skip_box)
        self.sync_option()

    # --- state ------------------------------------------------------------------------------
    def sync_option(self) -> None:
        on = bool(self.project.config.skip_unreached_experts)
        if self.skip_box.isChecked() != on:
            self.skip_box.blockSignals(True)
            self.skip_box.setChecked(on)
            self.skip_box.blockSignals(False)

    def _skip_toggled(self, on: bool) -> None:
        self.project.update_config(skip_unreached_experts=bool(on))

    def set_targets(self, shapes: Mapping[str, tuple[int, ...]], rank: int) -> None:
        """The selected LoRA targets' base shapes and the rank: what leaving out would save."""
        self._shapes, self._rank = dict(shapes), int(rank)
        self._show_left_out()

    def check_current(self) -> None:
        """Mark the census out of date when the model, dataset or its settings changed."""
        self.sync_option()
        if self.census is not None and census_settings(self.project) != self._settings:
            self.census = None
            self.marks.clear()
            self.heatmap.show_placeholder("out of date: count again")
            self.status.setText("The model, the dataset or its settings changed: count the routing again.")
            self._show_left_out()
            self.sig_census.emit(None)
        self._update_button()

    def _update_button(self) -> None:
        busy = self.job is not None
        why = ""
        if not self.project.dataset_path:
            why = "Choose a dataset file on the Dataset page first."
        elif self.engine is None:
            why = "No engine to count with."
        self.count_button.setEnabled(not busy and not why)
        self.count_button.setToolTip(
            why or "Run the base model over the dataset and count the routing (cached)."
        )
        if why and self.census is None and not busy:
            self.status.setText(why)

    # --- counting ---------------------------------------------------------------------------
    def count(self) -> None:
        """Count the routing on the engine worker (the result comes back on the UI thread)."""
        p = self.project
        if self.engine is None or not p.dataset_path or not p.model_path or self.job is not None:
            return
        cfg = p.config
        options = EncodeOptions(cfg.n_ctx, cfg.train_on_prompt and cfg.objective == "sft", cfg.prompt_format)
        dataset, template, pairs = p.dataset_path, p.template_file, cfg.objective != "sft"
        data_cache = {"auto": "auto", "off": None}.get(cfg.data_cache, cfg.data_cache)
        settings = census_settings(p)

        def fn(session, job):
            try:
                return routing_census(
                    session.model, dataset, template, options, pairs=pairs, data_cache=data_cache,
                    on_progress=job.emit, cancelled=job.should_stop,
                )  # fmt: skip
            except CensusCancelled:
                return None

        self.progress.setRange(0, 0)
        self.progress.setFormat("preparing the data…")
        self.progress.show()
        self.cancel_button.show()
        self.status.setText("Counting: one pass of the base model over the dataset…")
        self.job = _SUBMITTING  # busy from now on: a job that ends at once (the engine closing) clears it
        job = self.engine.submit(
            "counting routing",
            fn,
            on_event=self._progress,
            on_done=lambda c: self._done(c, settings),
            on_error=self._failed,
            model=(p.model_path, p.device),
        )
        if self.job is not None:
            self.job = job
        self._update_button()

    def cancel(self) -> None:
        if self.job is not None and self.job is not _SUBMITTING:
            self.engine.cancel(self.job)
            self.status.setText("Cancelling…")

    def _progress(self, p: object) -> None:
        if not isinstance(p, CensusProgress):
            return
        if p.total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * p.done / p.total))
        what = "preparing the data" if p.phase == "preparing" else f"routing {p.done:,} of {p.total:,} tokens"
        self.progress.setFormat(f"{what} (%p%)")

    def _finish(self) -> None:
        self.job = None
        self.progress.hide()
        self.cancel_button.hide()
        self._update_button()

    def _failed(self, message: str) -> None:
        self._finish()
        self.status.setText(f"The routing could not be counted: {message}")

    def _done(self, census: Census | None, settings: tuple) -> None:
        self._finish()
        if census is None:
            self.status.setText("Cancelled: nothing was counted.")
            return
        self.show_census(census, settings)

    def show_census(self, census: Census, settings: tuple | None = None) -> None:
        """Draw a census (the heatmap, the unreached experts crossed out) and say what it means."""
        self.census = census
        self._settings = settings if settings is not None else census_settings(self.project)
        L, E = census.counts.shape
        self.heatmap.show()
        self.heatmap.set(census.counts, [str(i) for i in census.layers], [str(e) for e in range(E)])
        rows, experts = np.nonzero(census.unreached_mask())
        self.marks.setData(x=rows + 0.5, y=experts + 0.5)
        self.heatmap.set_caption(
            f"{census.n_tokens:,} tokens of {census.n_samples:,} samples, top-{census.K} of {E} experts"
            + (" (from the cache)" if census.reused else "")
            + "; × marks an expert no token reaches (hover a cell for its count)"
        )
        unreached = census.unreached()
        if unreached:
            listed = ", ".join(f"{layer}/{e}" for layer, e in unreached[:12]) + (
                " …" if len(unreached) > 12 else ""
            )
            self.status.setText(
                f"{len(unreached)} of {L * E} experts receive no token of this data (layer/expert: {listed})."
            )
        else:
            self.status.setText(f"Every one of the {L * E} experts receives tokens of this data.")
        self._show_left_out()
        self.sig_census.emit(census)

    def _show_left_out(self) -> None:
        if self.census is None:
            self.left_out_label.setText("")
            return
        out = left_out(self.census, self._shapes, self._rank)
        self.left_out_label.setText(out.describe()[0].upper() + out.describe()[1:] + ".")
