"""The main window: one page per step of the work (Model, Dataset, Targets, Train, Rewards, Export)
in a left navigation, the project's File menu, a status bar, and remembered state.

The window owns the `Project`, the dataset being edited (`window.dataset`, a `DatasetDocument`
that the Dataset page edits and the other pages read), the app's one engine worker
(`studio.worker.Engine`: the open model, shared by every page) and the open model's `ModelInfo`,
and hands them to the pages; the pages change the project and listen to it, and submit their
engine work to the worker. Window geometry, the last page and recent files are kept with
QSettings. Files dropped anywhere on the window open by type (.gguf model, .jsonl dataset,
.json project).

Unsaved changes to the dataset and the project are copied to a recovery folder a few seconds after
each change (`studio.autosave`); after a crash, `offer_recovery()` (called by the app at start)
offers to restore them, through the replaceable `ask_restore` hook.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QStackedWidget,
    QWidget,
)

from engine import human_bytes

from .autosave import Autosave, Recovery, default_recovery_root
from .dataset_document import DatasetChange, DatasetDocument
from .pages.dataset.page import DatasetPage
from .pages.export.page import ExportPage
from .pages.model import ModelPage
from .pages.rewards.page import RewardsPage
from .pages.targets.page import TargetsPage
from .pages.train.page import TrainPage
from .project import ModelInfo, Project, ProjectError
from .worker import Engine

PAGES = ("Model", "Dataset", "Targets", "Train", "Rewards", "Export")
MAX_RECENT = 10
SETTINGS_ORG, SETTINGS_APP = "TuneStudio", "TuneStudio"


def process_memory_bytes(pid: int | str = "self") -> int | None:
    """Resident memory of a process (this one by default; Linux /proc), or None where unavailable."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


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
        self.engine = engine or Engine(self)
        self.model_info: ModelInfo | None = None
        self.confirm = self._ask  # replaced in tests: (title, text) -> bool
        # replaced in tests: (title, text) -> True to restore an autosaved copy, False to discard it
        self.ask_restore: Callable[[str, str], bool] = self._ask_restore
        self.setWindowTitle("Tune Studio")
        self.resize(1280, 820)
        self.setAcceptDrops(True)

        self.model_page = ModelPage(self.project, self.engine)
        self.dataset_page = DatasetPage(self.project, self.dataset)
        self.targets_page = TargetsPage(self.project)
        self.train_page = TrainPage(self.project, self.engine, self.dataset)
        self.rewards_page = RewardsPage(self.project, self.engine)
        self.export_page = ExportPage(self.project, self.engine)
        self.pages = [
            self.model_page,
            self.dataset_page,
            self.targets_page,
            self.train_page,
            self.rewards_page,
            self.export_page,
        ]

        self.nav = QListWidget()
        self.nav.setFixedWidth(150)
        self.nav.setSpacing(2)
        self.nav.setStyleSheet("QListWidget { font-size: 14px; } QListWidget::item { padding: 8px 10px; }")
        self.stack = QStackedWidget()
        for i, (name, page) in enumerate(zip(PAGES, self.pages, strict=True)):
            item = QListWidgetItem(f"{i + 1}  {name}")
            item.setToolTip(f"{name} (Ctrl+{i + 1})")
            self.nav.addItem(item)
            self.stack.addWidget(page)
        self.nav.currentRowChanged.connect(self.stack.setCurrentIndex)
        central = QWidget()
        layout = QHBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.nav)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        self.model_page.sig_model_opened.connect(self._model_opened)
        self.model_page.sig_error.connect(
            lambda msg: self.statusBar().showMessage("Could not open the model", 8000)
        )
        self.dataset_page.sig_modified.connect(lambda _: self._update_title())
        self.dataset_page.sig_dataset_opened.connect(lambda p: self._add_recent("recent/datasets", p))
        self.train_page.sig_state_changed.connect(self._training_state)
        self.train_page.sig_run_finished.connect(self._run_finished)
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

        self._build_menus()
        self._build_status_bar()
        self._restore_state()
        self._update_title()

    # --- menus and status --------------------------------------------------------------------
    def _action(self, text: str, slot, shortcut=None, tip: str = "") -> QAction:
        a = QAction(text, self)
        if shortcut is not None:
            a.setShortcut(QKeySequence(shortcut))
        if tip:
            a.setStatusTip(tip)
            a.setToolTip(tip)
        a.triggered.connect(slot)
        return a

    def _build_menus(self) -> None:
        m = self.menuBar().addMenu("&File")
        m.addAction(
            self._action("&New project", self.new_project, QKeySequence.New, "Start a new, empty project")
        )
        m.addAction(
            self._action(
                "&Open project…", self.open_project_dialog, "Ctrl+Shift+P", "Open a saved project (.json)"
            )
        )
        self.recent_projects_menu = m.addMenu("Recent projects")
        m.addAction(
            self._action(
                "&Save", self.save_all, QKeySequence.Save, "Save the project and the dataset if it changed"
            )
        )
        m.addAction(
            self._action(
                "Save project &as…", self.save_project_as, "Ctrl+Alt+S", "Save the project under a new name"
            )
        )
        m.addSeparator()
        m.addAction(
            self._action("Open &model…", self.model_page.choose_file, QKeySequence.Open, "Open a .gguf model")
        )
        self.recent_models_menu = m.addMenu("Recent models")
        dataset_actions = self.dataset_page.actions()
        for action in dataset_actions:
            if action.text().startswith("Open dataset"):
                action.setShortcutContext(Qt.WindowShortcut)  # works from every page
                m.addAction(action)
        m.addSeparator()
        m.addAction(self._action("&Quit", self.close, QKeySequence.Quit))
        edit = self.menuBar().addMenu("&Dataset")
        for action in dataset_actions:
            if action.shortcut() == QKeySequence(QKeySequence.Save):
                action.setShortcut(QKeySequence())  # File > Save (Ctrl+S) saves the dataset and the project
            edit.addAction(action)
        view = self.menuBar().addMenu("&View")
        for i, name in enumerate(PAGES):
            view.addAction(
                self._action(
                    name, lambda _=False, i=i: self.show_page(i), f"Ctrl+{i + 1}", f"Go to the {name} page"
                )
            )
        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction(self._action("&About Tune Studio", self._about))

    def _build_status_bar(self) -> None:
        sb = self.statusBar()
        self.device_label = QLabel("Device: CPU (NumPy)")
        self.memory_label = QLabel("")
        self.state_label = QLabel("Training: idle")
        self.engine_label = QLabel(self.engine.describe())
        self.engine.sig_jobs_changed.connect(lambda: self.engine_label.setText(self.engine.describe()))
        for w in (self.device_label, self.memory_label, self.state_label, self.engine_label):
            w.setContentsMargins(8, 0, 8, 0)
            sb.addPermanentWidget(w)
        self._memory_timer = QTimer(self)
        self._memory_timer.timeout.connect(self._update_memory)
        self._memory_timer.start(2000)
        self._update_memory()

    def _update_memory(self) -> None:
        n = process_memory_bytes()
        self.memory_label.setText(f"Memory: {human_bytes(n)}" if n is not None else "")

    def _run_finished(self, result) -> None:
        path = getattr(result, "adapter_path", None)
        if path:
            self.export_page.set_adapter(path)
            self.rewards_page.set_adapter(path)  # rating rounds continue from the trained adapter
            self.statusBar().showMessage(f"Adapter written: {path}", 8000)

    def _training_state(self, state: str) -> None:
        self.state_label.setText(f"Training: {state}")

    def show_page(self, index: int) -> None:
        self.nav.setCurrentRow(index)

    # --- model and project ---------------------------------------------------------------------
    def open_model(self, path: str) -> bool:
        return self.model_page.open_path(path)

    def open_dataset(self, path: str) -> bool:
        return self.dataset_page.open_path(path)

    def _model_opened(self, info: ModelInfo) -> None:
        self.model_info = info
        for page in self.pages[1:]:
            page.set_model_info(info)
        self._add_recent("recent/models", info.path)
        c = info.summary.config
        self.statusBar().showMessage(
            f"Opened {Path(info.path).name}: {c.arch}, {info.summary.n_params:,} parameters", 6000
        )
        self.sig_model_changed.emit(info)
        self._update_title()

    def _dataset_changed(self, change: DatasetChange) -> None:
        if change.kind in ("reset", "inserted", "removed", "moved", "changed", "path"):
            self._dataset_to_rewards.start()

    def _send_dataset_to_rewards(self) -> None:
        doc = self.dataset
        # nothing opened or added: the Rewards page reads the project's dataset file itself
        self.rewards_page.set_dataset_samples(doc.samples() if doc.path or len(doc) else None)

    def _project_changed(self, changed: set[str]) -> None:
        if "device" in changed:
            self.device_label.setText(
                f"Device: {'CPU (NumPy)' if self.project.device == 'cpu' else self.project.device}"
            )
        self._update_title()

    def _update_title(self) -> None:
        name = Path(self.project.path).name if self.project.path else "untitled project"
        dirty = self.project.dirty or self.dataset.dirty
        model = f" — {Path(self.project.model_path).name}" if self.project.model_path else ""
        self.setWindowTitle(f"Tune Studio — {name}{' *' if dirty else ''}{model}")

    def new_project(self) -> None:
        if not self._maybe_save():
            return
        self.project.reset()
        self._update_title()

    def open_project_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open project", "", "Tune Studio projects (*.json);;All files (*)"
        )
        if path:
            self.open_project(path)

    def open_project(self, path: str) -> bool:
        if not self._maybe_save():
            return False
        try:
            self.project.load(path)
        except ProjectError as exc:
            QMessageBox.warning(self, "Cannot open project", f"{exc}\n\nChoose another project file.")
            return False
        if self.project.model_path:
            self.open_model(self.project.model_path)
        if self.project.dataset_path:
            self.open_dataset(self.project.dataset_path)
        self._add_recent("recent/projects", path)
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
        self._add_recent("recent/projects", path)
        self.statusBar().showMessage(f"Saved {path}", 4000)
        self._update_title()
        return True

    def _maybe_save(self) -> bool:
        dirty = self.project.dirty or self.dataset.dirty
        if not dirty:
            return True
        return self.confirm(
            "Discard changes?", "The project or the dataset has unsaved changes. Discard them?"
        )

    # --- recent files, settings ----------------------------------------------------------------
    def _recent(self, key: str) -> list[str]:
        value = self.settings.value(key, [])
        if isinstance(value, str):
            value = [value]
        return [p for p in (value or []) if isinstance(p, str)]

    def _add_recent(self, key: str, path: str) -> None:
        path = os.path.abspath(path)
        paths = [path] + [p for p in self._recent(key) if p != path]
        self.settings.setValue(key, paths[:MAX_RECENT])
        self._refresh_recent_menus()

    def _refresh_recent_menus(self) -> None:
        for menu, key, opener in (
            (self.recent_models_menu, "recent/models", self.open_model),
            (self.recent_projects_menu, "recent/projects", self.open_project),
        ):
            menu.clear()
            paths = [p for p in self._recent(key) if os.path.exists(p)]
            for p in paths:
                menu.addAction(
                    self._action(Path(p).name, lambda _=False, p=p, opener=opener: opener(p), tip=p)
                )
            menu.setEnabled(bool(paths))
        self.model_page.set_recent([p for p in self._recent("recent/models") if os.path.exists(p)])

    def _restore_state(self) -> None:
        geometry = self.settings.value("main/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        state = self.settings.value("main/state")
        if state is not None:
            self.restoreState(state)
        page = self.settings.value("main/page", 0)
        self.show_page(int(page) if str(page).isdigit() else 0)
        self._refresh_recent_menus()

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
            self.show_page(0)
        elif suffix == ".jsonl":
            ok = self.open_dataset(path)
            self.show_page(1)
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
        if not self._maybe_save():
            event.ignore()
            return
        self.autosave.close()  # a clean close: saved or discarded, so no copy is kept
        self.train_page.shutdown()
        self.rewards_page.shutdown()
        self.export_page.shutdown()
        if self.train_page.state == "paused":  # a run paused in memory: end it with its checkpoint
            self.train_page.stop()
        self.engine.shutdown()  # the running job stops after its step; the worker thread ends
        self.settings.setValue("main/geometry", self.saveGeometry())
        self.settings.setValue("main/state", self.saveState())
        self.settings.setValue("main/page", self.nav.currentRow())
        super().closeEvent(event)

    # --- recovery after a crash -----------------------------------------------------------------
    def offer_recovery(self) -> bool:
        """Offer to restore the unsaved changes autosaved by windows that did not close (a crash),
        newest first, through `ask_restore`: Restore puts them back (unsaved), Discard deletes the
        copy. At most one copy is restored; the others wait for a later start. Call it once, at
        start, before opening files. True when a copy was restored."""
        restored = False
        for recovery in self.autosave.pending():
            if restored:
                self.autosave.release(recovery)
                continue
            text = (
                f"Tune Studio did not close properly last time. {recovery.describe()}\n\n"
                "Restore them? Discard deletes this copy; the files you saved are not changed either way."
            )
            if not self.ask_restore("Restore unsaved changes?", text):
                self.autosave.discard(recovery)
                continue
            try:
                self._restore(recovery)
            except ProjectError as exc:
                self.autosave.release(recovery)  # left for a later start
                self.statusBar().showMessage(f"The autosaved copy could not be restored: {exc}", 15000)
                continue
            self.autosave.adopt(recovery)
            restored = True
        return restored

    def _restore(self, recovery: Recovery) -> None:
        if recovery.project is not None:
            Project().restore(recovery.project, recovery.project_path)  # ProjectError before any change
        if recovery.samples is not None:
            # first, so that the project's dataset_path names the open dataset and it is not read again
            self.dataset.reset(
                recovery.samples, recovery.dataset_path, saved=False, problems=recovery.skipped
            )
        if recovery.project is not None:
            self.project.restore(recovery.project, recovery.project_path)
            if self.project.model_path:
                self.open_model(self.project.model_path)
        elif recovery.samples is not None and recovery.dataset_path:
            self.project.update(dataset_path=recovery.dataset_path)
        when = time.strftime("%H:%M:%S", time.localtime(recovery.written))
        if recovery.samples is not None:
            self.dataset_page.show_message(
                "info",
                f"Restored {len(recovery.samples)} samples with the changes autosaved at {when}; they are "
                "not saved yet: save (Ctrl+S) to keep them.",
            )
        self.statusBar().showMessage(f"Restored the unsaved changes autosaved at {when}", 8000)
        self._update_title()

    def _ask_restore(self, title: str, text: str) -> bool:
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Question)
        box.setWindowTitle(title)
        box.setText(text)
        restore = box.addButton("Restore", QMessageBox.AcceptRole)
        box.addButton("Discard", QMessageBox.DestructiveRole)
        box.setDefaultButton(restore)
        box.setEscapeButton(restore)  # only an explicit Discard deletes the copy
        box.exec()
        return box.clickedButton() is restore

    def _about(self) -> None:
        QMessageBox.about(
            self,
            "About Tune Studio",
            "Tune Studio fine-tunes GGUF models (dense and Mixture-of-Experts) with LoRA on your own "
            "machine, and exports adapters llama.cpp loads as they are.",
        )
