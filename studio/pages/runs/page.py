"""The Runs page: the history of training runs and rating sessions, and their loss curves compared.

Every run record (`engine.find_runs`) in the project's output folder and in the folders the person
added (remembered with QSettings, `runs/folders`) is a row: name, model, dataset, targets, steps
done / planned, final and best loss, status (finished, stopped at step N, failed with its message,
paused, running) and the adapter it wrote. Selecting two or more rows overlays their loss curves;
the details below name the adapter and the checkpoints, each with a button that opens its folder.
"Chat with it", "Rate answers" and "Export…" hand the selected run's adapter to the other pages
through signals (the window routes them). The list is read again when a run folder changes (a
QFileSystemWatcher), every few seconds while the page is visible, and on F5.

"Follow a run…" adds a run's events file (`tune-engine train --events FILE`, as the Train page's
"Across machines…" gives it for a run on other machines): the run is listed from its events,
its loss curve growing as rank 0 writes them (the file is watched), until it finishes.

What this is not: it trains nothing and loads no weights; it reads run records (small JSON files).
"""

from __future__ import annotations

import os

from PySide6.QtCore import QFileSystemWatcher, QItemSelectionModel, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QPushButton,
    QTableView,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import RunRecord, SampleAnswers

from ...project import ModelInfo
from ...widgets.buttons import action_button
from ...widgets.elided_label import ElidedLabel
from ...widgets.engine_page import RUNS_MOVED, EnginePage
from ...widgets.faint_label import FaintLabel
from ...widgets.loss_overlay import LossOverlayWidget
from ...widgets.page_layout import PageLayout, splitter
from ...widgets.runs import (
    add_followed,
    extra_folders,
    followed_events,
    has_adapter,
    load_runs,
    remove_followed,
    resume_checkpoint,
    run_folders,
    run_label,
    same_model,
    set_extra_folders,
    status_text,
)
from ...widgets.sample_answers import SampleAnswersTable
from ...widgets.wrapping_label import wrapping_label
from .model import RunsModel

POLL_MS = 3000  # re-read the records this often while the page is visible
SETTLE_MS = 300  # after a folder changes, wait for the burst of writes to end


def _two_lines(path: str, note: str = "") -> str:
    """A path as its name, then its folder: each line is elided on its own, so the name stays readable
    in a narrow column."""
    path = os.path.normpath(path)
    return f"{os.path.basename(path)}{note}\nin {os.path.dirname(path)}"


