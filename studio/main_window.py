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
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QFontMetrics, QKeySequence, QPalette, QShortcut
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from engine import Finished, human_bytes

from .autosave import Autosave, Recovery, default_recovery_root
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
from .widgets.theme import THEMES, apply_theme
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
MAX_RECENT = 10
SETTINGS_ORG, SETTINGS_APP = "TuneStudio", "TuneStudio"
THEME_KEY = "view/theme"
FIRST_STEPS_KEY = "view/first_steps"  # false once the person has trained, or closed the strip
THEME_LABELS = {"system": "&System", "light": "&Light", "dark": "&Dark"}
NAV_ROOM = 8  # pages the navigation is wide enough for ("8  Rewards")


def process_memory_bytes(pid: int | str = "self") -> int | None:
    """Resident memory of a process (this one by default; Linux /proc), or None where unavailable."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def plain_text(text: str) -> str:
    """A menu or button text without its mnemonic marks ("&Save" -> "Save", "R&&D" -> "R&D")."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").strip()


class PageAreaWidget(QScrollArea):
    """Holds one page: the page fills the area, and a page that needs more room than the window has
    scrolls instead of being cut off. Unlike `setWidgetResizable`, which makes a page with a
    word-wrapped label as tall as its size hint, the page gets its minimum height for the width."""

    def __init__(self, page: QWidget, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.NoFrame)
        self.setWidgetResizable(False)
        self.setWidget(page)
        self._refit = QTimer(self)  # its minimum changes (a message shown): fit it again, once
        self._refit.setSingleShot(True)
        self._refit.setInterval(0)
        self._refit.timeout.connect(self.fit)
        page.installEventFilter(self)

    def fit(self) -> None:
        page = self.widget()
        if page is None:
            return
        view = self.maximumViewportSize()  # the viewport without scroll bars
        bar_w = self.verticalScrollBar().sizeHint().width()
        bar_h = self.horizontalScrollBar().sizeHint().height()
        minimum = page.minimumSizeHint().expandedTo(page.minimumSize())
        layout = page.layout()

        def min_height(width: int) -> int:
            if layout is not None and layout.hasHeightForWidth():
                return max(minimum.height(), layout.totalMinimumHeightForWidth(width))
            return minimum.height()

        avail_w, avail_h = view.width(), view.height()
        for _ in range(2):  # a scroll bar one way takes room the other way
            width = max(avail_w, minimum.width())
            height = min_height(width)
            if width > avail_w and avail_h == view.height():
                avail_h = view.height() - bar_h
            if height > avail_h and avail_w == view.width():
                avail_w = view.width() - bar_w
                continue
            break
        width = max(avail_w, minimum.width())
        page.resize(width, max(avail_h, min_height(width)))

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self.fit()

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if watched is self.widget() and event.type() == QEvent.LayoutRequest:
            self._refit.start()
        return super().eventFilter(watched, event)


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
        self.ask_restore: Callable[[str, str], bool] = self._ask_restore
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
        self.nav.setFixedWidth(self._nav_width())
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

        self._build_menus()
        self._build_status_bar()
        self._restore_state()
        self._update_title()
        self.update_first_steps()

    def _nav_width(self) -> int:
        """Wide enough for the longest "N  Name" with its padding, with room for NAV_ROOM pages."""
        self.nav.ensurePolished()  # the style sheet's font and padding
        items = self.nav.sizeHintForColumn(0)
        font = self.nav.font()
        font.setPixelSize(14)  # the list's style sheet
        fm = QFontMetrics(font)
        shown = max(fm.horizontalAdvance(f"{i + 1}  {name}") for i, name in enumerate(self.page_names))
        room = fm.horizontalAdvance(f"{NAV_ROOM}  Rewards")
        return max(items, items - shown + room) + 2 * self.nav.frameWidth() + 2 * self.nav.spacing() + 8

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
        self.action_open_model = self._action(
            "Open &model…", self.model_page.choose_file, QKeySequence.Open, "Open a .gguf model"
        )
        m.addAction(self.action_open_model)
        self.recent_models_menu = m.addMenu("Recent models")
        dataset_actions = self.dataset_page.actions()
        self.action_open_dataset = self.dataset_page.action_open
        self.action_open_dataset.setShortcutContext(Qt.WindowShortcut)  # works from every page
        m.addAction(self.action_open_dataset)
        self.recent_datasets_menu = m.addMenu("Recent datasets")
        m.addSeparator()
        m.addAction(self._action("&Quit", self.close, QKeySequence.Quit, "Quit Tune Studio"))
        edit = self.menuBar().addMenu("&Dataset")
        for action in dataset_actions:
            if action.shortcut() == QKeySequence(QKeySequence.Save):
                action.setShortcut(QKeySequence())  # File > Save (Ctrl+S) saves the dataset and the project
            edit.addAction(action)

        view = self.menuBar().addMenu("&View")
        self.page_actions: list[QAction] = []
        for i, name in enumerate(self.page_names):
            action = self._action(
                name,
                lambda _=False, i=i: self.show_page(i),
                f"Ctrl+{i + 1}" if i < 9 else None,
                f"Go to the {name} page",
            )
            view.addAction(action)
            self.page_actions.append(action)
        view.addSeparator()
        self.action_first_steps = self._action(
            "&Getting started strip",
            lambda on: self.set_first_steps_shown(on),
            tip="Show the strip of first steps (model, dataset, targets, training) above the pages",
        )
        self.action_first_steps.setCheckable(True)
        view.addAction(self.action_first_steps)
        theme_menu = view.addMenu("&Theme")
        group = QActionGroup(self)
        self.theme_actions: dict[str, QAction] = {}
        for theme in THEMES:
            tip = {
                "system": "The desktop's own colours (default)",
                "light": "Light colours",
                "dark": "Dark colours",
            }[theme]
            action = self._action(THEME_LABELS[theme], lambda _=False, t=theme: self.set_theme(t), tip=tip)
            action.setCheckable(True)
            group.addAction(action)
            theme_menu.addAction(action)
            self.theme_actions[theme] = action

        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction(
            self._action(
                "&Quick start", self.show_quick_start, QKeySequence.HelpContents, "The steps of the work"
            )
        )
        help_menu.addAction(
            self._action(
                "&Keyboard shortcuts",
                self.show_shortcuts,
                "Ctrl+/",
                "Every keyboard shortcut of the window and its pages",
            )
        )
        help_menu.addSeparator()
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
        steps = self.first_steps
        info = self.model_info
        go = {name: self.page_actions[i].shortcut().toString(QKeySequence.NativeText) for i, name in
              enumerate(self.page_names)}  # fmt: skip
        if self.model_page.opening:
            steps.set_step("Model", False, "opening…", f"The model is opening ({go['Model']})")
        elif info is not None:
            steps.set_step("Model", True, Path(info.path).name, f"{info.path} ({go['Model']})")
        else:
            steps.set_step(
                "Model", False, "open a .gguf file", f"Open a model on the Model page ({go['Model']})"
            )
        n = len(self.dataset)
        if n:
            detail = f"{n:,} sample" + ("s" if n != 1 else "")
            steps.set_step("Dataset", True, detail, f"The samples being edited ({go['Dataset']})")
        else:
            steps.set_step(
                "Dataset",
                False,
                "open or write samples",
                f"Open a .jsonl file or add samples ({go['Dataset']})",
            )
        names = self.targets_page.selected_names() if info is not None else []
        full = self.project.config.full if info is not None else ()
        if names or full:
            detail = f"{len(names)} tensor" + ("s" if len(names) != 1 else "") if names else "in full"
            steps.set_step("Targets", True, detail, f"The tensors that are trained ({go['Targets']})")
        else:
            what = "choose tensors" if info is not None else ""
            steps.set_step("Targets", False, what, f"Choose the tensors to train ({go['Targets']})")
        steps.set_step("Train", False, "", f"Start training on the Train page ({go['Train']})")

    def set_theme(self, theme: str) -> None:
        """System (the desktop's look), light or dark; remembered for the next start."""
        if theme not in THEMES:
            raise ValueError(f"theme must be one of {', '.join(THEMES)}, got {theme!r}")
        app = QApplication.instance()
        look = getattr(app, "platform_look", None)
        if look is None:  # the desktop's own style and palette, to go back to
            look = app.platform_look = (app.style().name(), QPalette(app.palette()))
        if theme == "system":
            if self.theme != "system":
                app.setStyle(look[0])
                app.setPalette(look[1])
        else:
            apply_theme(app, theme)
        # a widget with a style sheet keeps the palette it was polished with: polish it again, so that
        # it takes the new colours and hears the change (banners and the strip restyle themselves)
        for widget in self.findChildren(QWidget):
            if widget.styleSheet():
                widget.setStyleSheet(widget.styleSheet())
        self.theme = theme
        self.settings.setValue(THEME_KEY, theme)
        self.theme_actions[theme].setChecked(True)

    def quick_start_steps(self) -> list[tuple[str, str, str]]:
        """(page, title, text) of each page's step, with the window's real shortcuts."""

        def keys(action: QAction | QAbstractButton | None) -> str:
            seq = action.shortcut() if action is not None else QKeySequence()
            return f" ({seq.toString(QKeySequence.NativeText)})" if not seq.isEmpty() else ""

        start = getattr(self.train_page, "start_button", None)
        texts = {
            "Model": (
                "Open a model",
                f"open a .gguf file (File › Open model{keys(self.action_open_model)}) or drop one on the "
                "window; the page shows what it is and how much memory training needs.",
            ),
            "Dataset": (
                "Write the dataset",
                f"open a JSON Lines file{keys(self.action_open_dataset)} or add samples (chat turns, "
                "prompt and response, or text); the token view shows which tokens are trained.",
            ),
            "Targets": (
                "Choose what to train",
                "pick a preset (attention, MLP, experts, all linear) or tick tensors in the grid; rank "
                "and alpha set the adapter's size.",
            ),
            "Train": (
                "Train",
                f"press Start{keys(start)} and watch the loss fall; pause, resume or stop at any step.",
            ),
            "Chat": (
                "Talk to it",
                "chat with the model, with or without the adapter, or side by side; the live run's "
                "adapter is there while it trains.",
            ),
            "Rewards": (
                "Rate answers (optional)",
                "generate several answers to a prompt, rate each (keys 1–5) and apply a step.",
            ),
            "Export": (
                "Export",
                "write the adapter (or a merged model) that llama.cpp loads with --lora; it is "
                "reloaded and checked after writing.",
            ),
            "Runs": (
                "Look back",
                "every run and rating session with its loss curve; compare runs, and chat with, rate or "
                "export any of their adapters.",
            ),
        }
        out = []
        for i, name in enumerate(self.page_names):
            if name in texts:
                title, text = texts[name]
                out.append((name, f"{title}{keys(self.page_actions[i])}", text))
        return out

    def show_quick_start(self) -> QuickStartDialog:
        dialog = QuickStartDialog(self.quick_start_steps(), self)
        dialog.sig_page_requested.connect(lambda name: self.show_page(self.page_names.index(name)))
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.show()
        return dialog

    def shortcut_rows(self) -> list[tuple[str, str, str]]:
        """(where, what, keys) of every keyboard shortcut: the menus' actions, then each page's
        actions, buttons and shortcuts, read from the widgets as they are now."""
        rows: list[tuple[str, str, str]] = []
        seen: set[int] = set()

        def add(where: str, what: str, sequences, obj) -> None:
            keys = ", ".join(q.toString(QKeySequence.NativeText) for q in sequences if not q.isEmpty())
            if keys and id(obj) not in seen:
                seen.add(id(obj))
                rows.append((where, plain_text(what).rstrip(":"), keys))

        def walk(menu, where: str) -> None:
            for action in menu.actions():
                if action.menu() is not None:
                    walk(action.menu(), f"{where} › {plain_text(action.text())}")
                elif not action.isSeparator():
                    add(where, action.text(), action.shortcuts(), action)

        for action in self.menuBar().actions():
            if action.menu() is not None:
                walk(action.menu(), f"{plain_text(action.text())} menu")
        for name, page in zip(self.page_names, self.pages, strict=True):
            where = f"{name} page"
            for action in page.findChildren(QAction):
                add(where, action.text() or action.toolTip(), action.shortcuts(), action)
            for button in page.findChildren(QAbstractButton):
                text = button.text() or button.toolTip().split("\n")[0]
                add(where, text, [button.shortcut()], button)
            for shortcut in page.findChildren(QShortcut):
                add(where, shortcut.whatsThis() or "shortcut", shortcut.keys(), shortcut)
        return rows

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
        self._add_recent("recent/models", info.path)
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
        self._add_recent("recent/datasets", path)
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
                session.run = None
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

    # --- recent files, settings ----------------------------------------------------------------
    def _recent(self, key: str) -> list[str]:
        value = self.settings.value(key, [])
        if isinstance(value, str):
            value = [value]
        return [p for p in (value or []) if isinstance(p, str)]

    def _add_recent(self, key: str, path: str) -> None:
        path = os.path.realpath(path)  # one entry per file, however it was named (links, "..")
        paths = [path] + [p for p in self._recent(key) if os.path.realpath(p) != path and p != path]
        self.settings.setValue(key, paths[:MAX_RECENT])
        self._refresh_recent_menus()

    def _refresh_recent_menus(self) -> None:
        for menu, key, opener in (
            (self.recent_models_menu, "recent/models", self.open_model),
            (self.recent_datasets_menu, "recent/datasets", self.open_dataset),
            (self.recent_projects_menu, "recent/projects", self.open_project),
        ):
            menu.clear()
            paths = list(dict.fromkeys(os.path.realpath(p) for p in self._recent(key) if os.path.exists(p)))
            for p in paths:
                menu.addAction(
                    self._action(Path(p).name, lambda _=False, p=p, opener=opener: opener(p), tip=p)
                )
            menu.setEnabled(bool(paths))
        models = [os.path.realpath(p) for p in self._recent("recent/models") if os.path.exists(p)]
        self.model_page.set_recent(list(dict.fromkeys(models)))

    def _restore_state(self) -> None:
        geometry = self.settings.value("main/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        state = self.settings.value("main/state")
        if state is not None:
            self.restoreState(state)
        page = self.settings.value("main/page", 0)
        self.show_page(int(page) if str(page).isdigit() and int(page) < len(self.pages) else 0)
        self._refresh_recent_menus()
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
