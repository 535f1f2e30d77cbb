"""The main window: one page per step of the work (Model, Dataset, Targets, Train, Rewards, Export)
in a left navigation, the project's File menu, a status bar, and remembered state.

The pages are listed once, in `PAGE_TABLE` (name, attribute, how to make it): the navigation, the
View menu's Ctrl+1… shortcuts and `PAGES` follow from it, so adding a page is one line there. Each
page sits in a scroll area, so the window goes down to 1024×640 and a page that needs more room
scrolls instead of being cut off. A first-run strip at the top ("Model ✓ · Dataset ✓ 12 samples ·
Targets ✓ · Start training →", `studio.widgets.first_steps`) leads a newcomer through the pages until
they have trained once; Help has a quick start and the list of every keyboard shortcut (read from
the actions when it opens); View has the theme (System / Light / Dark, remembered).

The window owns the `Project`, the dataset being edited (`window.dataset`, a `DatasetDocument`
that the Dataset page edits and the other pages read), the app's one engine worker
(`studio.worker.Engine`: the open model, shared by every page) and the open model's `ModelInfo`,
and hands them to the pages; the pages change the project and listen to it, and submit their
engine work to the worker. Window geometry, the last page and recent files are kept with
QSettings. Files dropped anywhere on the window open by type (.gguf model, .jsonl dataset,
.json project); a dataset opened from the menu, a recent file or a drop shows the Dataset page.
Closing or replacing a project with unsaved changes asks Save / Discard / Cancel.

Unsaved changes to the dataset and the project are copied to a recovery folder a few seconds after
each change (`studio.autosave`); after a crash, `offer_recovery()` (called by the app at start)
offers to restore them, through the replaceable `ask_restore` hook.

This module builds the window and holds what it does with the project and the pages; the parts that
read well alone are in `studio.window`: the page area, the menus and Help, the status bar, the
first-run strip's ticks, the recent files, the offer of autosaved changes.

What is left here (about 690 lines) stays whole on purpose: opening, saving and replacing the
project, the dataset and the model each touch the window's state, the pages and the worker together,
so split they would pass the whole window from module to module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from engine import Finished

from .autosave import Autosave, default_recovery_root
from .dataset_document import DatasetChange, DatasetDocument
from .pages.chat.page import ChatPage
from .pages.dataset.page import DatasetPage
from .pages.export.page import ExportPage
from .pages.model import ModelPage
from .pages.rewards.page import RewardsPage
from .pages.runs.page import RunsPage
from .pages.targets.page import TargetsPage
from .pages.train.page import TrainPage
from .paths import same_file
from .project import ModelInfo, Project, ProjectError
from .widgets.first_steps import FirstStepsWidget
from .widgets.help_dialogs import QuickStartDialog, ShortcutsDialog
from .widgets.runs import remember_folder
from .widgets.theme import THEMES
from .window import first_run, menus, recovery
from .window.look import apply_look
from .window.page_area import PageAreaWidget, nav_width
from .window.recent import add_recent, refresh_recent_menus
from .window.status import build_status_bar
from .worker import Engine

# The pages in navigation order: (name, window attribute, how to make it from the window). The
# navigation, the View menu's shortcuts (Ctrl+1 …) and PAGES follow from this table.
PAGE_TABLE: tuple[tuple[str, str, Callable[[Any], QWidget]], ...] = (
    ("Model", "model_page", lambda w: ModelPage(w.project, w.engine)),
    ("Dataset", "dataset_page", lambda w: DatasetPage(w.project, w.dataset)),
    ("Targets", "targets_page", lambda w: TargetsPage(w.project, w.engine)),
    ("Train", "train_page", lambda w: TrainPage(w.project, w.engine, w.dataset, settings=w.settings)),
    ("Chat", "chat_page", lambda w: ChatPage(w.project, w.engine, settings=w.settings)),
    ("Rewards", "rewards_page", lambda w: RewardsPage(w.project, w.engine, settings=w.settings)),
    ("Export", "export_page", lambda w: ExportPage(w.project, w.engine, settings=w.settings)),
    ("Runs", "runs_page", lambda w: RunsPage(w.project, w.engine, settings=w.settings)),
)

PAGES = tuple(name for name, _, _ in PAGE_TABLE)
SETTINGS_ORG, SETTINGS_APP = "TuneStudio", "TuneStudio"
THEME_KEY = "view/theme"
FIRST_STEPS_KEY = "view/first_steps"  # false once the person has trained, or closed the strip


class MainWindow(QMainWindow):
    sig_model_changed = Signal(object)  # ModelInfo or None

    def __init__(
        self,
        settings: QSettings | None = None,
        engine: Engine | None = None,
        recovery_dir: str | os.PathLike[str] | None = None,
    ):
        """`recovery_dir`: where unsaved changes are autosaved; default AppDataLocation/recovery, or
        beside the settings file when `settings` is an .ini file of its own (tests, screenshots)."""
        super().__init__()
        self.settings = settings or QSettings(SETTINGS_ORG, SETTINGS_APP)
        self.project = Project()
        self.dataset = DatasetDocument()  # the samples being edited, read by every page
        self.dataset.protected = lambda: {  # a Save As never replaces another file of the project
            "model": self.project.model_path, "chat template": self.project.template_file,
            "project file": self.project.path,
        }  # fmt: skip
        self.engine = engine or Engine(self)
        self.model_info: ModelInfo | None = None
        self.theme = "system"
        self._quiet = 0  # > 0 while files open as part of something else (a project, the demo)
        self._clean_start = False  # start_project: the model's opening leaves the project unchanged
        self._pending_resume: str | None = None  # a checkpoint to resume once its model has opened
        # Questions to the person; replaced in tests and scripts.
        # confirm(title, text) -> bool: go ahead?
        self.confirm: Callable[[str, str], bool] = self._ask
        # ask_unsaved(text) -> "save" | "discard" | "cancel", before closing or replacing unsaved work
        self.ask_unsaved: Callable[[str], str] = self._ask_unsaved
        # ask_restore(title, text) -> True to restore an autosaved copy, False to discard it
        self.ask_restore: Callable[[str, str], bool] = lambda title, text: recovery.ask_restore(
            self, title, text
        )
        self.setWindowTitle("Tune Studio")
        self.resize(1280, 820)
        self.setAcceptDrops(True)

        self.page_names: list[str] = [name for name, _, _ in PAGE_TABLE]
        self.pages: list[QWidget] = []
        for _name, attribute, make in PAGE_TABLE:
            page = make(self)
            setattr(self, attribute, page)
            self.pages.append(page)

        self.nav = QListWidget()
        self.nav.setSpacing(2)
        self.nav.setStyleSheet("QListWidget { font-size: 14px; } QListWidget::item { padding: 6px 8px; }")
        self.nav.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.stack = QStackedWidget()
        for i, (name, page) in enumerate(zip(self.page_names, self.pages, strict=True)):
            item = QListWidgetItem(f"{i + 1}  {name}")
            item.setToolTip(f"{name} (Ctrl+{i + 1})" if i < 9 else name)
            self.nav.addItem(item)
            self.stack.addWidget(PageAreaWidget(page))
        self.nav.setFixedWidth(nav_width(self.nav, self.page_names))
        self.nav.currentRowChanged.connect(self.stack.setCurrentIndex)

        self.first_steps = FirstStepsWidget(
            [("Model", "Model"), ("Dataset", "Dataset"), ("Targets", "Targets"), ("Train", "Start training")]
        )
        self.first_steps.sig_step_clicked.connect(lambda name: self.show_page(self.page_names.index(name)))
        self.first_steps.sig_dismissed.connect(lambda: self.set_first_steps_shown(False))
        self._steps_timer = QTimer(self)  # the strip follows the project, once per burst of changes
        self._steps_timer.setSingleShot(True)
        self._steps_timer.setInterval(0)
        self._steps_timer.timeout.connect(self.update_first_steps)

        central = QWidget()
        outer = QVBoxLayout(central)
        outer.setContentsMargins(4, 4, 4, 0)
        outer.setSpacing(4)
        outer.addWidget(self.first_steps)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.nav)
        row.addWidget(self.stack, 1)
        outer.addLayout(row, 1)
        self.setCentralWidget(central)

        self.model_page.sig_model_opened.connect(self._model_opened)
        self.model_page.sig_error.connect(self._model_failed)
        self.dataset_page.sig_modified.connect(lambda _: self._update_title())
        self.dataset_page.sig_dataset_opened.connect(self._dataset_opened)
        self.dataset_page.sig_dataset_opening.connect(self._dataset_opening)
        self.targets_page.sig_selection_changed.connect(lambda _: self._steps_timer.start())
        # the Targets page's routing census: the Train page's expert heatmap compares the run with it
        self.targets_page.census_panel.sig_census.connect(self.train_page.plots.set_census)
        self.train_page.sig_state_changed.connect(self._training_state)
        self.train_page.sig_run_finished.connect(self._run_finished)
        self.train_page.sig_go_to_page.connect(self.show_page_named)
        self.runs_page.sig_chat_requested.connect(self._chat_with)
        self.runs_page.sig_rate_requested.connect(lambda path: self._rate_from(path, None))
        self.runs_page.sig_export_requested.connect(self._export_from)
        self.runs_page.sig_resume_requested.connect(self.resume_run)
        self.train_page.sig_open_dataset.connect(self._open_dataset_quietly)
        self.chat_page.sig_rate_requested.connect(self._rate_from)
        self.chat_page.sig_export_requested.connect(self._export_from)
        self.chat_page.sig_train_choices.connect(self._train_on_choices)
        self.rewards_page.sig_train_choices.connect(self._train_on_choices)
        self.rewards_page.sig_round_applied.connect(lambda _: self._refresh_runs())
        self.rewards_page.sig_adapter_saved.connect(lambda _: self._refresh_runs())
        # the Rewards page's "From dataset…" offers the dataset as edited, not only as saved: it is
        # told after each change (once per burst of changes, from the event loop)
        self._dataset_to_rewards = QTimer(self)
        self._dataset_to_rewards.setSingleShot(True)
        self._dataset_to_rewards.setInterval(0)
        self._dataset_to_rewards.timeout.connect(self._send_dataset_to_rewards)
        self.dataset.subscribe(self._dataset_changed)
        self.project.subscribe(self._project_changed)

        if recovery_dir is None:
            own_file = self.settings.format() == QSettings.IniFormat
            recovery_dir = (
                os.path.join(os.path.dirname(os.path.abspath(self.settings.fileName())), "recovery")
                if own_file
                else default_recovery_root()
            )
        self.autosave = Autosave(self.dataset, self.project, recovery_dir, parent=self)
        self.autosave.sig_failed.connect(
            lambda msg: self.statusBar().showMessage(
                f"Autosave failed: {msg}. Save your work (Ctrl+S) to keep it safe.", 15000
            )
        )

        menus.build_menus(self)
        build_status_bar(self)
        self._restore_state()
        self._update_title()
        self.update_first_steps()

    # --- pages and runs ----------------------------------------------------------------------
    def _run_finished(self, result) -> None:
        if isinstance(result, Finished):  # the person has trained: the first-run strip has done its job
            self.settings.setValue(FIRST_STEPS_KEY, False)
            self._show_first_steps(False)
        self._refresh_runs()  # Export, Rewards and Chat default to the latest finished run
        path = getattr(result, "adapter_path", None)
        if path:
            self.statusBar().showMessage(f"Adapter written: {path}", 8000)

    def _refresh_runs(self) -> None:
        """The run history changed (a run ended, a rating round was applied): every page reads it again."""
        self.export_page.refresh_runs()
        self.rewards_page.refresh_runs()
        self.chat_page.refresh_adapters()
        self.runs_page.refresh()
        self.train_page.refresh_resumable()

    def resume_run(self, checkpoint: str, model: str) -> bool:
        """Resume a run from the Runs page: on its own model (opened first when another one, or none,
        is open), from `checkpoint`, with the run's own settings; the Train page shows it."""
        if self.train_page.state in ("loading", "training", "pausing", "stopping"):
            self.statusBar().showMessage("A run is training: stop it before resuming another one", 8000)
            return False
        if model and not (self.project.model_path and same_file(model, self.project.model_path)):
            if not os.path.isfile(model):
                self.statusBar().showMessage(f"The run's model {model} does not exist any more", 10000)
                return False
            self._pending_resume = checkpoint
            self.open_model(model)
            self.show_page_named("Train")
            return True
        self.show_page_named("Train")
        return self.train_page.resume_from(checkpoint)

    def _open_dataset_quietly(self, path: str) -> None:
        with self._opening_quietly():
            self.open_dataset(path)

    def show_page_named(self, name: str) -> None:
        if name in self.page_names:
            self.show_page(self.page_names.index(name))

    def _chat_with(self, path: str, label: str) -> None:
        self.chat_page.set_adapter(path, label)
        self.show_page_named("Chat")

    def _rate_from(self, path: str, prompt: str | None) -> None:
        """Rate answers of an adapter ("" : a new adapter on the base model), optionally on a prompt."""
        if path:
            self.rewards_page.start_from(path)
        else:
            self.rewards_page.set_adapter(None)
        if prompt:
            self.rewards_page.set_prompt(prompt)
        self.show_page_named("Rewards")

    def _train_on_choices(self, path: str) -> None:
        """A/B choices (a preferences file) become the dataset of a DPO run: the Dataset page opens the
        file (asking first about unsaved edits) and the Train page's objective is DPO."""
        if self.open_dataset(path):
            self.project.update_config(objective="dpo", reward_mode="none")
            self.show_page_named("Train")

    def _export_from(self, path: str) -> None:
        self.export_page.set_adapter(path)
        self.show_page_named("Export")

    def _training_state(self, state: str) -> None:
        self.state_label.setText(f"Training: {state}")
        paths = self.train_page.paths
        if state == "loading" and paths is not None:
            folder = os.path.dirname(os.path.abspath(paths.out))
            if not same_file(folder, self.project.default_output_folder()) and remember_folder(
                self.settings, folder
            ):
                self.runs_page.refresh()  # a run outside the model's runs home is listed after a relaunch

    def show_page(self, index: int) -> None:
        self.nav.setCurrentRow(index)

    def current_page(self) -> QWidget:
        """The page on show (the stack holds each page inside a scroll area)."""
        return self.pages[self.stack.currentIndex()]

    # --- first steps, theme, help ----------------------------------------------------------------
    def _setting_bool(self, key: str, default: bool) -> bool:
        value = self.settings.value(key, default)
        return value.lower() not in ("false", "0", "") if isinstance(value, str) else bool(value)

    def set_first_steps_shown(self, shown: bool) -> None:
        """Show or hide the first-run strip, and remember it."""
        self.settings.setValue(FIRST_STEPS_KEY, bool(shown))
        self._show_first_steps(shown)

    def _show_first_steps(self, shown: bool) -> None:
        self.first_steps.setVisible(shown)
        self.action_first_steps.setChecked(shown)

    def update_first_steps(self) -> None:
        """Tick the strip's steps from the open model, the dataset and the targets."""
        self._steps_timer.stop()
        first_run.update_first_steps(self)

    def set_theme(self, theme: str) -> None:
        """System (the desktop's look), light or dark; remembered for the next start."""
        if theme not in THEMES:
            raise ValueError(f"theme must be one of {', '.join(THEMES)}, got {theme!r}")
        apply_look(self, self.theme, theme)  # studio.window.look
        self.theme = theme
        self.settings.setValue(THEME_KEY, theme)
        self.theme_actions[theme].setChecked(True)

    def quick_start_steps(self) -> list[tuple[str, str, str]]:
        """(page, title, text) of each page's step, with the window's real shortcuts."""
        return menus.quick_start_steps(self)

    def show_quick_start(self) -> QuickStartDialog:
        dialog = QuickStartDialog(self.quick_start_steps(), self)
        dialog.sig_page_requested.connect(lambda name: self.show_page(self.page_names.index(name)))
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.show()
        return dialog

    def shortcut_rows(self) -> list[tuple[str, str, str]]:
        """(where, what, keys) of every keyboard shortcut: the menus', then each page's."""
        return menus.shortcut_rows(self)

    def show_shortcuts(self) -> ShortcutsDialog:
        dialog = ShortcutsDialog(self.shortcut_rows(), self)
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.show()
        return dialog

    # --- model and project ---------------------------------------------------------------------
    @contextmanager
    def _opening_quietly(self) -> Iterator[None]:
        """Files opened as part of something else (a project, the demo) do not switch pages."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def open_model(self, path: str) -> bool:
        ok = self.model_page.open_path(path)
        self._steps_timer.start()
        return ok

    def open_dataset(self, path: str) -> bool:
        """Open a dataset file in the editor; the Dataset page shows it (unless it opens as part of a
        project)."""
        return self.dataset_page.open_path(path)

    def start_project(
        self,
        model: str,
        dataset: str | None = None,
        output_dir: str | None = None,
        config: dict | None = None,
    ) -> None:
        """Open a model and a dataset with these settings as a new, untitled project that has no
        unsaved changes yet (the demo): nothing is marked changed until the person changes something."""
        with self._opening_quietly():
            if output_dir:
                self.project.update(output_dir=output_dir)
            self.open_model(model)
            if dataset:
                self.open_dataset(dataset)
            if config:
                self.project.update_config(**config)
        self.project.dirty = False
        # what pages change when the model has opened (in the worker, later) is part of opening it
        self._clean_start = self.model_page.opening is not None
        self._update_title()

    def _model_opened(self, info: ModelInfo) -> None:
        self.model_info = info
        for page in self.pages:  # every page learns the new model and drops what was the old one's
            if page is not self.model_page and hasattr(page, "set_model_info"):
                page.set_model_info(info)
        if self._clean_start:
            self._clean_start = False
            self.project.dirty = False
        add_recent(self, "recent/models", info.path)
        c = info.summary.config
        self.statusBar().showMessage(
            f"Opened {Path(info.path).name}: {c.arch}, {info.summary.n_params:,} parameters", 6000
        )
        self.sig_model_changed.emit(info)
        self._update_title()
        self.update_first_steps()
        pending, self._pending_resume = self._pending_resume, None
        if pending:  # the Runs page asked to resume a run of this model
            self.train_page.resume_from(pending)

    def _model_failed(self, _message: str) -> None:
        self._clean_start = False
        self._pending_resume = None
        self.statusBar().showMessage("Could not open the model: see the Model page", 8000)
        self._steps_timer.start()

    def _dataset_opened(self, path: str) -> None:
        add_recent(self, "recent/datasets", path)
        if not self._quiet:
            self.show_page(self.page_names.index("Dataset"))

    def _dataset_opening(self, _path: str) -> None:
        """A large file is being read in the background: show its progress on the Dataset page."""
        if not self._quiet:
            self.show_page(self.page_names.index("Dataset"))

    def _dataset_changed(self, change: DatasetChange) -> None:
        if change.kind in ("reset", "inserted", "removed", "moved", "changed", "path"):
            self._dataset_to_rewards.start()
            self._steps_timer.start()

    def _send_dataset_to_rewards(self) -> None:
        doc = self.dataset
        # nothing opened or added: the Rewards page reads the project's dataset file itself
        self.rewards_page.set_dataset_samples(doc.samples() if doc.path or len(doc) else None)

    def _project_changed(self, changed: set[str]) -> None:
        if "device" in changed:
            self.device_label.setText(
                f"Device: {'CPU (NumPy)' if self.project.device == 'cpu' else self.project.device}"
            )
        if changed & {"model_path", "config"}:
            self._steps_timer.start()
        self._update_title()

    def _update_title(self) -> None:
        name = Path(self.project.path).name if self.project.path else "untitled project"
        dirty = self.project.dirty or self.dataset.dirty
        model = f" — {Path(self.project.model_path).name}" if self.project.model_path else ""
        self.setWindowTitle(f"Tune Studio — {name}{' *' if dirty else ''}{model}")

    def new_project(self) -> bool:
        """Start again: a run in progress ends first (with its checkpoint), unsaved changes are asked
        about, then every page and the engine session forget the old project: no model, no dataset,
        no run, no conversation, no rating session, no export result. Files on disk stay."""
        if self.train_page.is_running() or self.train_page.state == "paused":
            if not self.confirm(
                "Stop training?",
                "Training is running. Stop it (a checkpoint is written) and start a new project?",
            ):
                return False
            if not self.train_page.stop_and_wait():
                return False
        if not self._maybe_save():
            return False
        self.chat_page.shutdown()
        self.export_page.shutdown()
        self.train_page.reset()
        self.project.reset()  # every page hears that the model, the dataset and the settings changed
        self.dataset.reset()  # the Dataset page follows its document
        self.model_info = None
        self.model_page.clear()
        for page in self.pages:
            if page is not self.model_page and hasattr(page, "set_model_info"):
                page.set_model_info(None)
        self.chat_page.new_chat()
        self.rewards_page.reset()
        self.export_page.reset()

        def forget_run(session, job) -> None:  # the engine session keeps no run of the old project
            if session is not None:
                session.forget_run()
                session.set_template_file(None)

        self.engine.submit("starting a new project", forget_run, needs_session=False)
        self.sig_model_changed.emit(None)
        self.autosave.clear()
        self.project.dirty = False
        self._refresh_runs()
        self.show_page(0)
        self._update_title()
        self.update_first_steps()
        self.statusBar().showMessage("New project: open a model to begin", 6000)
        return True

    def open_project_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open project", "", "Tune Studio projects (*.json);;All files (*)"
        )
        if path:
            self.open_project(path)

    def open_project(self, path: str) -> bool:
        if not self._maybe_save():
            return False
        ask = self.dataset_page.ask_unsaved
        self.dataset_page.ask_unsaved = lambda: "discard"  # answered just now
        try:
            with self._opening_quietly():
                try:
                    self.project.load(path)
                except ProjectError as exc:
                    QMessageBox.warning(self, "Cannot open project", f"{exc}\n\nChoose another project file.")
                    return False
                if self.project.model_path:
                    self.open_model(self.project.model_path)
                if self.project.dataset_path:
                    self.open_dataset(self.project.dataset_path)
        finally:
            self.dataset_page.ask_unsaved = ask
        add_recent(self, "recent/projects", path)
        self._update_title()
        return True

    def save_all(self) -> bool:
        """Save the dataset if it changed, then the project (asking for a name the first time)."""
        if self.dataset.dirty and not self.dataset_page.save():
            return False
        if self.project.path:
            return self._save_project(self.project.path)
        return self.save_project_as()

    def save_project_as(self) -> bool:
        path, _ = QFileDialog.getSaveFileName(
            self, "Save project", "project.tune.json", "Tune Studio projects (*.json)"
        )
        return bool(path) and self._save_project(path)

    def _save_project(self, path: str) -> bool:
        try:
            self.project.save(path)
        except ProjectError as exc:
            QMessageBox.warning(self, "Cannot save project", f"{exc}\n\nChoose another folder or file name.")
            return False
        add_recent(self, "recent/projects", path)
        self.statusBar().showMessage(f"Saved {path}", 4000)
        self._update_title()
        return True

    def unsaved_text(self) -> str:
        """What has unsaved changes, as a sentence ("" when nothing has)."""
        parts = []
        if self.dataset.dirty:
            name = Path(self.dataset.path).name if self.dataset.path else "the new dataset"
            parts.append(f"the dataset {name}")
        if self.project.dirty:
            name = Path(self.project.path).name if self.project.path else "the untitled project"
            parts.append(f"the project {name}" if self.project.path else name)
        return " and ".join(parts)

    def _maybe_save(self) -> bool:
        """Before closing or replacing the work: True to go on (nothing unsaved, saved, or discarded)."""
        what = self.unsaved_text()
        if not what:
            return True
        answer = self.ask_unsaved(f"Save the changes to {what}?")
        if answer == "save":
            return self._save_changes()
        return answer == "discard"

    def _save_changes(self) -> bool:
        """Save what changed: the dataset if it did, the project if it did (asking for a name)."""
        if self.dataset.dirty and not self.dataset_page.save():
            return False
        if self.project.dirty:
            return self._save_project(self.project.path) if self.project.path else self.save_project_as()
        return True

    def _ask_unsaved(self, text: str) -> str:
        if self.confirm != self._ask:  # a script that answers confirm(): True discards, False cancels
            return "discard" if self.confirm("Discard changes?", f"{text} Discard them?") else "cancel"
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Warning)
        box.setWindowTitle("Unsaved changes")
        box.setText(text)
        box.setInformativeText("If you don't save them, your changes are lost.")
        box.setStandardButtons(QMessageBox.Save | QMessageBox.Discard | QMessageBox.Cancel)
        box.setDefaultButton(QMessageBox.Save)
        box.setEscapeButton(QMessageBox.Cancel)
        answer = box.exec()
        return {QMessageBox.Save: "save", QMessageBox.Discard: "discard"}.get(answer, "cancel")

    # --- remembered state ----------------------------------------------------------------------
    def _restore_state(self) -> None:
        geometry = self.settings.value("main/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        state = self.settings.value("main/state")
        if state is not None:
            self.restoreState(state)
        page = self.settings.value("main/page", 0)
        self.show_page(int(page) if str(page).isdigit() and int(page) < len(self.pages) else 0)
        refresh_recent_menus(self)
        self._show_first_steps(self._setting_bool(FIRST_STEPS_KEY, True))
        theme = self.settings.value(THEME_KEY, "system")
        if theme in THEMES and theme != "system":
            self.set_theme(theme)
        else:
            self.theme_actions["system"].setChecked(True)

    # --- drag and drop, closing ------------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt override
        urls = event.mimeData().urls()
        if urls and Path(urls[0].toLocalFile()).suffix.lower() in (".gguf", ".jsonl", ".json"):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt override
        for url in event.mimeData().urls():
            self.open_any(url.toLocalFile())

    def open_any(self, path: str) -> bool:
        suffix = Path(path).suffix.lower()
        if suffix == ".gguf":
            ok = self.open_model(path)
            self.show_page(self.page_names.index("Model"))
        elif suffix == ".jsonl":
            ok = self.open_dataset(path)
            self.show_page(self.page_names.index("Dataset"))
        elif suffix == ".json":
            ok = self.open_project(path)
        else:
            self.statusBar().showMessage(
                f"{Path(path).name}: not a .gguf model, .jsonl dataset or .json project", 6000
            )
            ok = False
        return ok

    def _ask(self, title: str, text: str) -> bool:
        return QMessageBox.question(self, title, text) == QMessageBox.Yes

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        if self.train_page.is_running():
            if not self.confirm(
                "Stop training?", "Training is running. Stop it (a checkpoint is written) and quit?"
            ):
                event.ignore()
                return
        if self.train_page.is_running() or self.train_page.state == "paused":
            # training ends first, with its checkpoint, before any other question: nothing trains on
            # behind a dialog, and the run is stopped whatever is answered next
            self.statusBar().showMessage(
                "Stopping training: the current step ends, then a checkpoint is written…"
            )
            if not self.train_page.stop_and_wait():
                self.statusBar().showMessage("Training did not stop in time; close again to retry", 10000)
                event.ignore()
                return
        if not self._maybe_save():
            event.ignore()
            return
        self.autosave.close()  # a clean close: saved or discarded, so no copy is kept
        self.train_page.shutdown()
        self.dataset_page.shutdown()
        self.chat_page.shutdown()
        self.rewards_page.shutdown()
        self.export_page.shutdown()
        self.engine.shutdown()  # nothing long is left: a check or an answer stops at once
        self.settings.setValue("main/geometry", self.saveGeometry())
        self.settings.setValue("main/state", self.saveState())
        self.settings.setValue("main/page", self.nav.currentRow())
        super().closeEvent(event)

    # --- recovery after a crash -----------------------------------------------------------------
    def offer_recovery(self) -> bool:
        """Offer to restore the unsaved changes autosaved by windows that did not close (a crash),
        newest first, through `ask_restore` (studio.window.recovery); call it once, at start, before
        opening files. True when a copy was restored."""
        restored = recovery.offer_recovery(self)
        if restored:
            self._update_title()
        return restored