class RunsPage(EnginePage):
    """The run history; see the module docstring."""

    sig_chat_requested = Signal(str, str)  # adapter path, label
    sig_rate_requested = Signal(str)  # adapter path
    sig_export_requested = Signal(str)  # adapter path
    sig_resume_requested = Signal(str, str)  # checkpoint folder, the run's model

    def __init__(self, *args, **kwargs):
        """EnginePage's arguments: project, engine, parent, settings."""
        super().__init__(*args, **kwargs)
        self.open_url = QDesktopServices.openUrl  # replaced in tests
        self._signature: tuple = ()

        title = QLabel("<b>Runs</b>")
        self.folders_label = wrapping_label(interaction=Qt.TextSelectableByMouse)
        self.add_button = action_button(
            "Add folder…",
            self.choose_folder,
            "Also list the runs in another folder (an older project's output folder, say); remembered "
            "for the next start. Default: only the project's output folder.",
        )
        self.follow_button = action_button(
            "Follow a run…",
            self.choose_events,
            "List a run from its events file (tune-engine train --events FILE: a run on other processes "
            "or machines) and draw its loss as it trains; remembered for the next start.",
        )
        self.remove_button = QToolButton()
        self.remove_button.setText("Remove folder")
        self.remove_button.setPopupMode(QToolButton.InstantPopup)
        self.remove_button.setToolTip("Stop listing a folder you added (nothing is deleted)")
        self.remove_menu = QMenu(self)
        self.remove_button.setMenu(self.remove_menu)
        self.refresh_button = action_button(
            "Refresh", self.refresh, "Read the run records again (F5); it also happens by itself"
        )
        top = QHBoxLayout()
        top.addWidget(title)
        top.addWidget(self.folders_label, 1)
        top.addWidget(self.add_button)
        top.addWidget(self.follow_button)
        top.addWidget(self.remove_button)
        top.addWidget(self.refresh_button)

        self.model = RunsModel(self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.Interactive)
        header.setStretchLastSection(True)
        for col, width in enumerate((170, 150, 64, 76, 76, 110, 110, 150, 160)):
            header.resizeSection(col, width)
        self.table.setToolTip(
            "Select a run to see its adapter and checkpoints; select several (Ctrl or Shift) to compare "
            "their loss. Enter or a double-click: chat with it."
        )
        self.table.selectionModel().selectionChanged.connect(self._selection_changed)
        self.table.doubleClicked.connect(lambda _: self.chat())
        self.empty_label = FaintLabel(wrap=True)
        self.empty_label.hide()

        self.plot = LossOverlayWidget()
        self.details = self._build_details()
        bottom = splitter(Qt.Horizontal, (self.plot, self.details), stretch=(3, 2))
        upper = QWidget()
        ul = QVBoxLayout(upper)
        ul.setContentsMargins(0, 0, 0, 0)
        ul.addWidget(self.table, 1)
        ul.addWidget(self.empty_label)
        split = splitter(Qt.Vertical, (upper, bottom), stretch=(1, 1))
        self.splitter = split

        self.chat_button = action_button(
            "Chat with it", self.chat, "Open the Chat page with this run's adapter (Enter)"
        )
        self.rate_button = action_button(
            "Rate answers", self.rate, "Continue this adapter with rating rounds on the Rewards page"
        )
        self.export_button = action_button(
            "Export…",
            self.export,
            "Export this run's adapter (or merge it into the model) on the Export page",
        )
        self.resume_button = action_button(
            "Resume",
            self.resume,
            "Continue this stopped (or failed) run from its last checkpoint to its planned end, with its own "
            "settings and data, on the Train page (its model is opened when another one is)",
        )
        self.why_label = FaintLabel(wrap=True, squeeze=True)
        actions = QHBoxLayout()
        actions.addWidget(self.chat_button)
        actions.addWidget(self.rate_button)
        actions.addWidget(self.export_button)
        actions.addWidget(self.resume_button)
        actions.addWidget(self.why_label, 1)

        layout = PageLayout(self)  # fills the height it is given: the buttons stay in view
        layout.setContentsMargins(6, 6, 6, 6)
        layout.setSpacing(4)
        layout.addLayout(top)
        layout.addWidget(split, 1)
        layout.addLayout(actions)

        QShortcut(QKeySequence("F5"), self, self.refresh, context=Qt.WidgetWithChildrenShortcut)
        for key in ("Return", "Enter"):
            QShortcut(QKeySequence(key), self.table, self.chat, context=Qt.WidgetShortcut)

        self.watcher = QFileSystemWatcher(self)
        self.watcher.directoryChanged.connect(self._folder_changed)
        self.watcher.fileChanged.connect(self._folder_changed)
        self._settle = QTimer(self)
        self._settle.setSingleShot(True)
        self._settle.setInterval(SETTLE_MS)
        self._settle.timeout.connect(self.refresh)
        self.poll = QTimer(self)
        self.poll.setInterval(POLL_MS)
        self.poll.timeout.connect(self.refresh)

        self.refresh()
        self._update_buttons()

    def _build_details(self) -> QWidget:
        box = QGroupBox("Selected run")
        self.detail_title = wrapping_label("Select a run.")
        self.detail_status = wrapping_label(interaction=Qt.TextSelectableByMouse)
        self.adapter_label = ElidedLabel("–")  # a path: one line, elided in the middle, whole in the tooltip
        self.checkpoints_label = ElidedLabel("–")
        self.settings_label = wrapping_label("–")
        self.open_adapter_button = action_button(
            "Open folder",
            lambda: self._open(self._adapter_folder()),
            "Show the adapter's folder in the file browser",
        )
        self.open_checkpoints_button = action_button(
            "Open folder",
            lambda: self._open(self._checkpoint_folder()),
            "Show the run's checkpoint folder in the file browser",
        )
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.setVerticalSpacing(3)
        form.addRow("Adapter:", self._row(self.adapter_label, self.open_adapter_button))
        form.addRow("Checkpoints:", self._row(self.checkpoints_label, self.open_checkpoints_button))
        form.addRow("Settings:", self.settings_label)
        self.samples_table = SampleAnswersTable()  # the run's sample answers, when it had prompts
        self.samples_table.setMinimumHeight(120)
        self.samples_table.hide()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addWidget(self.detail_title)
        layout.addWidget(self.detail_status)
        layout.addLayout(form)
        layout.addWidget(self.samples_table, 1)
        layout.addStretch(1)
        box.setMinimumWidth(300)
        return box

    @staticmethod
    def _row(label: QLabel, button: QPushButton) -> QWidget:
        w = QWidget()
        row = QHBoxLayout(w)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(label, 1)
        row.addWidget(button)
        return w

    # --- public API ---------------------------------------------------------------------------
    def set_model_info(self, info: ModelInfo | None) -> None:
        """The open model: runs of other models are marked, and cannot be chatted with or rated."""
        self.info = info
        self.model.set_model(info.path if info is not None else self.project.model_path)
        self._update_buttons()

    def refresh(self) -> None:
        """Read the run records again (the selection is kept)."""
        folders = run_folders(self.project, self.settings)
        runs = load_runs(self.project, self.settings)
        signature = tuple((r.path, r.updated, r.status) for r in runs)
        self._watch(folders, runs)
        self._show_folders(folders)
        if signature == self._signature:
            return
        self._signature = signature
        chosen = {r.path for r in self.selected_runs()}
        current = self.current_run()
        current_path = current.path if current is not None else None
        self.model.set_model(self.model_path())
        self.model.set_runs(runs)
        sel = self.table.selectionModel()
        for row, r in enumerate(runs):
            if r.path in chosen:
                sel.select(self.model.index(row, 0), QItemSelectionModel.Select | QItemSelectionModel.Rows)
            if r.path == current_path:
                sel.setCurrentIndex(self.model.index(row, 0), QItemSelectionModel.NoUpdate)
        if not runs:
            self.empty_label.setText(
                "No runs yet. A run appears here when it starts (Train page) or when rating rounds are "
                "applied (Rewards page); add another folder to list older runs."
            )
        self.empty_label.setVisible(not runs)
        self._selection_changed()

    def runs(self) -> list[RunRecord]:
        return list(self.model.runs)

    def selected_runs(self) -> list[RunRecord]:
        rows = sorted({i.row() for i in self.table.selectionModel().selectedRows()})
        return [self.model.runs[r] for r in rows if r < len(self.model.runs)]

    def current_run(self) -> RunRecord | None:
        """The run the buttons act on: the focused selected row, else the first selected."""
        selected = self.selected_runs()
        index = self.table.currentIndex()
        if index.isValid() and index.row() < len(self.model.runs):
            run = self.model.runs[index.row()]
            if run in selected:
                return run
        return selected[0] if selected else None

    def select_runs(self, names: list[str]) -> None:
        """Select the runs with these names (tests, and the window after a run)."""
        sel = self.table.selectionModel()
        sel.clearSelection()
        for row, r in enumerate(self.model.runs):
            if r.name in names:
                sel.select(self.model.index(row, 0), QItemSelectionModel.Select | QItemSelectionModel.Rows)
                sel.setCurrentIndex(self.model.index(row, 0), QItemSelectionModel.NoUpdate)

    def add_folder(self, folder: str) -> None:
        folder = os.path.abspath(folder)
        set_extra_folders(self.settings, [*extra_folders(self.settings), folder])
        self._signature = ()
        self.refresh()

    def remove_folder(self, folder: str) -> None:
        set_extra_folders(self.settings, [f for f in extra_folders(self.settings) if f != folder])
        self._signature = ()
        self.refresh()

    def follow(self, events: str) -> None:
        """List the run of an events file and follow it as it grows."""
        add_followed(self.settings, events)
        self._signature = ()
        self.refresh()

    def unfollow(self, events: str) -> None:
        remove_followed(self.settings, events)
        self._signature = ()
        self.refresh()

    def choose_events(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Follow a run's events file", self.project.output_folder(), "Events (*.jsonl);;All (*)"
        )
        if path:
            self.follow(path)

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of runs", self.project.output_folder())
        if folder:
            self.add_folder(folder)

    # --- actions ------------------------------------------------------------------------------
    def _usable(self, run: RunRecord | None) -> str:
        """Why the run's adapter cannot be used now ('' when it can)."""
        if run is None:
            return "Select a run."
        if not has_adapter(run):
            if run.status in ("running", "paused"):
                return f"{run.name} has not written its adapter yet: it is {status_text(run)}."
            return f"{run.name} left no adapter file ({status_text(run)})."
        if not same_model(run, self.model_path()):
            return (
                f"{run.name} was trained on {os.path.basename(run.model)}, not the open model: open that "
                "model on the Model page to use it."
            )
        return ""

    def chat(self) -> None:
        run = self.current_run()
        if not self._usable(run):
            self.sig_chat_requested.emit(run.adapter, run_label(run))

    def rate(self) -> None:
        run = self.current_run()
        if not self._usable(run):
            self.sig_rate_requested.emit(run.adapter)

    def export(self) -> None:
        run = self.current_run()
        if not self._usable(run):
            self.sig_export_requested.emit(run.adapter)

    def resume(self) -> None:
        run = self.current_run()
        ckpt = resume_checkpoint(run) if run is not None else None
        if ckpt:
            self.sig_resume_requested.emit(ckpt, run.model or "")

    def _update_buttons(self) -> None:
        run = self.current_run()
        why = self._usable(run)
        for b in (self.chat_button, self.rate_button, self.export_button):
            b.setEnabled(not why)
        ckpt = resume_checkpoint(run) if run is not None else None
        self.resume_button.setEnabled(bool(ckpt))
        if ckpt:
            why = f"{run.name} {status_text(run)}: Resume continues it from {os.path.basename(ckpt)}."
        self.why_label.setText(why if run is not None else "")

    # --- selection and details ----------------------------------------------------------------
    def _selection_changed(self, *_: object) -> None:
        selected = self.selected_runs()
        self.plot.set_runs(selected)
        self._show_details(self.current_run())
        self._update_buttons()

    def _show_details(self, run: RunRecord | None) -> None:
        self.samples_table.clear_rows()
        self.samples_table.setVisible(bool(run is not None and run.sample_answers))
        for step, prompt, answer in run.sample_answers if run is not None else []:
            self.samples_table.add_event(SampleAnswers(step, [prompt], [answer]))
        if run is None:
            self.detail_title.setText("Select a run." if self.model.runs else "")
            for w in (self.detail_status, self.adapter_label, self.checkpoints_label, self.settings_label):
                w.setText("–" if w is not self.detail_status else "")
            self.open_adapter_button.setEnabled(False)
            self.open_checkpoints_button.setEnabled(False)
            return
        kind = "rating rounds" if run.kind == "rewards" else "training run"
        self.detail_title.setText(f"<b>{run.name}</b> ({kind})")
        steps = f"{run.steps_done} of {run.steps_planned or '?'} steps"
        loss = f", final loss {run.final_loss:.4f}" if run.final_loss is not None else ""
        self.detail_status.setText(f"{status_text(run)} · {steps}{loss}")
        self.adapter_label.setText(
            _two_lines(run.adapter, "" if has_adapter(run) else " (not written)")
            if run.adapter
            else "none named"
        )
        ckpt = run.last_checkpoint or run.checkpoints
        self.checkpoints_label.setText(_two_lines(ckpt) if ckpt else "none")
        cfg = run.config or {}
        bits = [f"rank {run.rank}", f"alpha {run.alpha:g}"]
        for key, name in (("lr", "lr"), ("steps", "steps"), ("batch_size", "batch"), ("mode", "mode")):
            if key in cfg:
                bits.append(f"{name} {cfg[key]:g}" if isinstance(cfg[key], float) else f"{name} {cfg[key]}")
        self.settings_label.setText(", ".join(bits))
        self.open_adapter_button.setEnabled(bool(self._adapter_folder()))
        self.open_checkpoints_button.setEnabled(bool(self._checkpoint_folder()))

    def _adapter_folder(self) -> str | None:
        run = self.current_run()
        if run is None or not run.adapter:
            return None
        folder = run.adapter if os.path.isdir(run.adapter) else os.path.dirname(run.adapter)
        return folder if os.path.isdir(folder) else None

    def _checkpoint_folder(self) -> str | None:
        run = self.current_run()
        if run is None:
            return None
        for folder in (run.checkpoints, os.path.dirname(run.path) if run.path else None):
            if folder and os.path.isdir(folder):
                return folder
        return None

    def _open(self, folder: str | None) -> None:
        if folder:
            self.open_url(QUrl.fromLocalFile(folder))

    # --- watching -----------------------------------------------------------------------------
    def _watch(self, folders: list[str], runs: list[RunRecord]) -> None:
        want = set()
        for folder in folders:
            if os.path.isdir(folder):
                want.add(os.path.abspath(folder))
        for r in runs:
            if r.path:
                want.add(os.path.dirname(os.path.abspath(r.path)))
        have = set(self.watcher.directories())
        if want - have:
            self.watcher.addPaths(sorted(want - have))
        if have - want:
            self.watcher.removePaths(sorted(have - want))
        # a followed run's events file grows in place: watch the file itself
        files = {os.path.abspath(p) for p in followed_events(self.settings) if os.path.isfile(p)}
        watched = set(self.watcher.files())
        if files - watched:
            self.watcher.addPaths(sorted(files - watched))

    def _folder_changed(self, _path: str) -> None:
        self._settle.start()

    def _show_folders(self, folders: list[str]) -> None:
        added = extra_folders(self.settings)
        first = folders[0] if folders else "?"
        more = f" and {len(added)} added folder{'s' if len(added) != 1 else ''}" if added else ""
        self.folders_label.setText(f"in {first}{more}")
        self.folders_label.setToolTip("Runs are read from:\n" + "\n".join(folders))
        self.remove_menu.clear()
        for folder in added:
            self.remove_menu.addAction(folder, lambda f=folder: self.remove_folder(f))
        followed = followed_events(self.settings)
        for events in followed:
            self.remove_menu.addAction(f"Stop following {events}", lambda f=events: self.unfollow(f))
        self.remove_button.setEnabled(bool(added or followed))

    def _project_changed(self, changed: set[str]) -> None:
        if changed & RUNS_MOVED:
            if "model_path" in changed and self.info is None:
                self.model.set_model(self.project.model_path)
            self.refresh()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self.refresh()
        self.poll.start()

    def hideEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.poll.stop()
        super().hideEvent(event)


__all__ = ["RunsPage"]
