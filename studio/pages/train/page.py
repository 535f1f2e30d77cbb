"""The Train page: hyperparameters, start / pause / resume / stop, progress, live plots, event log.

Training is a job of the app's one engine worker (studio.worker): the run lives in the engine
session beside the open model, and this page only reacts to its events. Events are buffered by
`TrainPlotsWidget` and drawn from a timer, so a fast run never floods the UI. Pause takes effect
after the current step and keeps the run in memory: Resume goes on from that step with nothing
reloaded. Stop ends the run after the current step with a checkpoint and the adapter. After a stop,
a failure, or a restart of the app, Resume continues from the latest checkpoint (the same
trajectory); "From checkpoint…" continues any checkpoint folder of the open model. Each run writes
`<output folder>/<dataset stem>-<time>.gguf` and its checkpoints to the sibling folder
`<dataset stem>-<time>-checkpoints`, unless the project's TrainConfig names `out` /
`checkpoint_dir` itself. A run that fails before its first checkpoint leaves no folder behind.

Before Start, a small engine job (`plan.check_run`) encodes and packs the dataset the editor shows
with the model's tokenizer and template, as the trainer will: the progress bar shows the real step
total, and Start is disabled, with the reason and a link to the page that fixes it
(`sig_go_to_page(name)`), when nothing is chosen to train, no sample has a token to learn from, or
the run would not fit in memory. The check runs again (debounced) when the settings, the model or
the dataset change. While a run starts, the stats line says what it is doing (opening the model,
preparing the data, the first step); during the run it shows the run's training time (the engine's
`Step.elapsed_s`: pauses excluded, carried by checkpoints) and the time left in words (the engine's
moving average, `Step.eta_s`). A run longer than `notify_after_s` that ends alerts the window, the
system tray (when there is one) and the status line.

With "Processes" above 1, Start runs `tune-engine train --ranks N` beside the app (data parallel
over MPI: every process takes a share of each step's windows; studio.pages.train.processes), and a
resume from a checkpoint runs it with `--resume` (a checkpoint resumes on any number of processes,
with the run's settings and data as in the app): the page follows rank 0's events file as it
follows the worker, the log names each rank's machine, Stop ends every rank after the same step
with a checkpoint and the adapter; there is no Pause. "Across
machines…" gives the `mpiexec -hosts ...` line of the same run for several machines, and adds its
events file to the Runs page.

A new model resets what belonged to the old one: Resume is no longer offered (a checkpoint of
another model neither), and the hyperparameters go back to their defaults (the targets stay).

States (`state`, `sig_state_changed`): idle, loading (the model loads in the worker), training,
pausing, paused, stopping, finished, failed. Problems (no model or dataset, an output folder that
cannot be written, a failed run) are shown in a banner on the page that says what to do next.
"""

from __future__ import annotations

import html
import math
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import QEventLoop, Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QStyle,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from engine import (
    TRAJECTORY_FIELDS,
    Checkpoint,
    CheckpointInfo,
    EngineError,
    Eval,
    Failed,
    Finished,
    Paused,
    PreferenceEval,
    PreferenceStep,
    SampleAnswers,
    Started,
    Step,
    TrainConfig,
    describe_settings,
    find_runs,
    human_bytes,
    local_ranks_available,
    plan_warning,
    read_checkpoint_info,
    template_for,
    trajectory_changes,
)

from ...dataset_document import DatasetDocument
from ...paths import latest_checkpoint, same_file
from ...project import DEFAULT_PRESET, DataStats, ModelInfo, Project, matching_preset
from ...ui_gate import UiGate
from ...widgets.banner import MessageBar
from ...widgets.buttons import PrimaryButton, action_button
from ...widgets.elided_label import ElidedLabel
from ...widgets.page_layout import scroll_area, splitter
from ...widgets.plots import TrainPlotsWidget
from ...widgets.preference_plots import PreferencePlotsWidget
from ...widgets.runs import load_runs, resume_checkpoint, same_model
from ...widgets.sample_answers import SampleAnswersWidget
from ...worker import Engine, Job
from .folders import checkpoint_model, clean_failed_run, folder_problem, missing_folders
from .plan import Blocker, EncodingCache, RunCheck, check_run, check_selection
from .processes import MachinesDialog, ProcessRun, RunFiles
from .run_state import RunState, RunStates, controls
from .settings import TrainSettingsWidget

# The log keeps its last lines only: a QPlainTextEdit lays out every line it holds, about 7 KB each
# (5,000 lines were 35 MiB, the app's largest growth in `bench/soak.py app`); every run's events stay
# in its events file and its record (Runs page).
LOG_MAX_LINES = 1000
CHECK_DELAY_MS = 400  # settings and dataset changes are checked this long after the last one
NOTIFY_AFTER_S = 60.0  # a run segment longer than this alerts the window when it ends
# settings that change the step total, the data check or the memory estimate
CHECKED_SETTINGS = frozenset({
    "n_ctx", "batch_size", "grad_accum", "epochs", "steps", "val_split", "seed", "train_on_prompt",
    "prompt_format", "targets", "rank", "full", "checkpoint_layers", "cache_budget", "device",
})  # fmt: skip
PHASE_OPENING = "Opening the model…"
PHASE_DATA = "Preparing the data…"
PHASE_FIRST_STEP = "First step: dequantizing and warming up…"


def human_duration(seconds: float) -> str:
    """1:08, 12:30, 1:02:03; "–" when unknown."""
    if seconds != seconds or seconds < 0 or seconds == math.inf:
        return "–"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def eta_words(seconds: float) -> str:
    """The time left in words: "less than a minute left", "about 9 min left", "about 2 h 10 min left"."""
    if seconds != seconds or seconds < 0 or seconds == math.inf:
        return "estimating the time left…"
    if seconds < 50:
        return "less than a minute left"
    minutes = max(1, round(seconds / 60))
    if minutes >= 20:
        minutes = 5 * round(minutes / 5)
    if minutes < 60:
        return f"about {minutes} min left"
    h, m = divmod(minutes, 60)
    return f"about {h} h {m} min left" if m else f"about {h} h left"


@dataclass
class RunPaths:
    out: str  # adapter GGUF written at the end
    checkpoint_dir: str  # checkpoint folders


@dataclass(frozen=True)
class RunHandle:
    """Sent by the training job before its first step: the engine's run, as an identity token."""

    run: object


@dataclass(frozen=True)
class Phase:
    """Sent by the training job: what it is doing before the first step, for the stats line."""

    text: str


class TrainPage(QWidget):
    """Train the project's model on its dataset with its settings; see the module docstring."""

    sig_state_changed = Signal(str)
    sig_run_finished = Signal(object)  # the engine's Finished or Failed of each run segment
    sig_go_to_page = Signal(str)  # a link asked for another page: "Model", "Dataset", "Targets"
    sig_notice = Signal(str)  # a long run ended: what the window also showed in its status line
    sig_open_dataset = Signal(str)  # a resumed run's dataset, for an empty editor to show

    def __init__(
        self,
        project: Project,
        engine: Engine,
        dataset: DatasetDocument | None = None,
        parent: QWidget | None = None,
        settings=None,
    ):
        """settings: the window's QSettings (the run folders it remembers), for the run history."""
        super().__init__(parent)
        self.project = project
        self.engine = engine
        self.app_settings = settings
        self.resumable: tuple[str, str] | None = None  # (checkpoint, run name) of a run of this model
        # ask_resume(text, run_data) -> "run" | "page" | "cancel": before resuming with settings or data
        # that differ from the checkpoint's run (run_data False: the run's data is gone); tests replace it
        self.ask_resume = self._ask_resume
        self.dataset = dataset  # the samples the editor shows: trained as they are, unsaved edits included
        self.info: ModelInfo | None = None
        self.run_states = RunStates()
        self.job: Job | None = None  # the training job in flight
        self.proc_run: ProcessRun | None = None  # a run on several processes beside the app
        self.machines_dialog: MachinesDialog | None = None
        self._ranks = 1  # processes of the run in flight (its Started event says)
        self.run = None  # the engine's run of this page (an identity token; it lives in the worker)
        self.run_model: str | None = None  # the model file of the current (or last) run
        self.paths: RunPaths | None = None  # of the current (or last) run
        self.run_config: TrainConfig | None = None
        self.last_result: Finished | Failed | None = None
        self.last_checkpoint: str | None = None
        self.total_steps = 0
        self.last_step = 0
        self.tokens_done = 0
        self.elapsed_s = 0.0  # the run's training time, from its latest Step
        self.phase = ""  # what a starting run is doing, until its first step
        self.ever_started = False  # a run was started from this page (the first look is over)
        self.notify_after_s = NOTIFY_AFTER_S
        self._segment_t0 = 0.0
        self._created: list[str] = []  # folders the current run would create (removed if it fails early)
        self._latest_step: Step | None = None
        self._progress_dirty = False
        self.log_every = 10  # log one Step line in this many
        self._config_model = project.model_path  # the model the hyperparameters were set for
        # the check of the next run (plan.check_run), done by an engine job
        self.check: RunCheck | None = None
        self.check_config: TrainConfig | None = None  # the settings `check` was made with
        self._check_job: Job | None = None
        self._check_gen = 0
        self._check_again = False
        self._show_next = True  # the progress bar shows the next run's plan (not the last run's end)
        # used by the check jobs only, in the worker, which give the UI thread its turn as they go
        self._encodings = EncodingCache(pause=UiGate.for_app().pause)
        self._tray: QSystemTrayIcon | None = None
        self.check_timer = QTimer(self)
        self.check_timer.setSingleShot(True)
        self.check_timer.setInterval(CHECK_DELAY_MS)
        self.check_timer.timeout.connect(self.check_now)

        # --- settings (left) ---
        self.settings = TrainSettingsWidget(project)
        scroll = scroll_area(self.settings)
        scroll.setMinimumWidth(
            self.settings.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width() + 4
        )
        self.settings_scroll = scroll

        # --- banner ---
        self.banner = MessageBar()
        self.banner.label.setTextFormat(Qt.RichText)
        self.banner.label.setTextInteractionFlags(Qt.TextBrowserInteraction)
        self.banner.label.linkActivated.connect(self._link)
        self.banner_level = ""
        self._banner_plain = ""

        # --- controls ---
        self.start_button = action_button(
            "Start", self.start, "Start a new training run with these settings (Ctrl+Enter).", "Ctrl+Return",
            button=PrimaryButton("Start"),
        )  # fmt: skip
        self.pause_button = action_button(
            "Pause", self.pause,
            "Stop after the current step and keep the run in memory; Resume continues from it (Ctrl+P).",
            "Ctrl+P",
        )  # fmt: skip
        self.resume_button = action_button(
            "Resume", self.resume,
            "Continue this run: in memory after Pause, else from its latest checkpoint (Ctrl+Shift+Enter).",
            "Ctrl+Shift+Return",
        )  # fmt: skip
        self.stop_button = action_button(
            "Stop", self.stop,
            "End the run after the current step; the adapter and a checkpoint are written (Ctrl+.).",
            "Ctrl+.",
        )  # fmt: skip
        self.resume_from_button = action_button(
            "From checkpoint…", self.choose_checkpoint,
            "Continue training from a checkpoint folder of the open model (ckpt-NNNNNN, or a folder of them: "
            "the newest).",
        )  # fmt: skip
        self.processes = QSpinBox()
        self.processes.setRange(1, 64)
        self.processes.setPrefix("Processes: ")
        self.processes.setToolTip(
            "Train on this many processes of this machine (data parallel over MPI: each takes a share of "
            "every step's windows; the same steps as one process). 1 (default): in the app, with Pause. "
            "Needs the mpi extra (pip install 'tune-studio[mpi]'). DPO and ORPO train in one process."
        )
        self.processes.valueChanged.connect(lambda _n: self._update_start())
        self.machines_button = action_button(
            "Across machines…", self.show_machines,
            "The command that runs this training on several machines (mpiexec); the Runs page follows it.",
        )  # fmt: skip
        self.state_label = QLabel()
        self.state_label.setAlignment(Qt.AlignRight | Qt.AlignVCenter)
        self.state_label.setToolTip("The state of the training run.")
        controls = QHBoxLayout()
        controls.setSpacing(4)
        for b in (self.start_button, self.pause_button, self.resume_button, self.stop_button):
            controls.addWidget(b)
        controls.addSpacing(6)
        controls.addWidget(self.resume_from_button)
        controls.addStretch(1)
        controls.addWidget(self.state_label)
        # why Start is disabled, with a link to the page that fixes it
        self.reason_label = QLabel()
        self.reason_label.setWordWrap(True)
        self.reason_label.setTextFormat(Qt.RichText)
        self.reason_label.setTextInteractionFlags(Qt.TextBrowserInteraction)
        self.reason_label.linkActivated.connect(self._link)
        self.reason_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.reason_label.hide()

        # --- progress ---
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setTextVisible(True)
        self.progress.setFormat("steps: waiting for a model and a dataset")
        self.progress.setToolTip("Steps of the run: before Start, the step total of the current settings.")
        self.stats_label = QLabel("Not started.")
        self.stats_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.stats_label.setWordWrap(True)
        self.stats_label.setAlignment(Qt.AlignLeft | Qt.AlignTop)
        # its text changes at every tick: never let that re-layout the page (two lines, always)
        self.stats_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)
        self.stats_label.setFixedHeight(2 * self.stats_label.fontMetrics().lineSpacing() + 2)
        self.paths_label = ElidedLabel()
        self.paths_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.output_button = QPushButton("Output folder…")
        self.output_button.setToolTip(
            "Choose where adapters and checkpoints are written. Default: a tune-studio-out folder "
            "beside the project file (or the dataset), or your data folder when that one is inside "
            "the program or cannot be written."
        )
        self.output_button.clicked.connect(self.choose_output_folder)
        paths_row = QHBoxLayout()
        paths_row.addWidget(self.paths_label, 1)
        paths_row.addWidget(self.output_button, 0, Qt.AlignTop)
        paths_row.addWidget(self.processes, 0, Qt.AlignTop)
        paths_row.addWidget(self.machines_button, 0, Qt.AlignTop)

        # --- plots and log ---
        self.plots = TrainPlotsWidget()
        self.plots.timer.timeout.connect(self._refresh_progress)
        # a DPO / ORPO run's figures, a tab of the plots shown while such a run is on them
        self.preference_plots = PreferencePlotsWidget()
        self.plots.tabs.addTab(self.preference_plots, "Preferences")
        self.plots.tabs.setTabVisible(self.plots.tabs.count() - 1, False)
        self.plots.timer.timeout.connect(self.preference_plots.redraw)
        self.plots.sig_link_activated.connect(self._link)
        self.sample_answers = SampleAnswersWidget(project)  # prompts answered every N steps, the answers
        self.plots.tabs.addTab(self.sample_answers, "Sample answers")
        self._samples_opened = False  # the tab was opened from the first look, before any run
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(LOG_MAX_LINES)
        self.log.setLineWrapMode(QPlainTextEdit.WidgetWidth)  # long lines wrap: nothing hides sideways
        self.log.setPlaceholderText("Events of the run appear here.")
        self.log.setMinimumHeight(50)
        font = self.log.font()
        font.setStyleHint(font.StyleHint.Monospace)
        font.setFamily("monospace")
        self.log.setFont(font)
        vsplit = splitter(Qt.Vertical, (self.plots, self.log), stretch=(4, 1), sizes=(480, 120))

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(4)
        rl.addWidget(self.banner)
        rl.addLayout(controls)
        rl.addWidget(self.reason_label)
        rl.addWidget(self.progress)
        rl.addWidget(self.stats_label)
        rl.addLayout(paths_row)
        rl.addWidget(vsplit, 1)

        split = splitter(Qt.Horizontal, (scroll, right), stretch=(0, 1))
        self.splitter = split
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(split)

        project.subscribe(self._project_changed)
        self.destroyed.connect(lambda *_, cb=self._project_changed: project.unsubscribe(cb))
        if dataset is not None:
            dataset.subscribe(self._dataset_changed)
            self.destroyed.connect(lambda *_, cb=self._dataset_changed: dataset.unsubscribe(cb))
        self._set_state("idle", force=True)
        self._show_paths()
        self._refresh_progress(force=True)

    def _link(self, href: str) -> None:
        if href.startswith("page:"):
            self.sig_go_to_page.emit(href[len("page:") :])
        elif href == "tab:samples":
            self.show_sample_answers()

    def show_sample_answers(self) -> None:
        """The Sample answers tab, also before the first run (its prompts are chosen before Start)."""
        self._samples_opened = True
        self.plots.show_plots()
        self.plots.tabs.setCurrentWidget(self.sample_answers)

    # --- state ------------------------------------------------------------------------------
    @property
    def state(self) -> RunState:
        return self.run_states.state

    def _set_state(self, state: RunState | str, force: bool = False) -> None:
        """Move the run to `state` (run_state.MOVES) and show what it offers; force: announce it on
        sig_state_changed even when it did not change."""
        changed = self.run_states.move(state)
        self._show_state(changed, force)

    def _show_state(self, changed: bool = False, announce: bool = False) -> None:
        """Show the run's state and what it offers; sig_state_changed when it changed or `announce`."""
        state = self.run_states.state
        active = state.active
        offered = controls(state, can_resume=self._can_resume(), in_process=self.proc_run is None)
        self.pause_button.setEnabled(offered.pause)
        self.resume_button.setEnabled(offered.resume)
        self.stop_button.setEnabled(offered.stop)  # paused: end it
        for w in (self.resume_from_button, self.processes, self.output_button, self.settings):
            w.setEnabled(not offered.locked)
        ranks = f" on {self._ranks} processes" if self._ranks > 1 and active else ""
        self.state_label.setText(f"<b>{state}</b>{ranks}")
        self._update_start()
        if changed or announce:
            self.sig_state_changed.emit(state.value)
            if not active and changed:
                self.schedule_check()  # memory and data may have changed with the run

    def _can_resume(self) -> bool:
        """The run is paused in memory, or a checkpoint of it exists and it has steps left; and it
        is a run of the open model."""
        if (
            self.run_model
            and self.project.model_path
            and not same_file(self.run_model, self.project.model_path)
        ):
            return False
        if self.state == "paused":
            return True
        if self.paths is None or latest_checkpoint(self.paths.checkpoint_dir) is None:
            return self.resumable is not None  # a stopped run of this model in the history
        if isinstance(self.last_result, Finished) and not self.last_result.stopped:
            return self.resumable is not None
        return True

    def refresh_resumable(self) -> None:
        """Look in the run history for the newest run of the open model that stopped or failed before
        its planned end and left a checkpoint: Resume offers it (after a relaunch, say)."""
        found = None
        model = self.project.model_path
        if model and not self.state.active:
            for run in load_runs(self.project, self.app_settings):
                ckpt = resume_checkpoint(run) if run.model and same_model(run, model) else None
                if ckpt:
                    found = (ckpt, run.name)
                    break
        self.resumable = found
        if found:
            self.resume_button.setToolTip(
                f"Continue the run {found[1]} from its checkpoint {os.path.basename(found[0])}, with its own "
                "settings (Ctrl+Shift+Enter)."
            )
        self._show_state()

    # --- model ------------------------------------------------------------------------------
    def set_model_info(self, info: ModelInfo | None) -> None:
        """The open model (layer and expert counts, tokenizer and template for the check, its size
        for the presets); None when none is open. A model other than the one the settings were
        made for resets them to their defaults (the targets stay) and forgets the old run."""
        self.info = info
        self.check = None  # it was of another model
        if info is None:
            self.plots.set_model_shape(None, 0)
            self.settings.set_model_size(None)
        else:
            cfg = info.summary.config
            self.plots.set_model_shape(cfg.L, cfg.E)
            self.settings.set_model_size(info.summary.n_params)
            n_params = info.summary.n_params
            if self._config_model and not same_file(self._config_model, info.path):
                self.project.reset_hyperparameters(n_params, self.settings.data)
                self._log(f"New model {Path(info.path).name}: the training settings are the {DEFAULT_PRESET} "
                          "preset for its size and the dataset (the targets are kept).")  # fmt: skip
                self.show_banner(
                    f"{Path(info.path).name} is a new model: the training settings are the {DEFAULT_PRESET} "
                    "preset for its size and the dataset (the targets are kept). Pick another preset or "
                    "adjust them, then press Start.",
                    "info",
                )
            elif not self._config_model and not self.project.path:
                # the first model of a new project: the engine's bare defaults become the default preset
                if matching_preset(self.project.config, n_params) == "defaults":
                    self.project.reset_hyperparameters(n_params, self.settings.data)
            self._config_model = info.path
            if self.run_model and not same_file(self.run_model, info.path) and not self.state.active:
                self._forget_run()
            elif not self.run_model and not self.state.active:
                self.plots.clear()  # nothing of another model stays on show
        if self.banner_level == "error" and info is not None and "model" in self._banner_plain.lower():
            self.hide_banner()
        self.refresh_resumable()
        self.schedule_check()

    def _forget_run(self) -> None:
        """The open model changed: the last run (paused in memory, or with checkpoints) is not
        offered any more."""
        if self.state == "paused":
            self._log(f"The run paused at step {self.last_step} ended with its model "
                      "(its checkpoints, if any, are kept on disk).")  # fmt: skip
        self.run = None
        self.run_model = None
        self.paths = None
        self.last_result = None
        self.last_checkpoint = None
        self._show_next = True
        self.plots.clear()  # the curves were the old model's
        self.tokens_done, self.elapsed_s, self.last_step = 0, 0.0, 0
        self._set_state("idle")
        self._show_paths()

    def _project_changed(self, changed: set[str]) -> None:
        if {"model_path", "config"} <= changed:  # a project loaded, restored or reset: its settings
            self._config_model = self.project.model_path  # belong to its model
        if changed & {"dataset_path", "output_dir", "path", "model_path", "config"}:
            self._show_paths()
        settings = {c[len("config.") :] for c in changed if c.startswith("config.")}
        relevant = changed & {"model_path", "dataset_path", "template_file", "device"} or (
            "config" in changed and (not settings or settings & CHECKED_SETTINGS)
        )
        if relevant:
            self._show_next = True
            self._show_state()  # Resume may not be offered any more
            self.schedule_check()

    def _dataset_changed(self, change) -> None:
        if change.kind in ("reset", "inserted", "removed", "moved", "changed", "path"):
            self._show_next = True
            self.schedule_check()

    # --- the check of the next run ----------------------------------------------------------
    def schedule_check(self) -> None:
        """Check the next run soon (after CHECK_DELAY_MS without another change)."""
        self._update_start()
        self.check_timer.start()

    def check_now(self) -> Job | None:
        """Submit the check of the next run to the engine worker (plan.check_run); its result
        updates the progress bar and the Start button. None when there is nothing to check yet."""
        self.check_timer.stop()
        info, p = self.info, self.project
        if self.state.active:
            return None  # checked again when the run ends
        if info is None or self._input_blocker() is not None or not same_file(info.path, p.model_path):
            self.check = None  # (a model still opening: checked when the window says it is open)
            self._update_start()
            self._refresh_progress(force=True)
            return None
        if self._check_job is not None and self._check_job.active:
            self._check_again = True
            return None
        edited = self._edited_samples()
        if edited is not None:
            data = edited
        elif self.dataset is not None and len(self.dataset) and self._doc_is_dataset_file():
            data = self.dataset.samples()  # the file as the editor read it
        else:
            data = p.dataset_path
        config, template_file, cache = p.config, p.template_file, self._encodings
        self._check_gen += 1
        gen = self._check_gen

        def check(session, job) -> RunCheck:
            try:  # made once per model and template file (the encodings are cached for it)
                template = cache.template((id(info), template_file), lambda: (
                    template_for(info.metadata, template_file) if template_file else info.template
                ))  # fmt: skip
            except EngineError as exc:
                selection = check_selection(info.tensors, info.summary.config, config)
                return replace(
                    selection, blocker=Blocker(f"The chat template cannot be used: {exc}.", "Model")
                )
            return check_run(data, info.tokenizer, template, info.tensors, info.summary.config, config, cache)

        self._check_job = self.engine.submit(
            "checking the next run",
            check,
            on_done=lambda result, g=gen, c=config: self._check_done(g, result, c),
            on_error=lambda message, g=gen: self._check_failed(g, message),
            needs_session=False,
        )
        return self._check_job

    def _check_done(self, gen: int, result: RunCheck, config: TrainConfig | None = None) -> None:
        self._check_job = None
        stale = self._check_again  # something changed while it ran: check again, show this one not
        if gen == self._check_gen and not stale:
            self.check = result
            self.check_config = config  # the settings it checked
            plan = result.plan
            if plan is not None and plan.n_usable:  # a preset follows the dataset (it may check again)
                stats = DataStats(plan.n_usable, plan.usable_tokens, plan.longest, self.project.config.n_ctx)
                self.settings.set_data_stats(stats)
            self._update_start()
            self._refresh_progress(force=True)
        if stale:
            self._check_again = False
            self.check_now()

    def _check_failed(self, gen: int, message: str) -> None:
        self._check_job = None
        if gen == self._check_gen:
            self.check = None
            self._log(f"The next run could not be checked: {message}")
            self._update_start()
        if self._check_again:
            self._check_again = False
            self.schedule_check()

    def _model_blocker(self) -> Blocker | None:
        p = self.project
        if not p.model_path:
            return Blocker("No model is chosen. Open a .gguf model on the Model page.", "Model")
        if not os.path.isfile(p.model_path):
            return Blocker(f"The model file {p.model_path} does not exist any more. Open it again on the "
                           "Model page.", "Model")  # fmt: skip
        return None

    def _input_blocker(self) -> Blocker | None:
        """What is missing before anything can be checked: a model, a dataset."""
        p = self.project
        model = self._model_blocker()
        if model is not None:
            return model
        if self._edited_samples() is not None:
            return None  # the editor's samples, saved or not
        if not p.dataset_path:
            return Blocker(
                "No dataset is chosen. Open or create a JSONL dataset on the Dataset page.", "Dataset"
            )
        if not os.path.isfile(p.dataset_path):
            return Blocker(f"The dataset file {p.dataset_path} does not exist. Choose it again on the "
                           "Dataset page.", "Dataset")  # fmt: skip
        return None

    def plan_warning(self) -> str | None:
        """Why the next run, as checked, is unlikely to change the model (too few steps, learning rate
        × steps too small), with its numbers; None when it looks able to, or is not checked yet."""
        plan = self.check.plan if self.check is not None else None
        if plan is None or not plan.total_steps:
            return None
        return plan_warning(plan.total_steps, self.project.config.lr)

    def blocker(self) -> Blocker | None:
        """Why Start is disabled, or None."""
        return (
            self._input_blocker()
            or self._processes_blocker(self.project.config)
            or (self.check.blocker if self.check is not None else None)
        )

    def _processes_blocker(self, config: TrainConfig) -> Blocker | None:
        """A preference objective on several processes (the engine trains DPO and ORPO in one)."""
        if config.objective == "sft" or self.processes.value() < 2:
            return None
        return Blocker(f"{config.objective.upper()} trains in one process (its loss compares the two "
                       "answers of each pair, which cannot be split across processes): set Processes "
                       "to 1.")  # fmt: skip

    def _update_start(self) -> None:
        active = self.state.active
        blocker = None if active else self.blocker()
        self.start_button.setEnabled(not active and blocker is None)
        weak = None if active or blocker is not None else self.plan_warning()
        if blocker is not None:
            self.reason_label.setText(
                f"<b>Start is unavailable:</b> {self._html(blocker.reason, blocker.page)}"
            )
            self.reason_label.show()
            self.start_button.setToolTip(f"Start is unavailable: {blocker.reason}")
        elif weak:
            self.reason_label.setText(f"<b>Before you start:</b> {html.escape(weak)}")
            self.reason_label.show()
            self.start_button.setToolTip(f"Start a new training run with these settings (Ctrl+Enter). {weak}")
        else:
            self.reason_label.hide()
            self.start_button.setToolTip("Start a new training run with these settings (Ctrl+Enter).")
        if not self.ever_started and not self._samples_opened:
            self.plots.show_placeholder(self._first_look())

    @staticmethod
    def _html(text: str, page: str = "") -> str:
        link = f' <a href="page:{page}">Go to the {page} page</a>' if page else ""
        return html.escape(text) + link

    def _first_look(self) -> str:
        """The plot area before the first run: what to do, step by step, with links."""
        p, check = self.project, self.check
        done, todo = "✓", "○"

        def row(ok: bool | None, text: str, page: str = "") -> str:
            link = f' — <a href="page:{page}">{page} page</a>' if page and not ok else ""
            mark = "•" if ok is None else done if ok else todo
            return f"<tr><td>{mark}&nbsp;</td><td>{text}{link}</td></tr>"

        model = Path(p.model_path).name if p.model_path else ""
        edited = self._edited_samples()
        data = (f"{len(edited)} samples in the editor" if edited is not None
                else Path(p.dataset_path).name if p.dataset_path else "")  # fmt: skip
        if check is not None and check.plan is not None:
            data += f" ({check.plan.n_trainable} to train)"
        targets_ok = check is not None and (check.blocker is None or check.blocker.page != "Targets")
        what = ""
        if check is not None and check.n_lora_tensors + check.n_full_tensors:
            what = f"{check.n_lora_tensors} LoRA tensors"
            what += f" + {check.n_full_tensors} full" if check.n_full_tensors else ""
        rows = [
            row(bool(model), f"A model{': ' + html.escape(model) if model else ''}", "Model"),
            row(bool(data), f"A dataset{': ' + html.escape(data) if data else ''}", "Dataset"),
            row(targets_ok, f"What to train{': ' + what if what else ''}", "Targets"),
            row(None, "Settings on the left: a preset, or your own"),
            row(None, "Optional: prompts answered as it trains, in "
                '<a href="tab:samples">Sample answers</a>' + self.sample_answers.summary()),
        ]  # fmt: skip
        return (
            "<h3>Train a LoRA adapter</h3><table>" + "".join(rows) + "</table>"
            "<p>Then press <b>Start</b> (Ctrl+Enter). The loss, learning rate, gradient norm, throughput "
            "and LoRA norms appear here as the run goes; the Layers tab shows each adapted tensor.</p>"
        )

    # --- banner -----------------------------------------------------------------------------
    def show_banner(self, text: str, level: str = "error", page: str = "") -> None:
        """A message on the page itself (error / warning / info) with what to do next; `page`
        adds a link to the page that fixes it."""
        self.banner_level = level
        self._banner_plain = text + (f" Go to the {page} page" if page else "")
        self.banner.show_message(level, self._html(text, page))

    def hide_banner(self) -> None:
        self.banner_level = ""
        self.banner.hide()

    def banner_text(self) -> str:
        """The banner's message as plain text ("" when hidden)."""
        return self._banner_plain if not self.banner.isHidden() else ""

    # --- paths ------------------------------------------------------------------------------
    def default_paths(self, stamp: str | None = None) -> RunPaths:
        """Where a run started now writes: output_folder()/<dataset stem>-<time>.gguf and the sibling
        <dataset stem>-<time>-checkpoints folder (the project's config.out / checkpoint_dir win)."""
        folder = self.project.output_folder()
        stem = Path(self.project.dataset_path).stem if self.project.dataset_path else "adapter"
        stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
        base = os.path.join(folder, f"{stem}-{stamp}")
        cfg = self.project.config
        out = cfg.out or base + ".gguf"
        ckpt = cfg.checkpoint_dir or (out[:-5] if out.endswith(".gguf") else out) + "-checkpoints"
        return RunPaths(out, ckpt)

    def _show_paths(self) -> None:
        if self.paths is not None and self.state != "idle":
            p = self.paths
            self.paths_label.setText(f"Adapter: {p.out}\nCheckpoints: {p.checkpoint_dir}")
        else:
            p = self.default_paths(stamp="<date-time>")
            self.paths_label.setText(f"Next run writes: {p.out}\nCheckpoints: {p.checkpoint_dir}")

    def choose_output_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Output folder", self.project.output_folder())
        if folder:
            self.project.update(output_dir=folder)
            self._show_paths()

    # --- actions ----------------------------------------------------------------------------
    def _check_inputs(self) -> bool:
        blocker = self._input_blocker()
        if blocker is not None:
            self.show_banner(blocker.reason, page=blocker.page)
            return False
        return True

    def _check_writable(self, paths: RunPaths) -> bool:
        for folder in dict.fromkeys([os.path.dirname(os.path.abspath(paths.out)), paths.checkpoint_dir]):
            why = folder_problem(folder)
            if why:
                self.show_banner(
                    f"The output folder {folder} cannot be written ({why}). Choose another output folder "
                    "(the Output folder… button), or fix its permissions, then press Start."
                )
                return False
        return True

    def _edited_samples(self):
        """The editor's samples when they are not the dataset file as saved (unsaved edits, or a
        dataset never saved), else None: then the file is trained (and named in the run's record)."""
        doc = self.dataset
        if doc is None or not len(doc):
            return None
        return None if (self._doc_is_dataset_file() and not doc.dirty) else doc.samples()

    def _doc_is_dataset_file(self) -> bool:
        doc, path = self.dataset, self.project.dataset_path
        return bool(
            doc is not None and doc.path and path and os.path.isfile(path) and same_file(doc.path, path)
        )

    def start(self) -> bool:
        """Start a new run with the project's settings; False (and a banner) if it cannot start."""
        if self.state.active:
            return False
        if not self._check_inputs():
            return False
        blocker = self.blocker()
        if blocker is not None:
            self.show_banner(f"Cannot start: {blocker.reason}", page=blocker.page)
            return False
        paths = self.default_paths()
        if not self._check_writable(paths):
            return False
        self.hide_banner()
        self.paths = paths
        self._created = missing_folders(os.path.dirname(os.path.abspath(paths.out)), paths.checkpoint_dir)
        self.plots.clear()
        self.tokens_done = 0
        self.last_step = 0
        self.elapsed_s = 0.0
        self.total_steps = self.check.plan.total_steps if self.check and self.check.plan else 0
        if self.total_steps:
            # the step axes get their final range now, before the engine computes, rather than at
            # the run's Started event: there every shown panel repainted both of its axes at once
            # as the first matmuls began (one 29 ms chunk of UI work, 43-50 ms of wall clock)
            self.plots.set_total_steps(self.total_steps)
        self.last_checkpoint = None
        self.last_result = None
        self.run_model = self.project.model_path
        self.ever_started = True
        self.preference_plots.clear()
        data = self._edited_samples()
        source = (
            f"{len(data)} samples in the editor"
            if data is not None
            else os.path.basename(self.project.dataset_path)
        )
        self._log(f"New run: {os.path.basename(self.project.model_path)} on {source}; adapter → {paths.out}")
        weak = self.plan_warning()
        if weak:
            self._log(f"Warning: {weak}")
        if self.processes.value() > 1:
            return self._launch_processes(self.processes.value(), data)
        self._launch(resume=None)
        return True

    def resume(self) -> bool:
        """Continue the current run: in memory after Pause, else from its latest checkpoint; after a
        relaunch, the newest stopped run of the open model (`refresh_resumable`)."""
        if self.state.active or not self._can_resume():
            return False
        if self.state == "paused":
            self.hide_banner()
            self._log(f"Resuming at step {self.last_step}")
            self._launch(resume=None, continue_run=True)
            return True
        own = latest_checkpoint(self.paths.checkpoint_dir) if self.paths is not None else None
        finished = isinstance(self.last_result, Finished) and not self.last_result.stopped
        if own is not None and not finished:
            return self.resume_from(own, same_run=True)
        if self.resumable is not None:
            return self.resume_from(self.resumable[0])
        self.show_banner("No checkpoint of this run was found. Start a new run, or resume from another "
                         "checkpoint folder.")  # fmt: skip
        return False

    def choose_checkpoint(self) -> None:
        start_dir = self.paths.checkpoint_dir if self.paths else self.project.output_folder()
        start_dir = start_dir if os.path.isdir(start_dir) else os.path.expanduser("~")
        folder = QFileDialog.getExistingDirectory(self, "Resume from checkpoint", start_dir)
        if folder:
            self.resume_from(folder)

    def resume_from(self, folder: str, same_run: bool = False) -> bool:
        """Continue training from a checkpoint folder (ckpt-NNNNNN, or a folder holding them) of the
        open model, with the run's own settings and data (the checkpoint carries them): the steps,
        the training time and the tokens go on from the checkpoint's, to the run's planned end. When
        the page's settings or dataset differ from the run's, `ask_resume` asks first."""
        if self.state.active:
            return False
        blocker = self._model_blocker()
        if blocker is not None:
            self.show_banner(blocker.reason, page=blocker.page)
            return False
        try:
            info = read_checkpoint_info(folder)
        except EngineError as exc:
            self.show_banner(f"{folder} is not a checkpoint: choose a ckpt-NNNNNN folder (inside a run's "
                             f"-checkpoints folder), or the -checkpoints folder itself ({exc}).")  # fmt: skip
            return False
        trained_on = info.model or checkpoint_model(info.path)
        if trained_on and not same_file(trained_on, self.project.model_path):
            self.show_banner(
                f"This checkpoint was trained on {Path(trained_on).name}, not on the open model "
                f"{Path(self.project.model_path).name}. Open {Path(trained_on).name} on the Model page to "
                "continue it.",
                page="Model",
            )
            return False
        chosen = self._resume_choice(info)
        if chosen is None:
            return False
        config, data = chosen
        parent = info.run_dir
        out = config.out or (
            parent[: -len("-checkpoints")] + ".gguf" if parent.endswith("-checkpoints") else None
        )
        paths = RunPaths(out or self.default_paths().out, parent)
        if not self._check_writable(paths):
            return False
        if not (same_run and self.paths is not None and same_file(self.paths.checkpoint_dir, parent)):
            self.plots.clear()
            self.last_result = None
            record = next(iter(find_runs([parent])), None)  # the run's own curve up to its checkpoint
            if record is not None:
                self.plots.add_history(
                    [x for x in record.losses if x[0] <= info.step],
                    [x for x in record.val_losses if x[0] <= info.step],
                )
        self.paths = paths
        self._created = missing_folders(os.path.dirname(os.path.abspath(paths.out)))
        self.tokens_done, self.elapsed_s, self.last_step = info.tokens, info.seconds, info.step
        self.total_steps = info.total_steps
        if info.total_steps:
            self.plots.set_total_steps(info.total_steps)
        self.run_model = self.project.model_path
        self.ever_started = True
        self.hide_banner()
        planned = f" of {info.total_steps}" if info.total_steps else ""
        self._log(f"Resuming {Path(parent).name} at step {info.step}{planned} from {info.path}: "
                  f"{describe_settings(config, info.total_steps)}")  # fmt: skip
        config = replace(config, out=paths.out, checkpoint_dir=parent)
        blocker = self._processes_blocker(config)
        if blocker is not None:
            self.show_banner(f"Cannot resume on {self.processes.value()} processes: {blocker.reason}")
            return False
        if self.processes.value() > 1:  # a checkpoint resumes on any number of processes
            return self._launch_processes(self.processes.value(), data, config=config, resume=info.path)
        self._launch(resume=info.path, config=config, data=data)
        return True

    def _resume_choice(self, info: CheckpointInfo) -> tuple[TrainConfig, object] | None:
        """The settings and data to resume with: the run's own (the default), or the page's when the
        person chose them over the run's (`ask_resume`); None when cancelled or impossible."""
        p = self.project
        run_data = info.data()
        edited = self._edited_samples()
        page_data = edited if edited is not None else p.dataset_path
        differences = trajectory_changes(info.config, p.config)
        if edited is not None:
            differences.append(f"dataset {info.describe_data()} -> the {len(edited)} samples in the editor")
        elif p.dataset_path and not info.same_data(p.dataset_path) and info.knows_data:
            differences.append(f"dataset {info.describe_data()} -> {p.dataset_path}")
        if run_data is None and not info.knows_data:
            run_data = page_data  # an older checkpoint that does not record its data: the page's
        answer = "run"
        # settings the person shaped by hand (no preset's) are a question; a preset is a suggestion
        # for new runs, and the run's own settings take its place without one
        custom = matching_preset(p.config, self.settings.n_params, self.settings.data) is None
        data_differs = any(d.startswith("dataset ") for d in differences)
        if run_data is None or data_differs or (differences and custom):
            if run_data is None and page_data is None:
                self.show_banner(
                    f"The data this run trained on is gone ({info.describe_data()}). Open a dataset on the "
                    "Dataset page to continue on it.",
                    page="Dataset",
                )
                return None
            lines = "\n".join(f"• {d}" for d in differences)
            if run_data is None:
                text = (f"The data this run trained on is gone ({info.describe_data()}). Continuing on the "
                        f"page's dataset changes the run's trajectory.\n{lines}")  # fmt: skip
            else:
                text = (f"The page's settings differ from the run's (step {info.step} of "
                        f"{info.total_steps or '?'}):\n{lines}\nContinuing the run as it was uses its own "
                        "settings and data; the page's change its trajectory.")  # fmt: skip
            answer = self.ask_resume(text, run_data is not None)
            if answer == "cancel" or (answer == "run" and run_data is None):
                return None
        runtime = {name: getattr(p.config, name) for name in ("device", "cache_budget", "checkpoint_layers")}
        if answer == "page":
            self._log("Resuming with the page's settings and data: " + "; ".join(differences))
            return p.config, page_data
        # the run as it was: its settings go on the page, so that what is shown is what runs
        shown = {name: getattr(info.config, name) for name in TRAJECTORY_FIELDS}
        changed = {k: v for k, v in shown.items() if getattr(p.config, k) != v}
        if changed:
            p.update_config(**changed)
        if info.dataset and not p.dataset_path and self.dataset is not None and not len(self.dataset):
            self.sig_open_dataset.emit(info.dataset)  # an empty project shows what the run trains on
        return replace(info.config, **runtime), run_data

    def _ask_resume(self, text: str, run_data: bool) -> str:
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Question)
        box.setWindowTitle("Resume the run")
        box.setText(text)
        as_was = box.addButton("Continue the run as it was", QMessageBox.AcceptRole) if run_data else None
        page = box.addButton("Use the page's settings", QMessageBox.DestructiveRole)
        box.addButton(QMessageBox.Cancel)
        box.setDefaultButton(as_was or page)
        box.exec()
        clicked = box.clickedButton()
        return "run" if clicked is as_was and as_was is not None else "page" if clicked is page else "cancel"

    def pause(self) -> None:
        """Pause after the current step; the run stays in memory and Resume goes on from there."""
        if self.run_states.can_pause(in_process=self.proc_run is None) and self.job is not None:
            self.job.request_pause()
            self._set_state("pausing")
            self._log("Pausing after the current step…")

    def stop(self) -> None:
        """End the run after the current step (the adapter and a checkpoint are written). No question."""
        if not self.run_states.can_stop():
            return
        if self.state in ("loading", "training") and self.proc_run is not None:
            self.proc_run.stop()
            self._set_state("stopping")
            self._log("Stopping every process after the current step…")
        elif self.state in ("loading", "training") and self.job is not None:
            self.job.request_stop()
            self._set_state("stopping")
            self._log("Stopping after the current step…")
        elif self.state == "paused":
            self._log(f"Ending the run paused at step {self.last_step}…")
            self._set_state("stopping")
            run = self.run

            def stop_paused(session, job):
                if session is None or session.run is not run or not session.paused:
                    return None  # the model was closed since: its checkpoints are on disk
                return session.stop_run(job.emit)

            self._segment_t0 = time.monotonic()
            self.job = self.engine.submit("ending the run", stop_paused, on_event=self._on_event,
                                          on_done=self._on_finished, on_error=self._on_failed)  # fmt: skip

    def _model_is_open(self) -> bool:
        m = self.engine.model
        return (
            m is not None and same_file(m.path, self.project.model_path) and m.device == self.project.device
        )

    def _launch(
        self, resume: str | None, continue_run: bool = False, config: TrainConfig | None = None, data=None
    ) -> None:
        """Run the training job: a new run (or one resumed from `resume`) with `config` and `data`
        (default: the project's settings and the editor's dataset), or the paused run in memory."""
        assert self.paths is not None
        if continue_run and self.run_config is not None:
            config = self.run_config  # the paused run's own settings
        if config is None:
            paths = self.paths
            config = replace(self.project.config, out=paths.out, checkpoint_dir=paths.checkpoint_dir)
            config = self._with_sample_prompts(config)
            self.sample_answers.clear()
        self.run_config = config
        self._ranks = 1
        self._latest_step = None
        self._show_next = False
        p = self.project
        if data is None:
            edited = self._edited_samples()
            data = edited if edited is not None else p.dataset_path
            if edited is not None and not continue_run:
                self._log(f"Training the {len(edited)} samples the editor shows (unsaved edits included)")
        elif isinstance(data, str):
            self._log(f"Training on {data}")
        template_file, expected = p.template_file, self.run
        self.phase = (
            f"Resuming at step {self.last_step}…"
            if continue_run
            else (PHASE_DATA if self._model_is_open() else PHASE_OPENING)
        )

        def train(session, job):
            job.emit(Phase(PHASE_DATA))
            session.set_template_file(template_file)
            if not (continue_run and session.run is expected and session.paused):
                if continue_run:  # the run in memory is gone (another model was opened): its checkpoint
                    ckpt = latest_checkpoint(config.checkpoint_dir)
                    if ckpt is None:
                        raise EngineError("the paused run is gone and left no checkpoint: start again")
                    session.new_run(data, config, resume=ckpt)
                else:
                    session.new_run(data, config, resume=resume)
            job.emit(RunHandle(session.run))
            return session.train(job.emit, job.should_stop, job.should_pause)

        self._segment_t0 = time.monotonic()
        self.job = self.engine.submit(
            "training",
            train,
            on_event=self._on_event,
            on_done=self._on_finished,
            on_error=self._on_failed,
            model=(p.model_path, p.device),
        )
        self._set_state("training" if continue_run else "loading")
        self._show_paths()
        self.plots.start()
        self._refresh_progress(force=True)

    def _with_sample_prompts(self, config: TrainConfig) -> TrainConfig:
        """`config` with the Sample answers tab's prompts (typed, or from the validation split)."""
        return replace(config, **self.project.sample_answers.config_changes())

    # --- runs on several processes ------------------------------------------------------------
    def _run_files(self, paths: RunPaths, data, config: TrainConfig | None = None) -> RunFiles:
        """The run's files beside its adapter, written: its settings (`config`, default the page's) and
        `data` when they are samples (a path, or None for the project's dataset, is read as it is)."""
        config = replace(config or self.project.config, out=paths.out, checkpoint_dir=paths.checkpoint_dir)
        config = self._with_sample_prompts(config)
        self.run_config = config
        dataset = data if isinstance(data, str) else self.project.dataset_path
        files = RunFiles.beside(paths.out, paths.checkpoint_dir, dataset)
        inputs = {"model": self.project.model_path, "chat template": self.project.template_file}
        return files.write(config, None if isinstance(data, str) else data, inputs)

    def _launch_processes(
        self, n: int, data, config: TrainConfig | None = None, resume: str | None = None
    ) -> bool:
        """Start the run as `n` processes beside the app (tune-engine train --ranks n): a new run with
        the page's settings, or the run of checkpoint `resume` with `config` (its own settings, or those
        the person chose over them in `_resume_choice`, hence --accept-changes) and `data`."""
        ok, why = local_ranks_available()
        if not ok:
            self.show_banner(f"Cannot train on {n} processes: {why}. Set Processes to 1 to train in the app.")
            return False
        try:
            files = self._run_files(self.paths, data, config)
        except OSError as exc:
            self.show_banner(f"The run's settings cannot be written ({exc.strerror or exc}): choose another "
                             "output folder.")  # fmt: skip
            return False
        except EngineError as exc:  # a file of the run beside its adapter would replace an input
            self.show_banner(f"{exc}")
            return False
        p = self.project
        command = files.command(p.model_path, ranks=n, template_file=p.template_file, device=p.device,
                                resume=resume, accept_changes=resume is not None)  # fmt: skip
        self._log(f"Training on {n} processes: {' '.join(command[3:])}")
        self._log(f"Events: {files.events}; output of the processes: {files.output}")
        self._ranks = n
        self.proc_run = ProcessRun(command, files, self)
        self.proc_run.sig_event.connect(self._on_event)
        self.proc_run.sig_done.connect(self._on_finished)
        self.phase = PHASE_OPENING
        self._segment_t0 = time.monotonic()
        try:
            self.proc_run.start()
        except OSError as exc:
            self.proc_run = None
            self.show_banner(f"The training processes cannot be started: {exc.strerror or exc}")
            return False
        self._set_state("loading")
        self._show_paths()
        self.plots.start()
        self._refresh_progress(force=True)
        return True

    def show_machines(self) -> MachinesDialog | None:
        """The command of this run across machines (settings written now, beside the next adapter)."""
        if not self._check_inputs():
            return None
        objective = self.project.config.objective
        if objective != "sft":
            self.show_banner(f"{objective.upper()} trains in one process, on one machine (its loss compares "
                             "the two answers of each pair): start it here with Processes at 1.")  # fmt: skip
            return None
        paths = self.default_paths()
        try:
            files = self._run_files(paths, self._edited_samples())
        except OSError as exc:
            self.show_banner(f"The run's settings cannot be written ({exc.strerror or exc}).")
            return None
        except EngineError as exc:
            self.show_banner(f"{exc}")
            return None
        p = self.project
        dialog = MachinesDialog(files, p.model_path, ranks=max(2, self.processes.value()),
                                template_file=p.template_file, device=p.device, parent=self)  # fmt: skip
        dialog.show()
        self.machines_dialog = dialog
        return dialog

    # --- worker signals (queued to the UI thread) -------------------------------------------
    @Slot(object)
    def _on_event(self, event: object) -> None:
        if isinstance(event, RunHandle):
            self.run = event.run
            return
        if isinstance(event, Phase):
            if self._latest_step is None and not self.phase.startswith("Resuming"):
                self.phase = event.text
                self._refresh_progress(force=True)
            return
        self.plots.add_event(event)
        if isinstance(event, (PreferenceStep, PreferenceEval)):
            self._on_preference(event)
        elif isinstance(event, Step):
            self.last_step = event.step
            self.total_steps = event.total_steps
            self.tokens_done += event.tokens
            self.elapsed_s = event.elapsed_s
            self._latest_step = event
            self.phase = ""
            self._progress_dirty = True
            if event.step % self.log_every == 0 or event.step == 1:
                self._log(
                    f"step {event.step}/{event.total_steps}  loss {event.mean_ce:.4f}  lr {event.lr:.3g}  "
                    f"‖g‖ {event.grad_norm:.3g}  {event.tokens_per_s:,.0f} tok/s"
                )
        elif isinstance(event, Started):
            self._on_started(event)
        elif isinstance(event, Eval):
            self._log(f"eval at step {event.step}: validation loss {event.mean_ce:.4f} (perplexity "
                      f"{event.perplexity:.3g}) over {event.n_tokens:,} tokens")  # fmt: skip
        elif isinstance(event, Checkpoint):
            self.last_checkpoint = event.path
            self._log(f"checkpoint at step {event.step}: {event.path}")
        elif isinstance(event, SampleAnswers):
            self.sample_answers.add_event(event)

    def _on_preference(self, event: PreferenceStep | PreferenceEval) -> None:
        self.preference_plots.add_event(event)
        if isinstance(event, PreferenceEval):
            self._log(f"held-out pairs at step {event.step}: accuracy {event.accuracy:.0%}, margin "
                      f"{event.margin:+.4f}, {event.objective.upper()} loss {event.loss:.4f} "
                      f"({event.n_pairs} pairs)")  # fmt: skip
        elif event.step % self.log_every == 0 or event.step == 1:
            self._log(f"  pairs: accuracy {event.accuracy:.0%}, margin {event.margin:+.4f}, log p chosen "
                      f"{event.chosen_logp:.3f}, rejected {event.rejected_logp:.3f}")  # fmt: skip

    def _show_objective(self, objective: str, total_steps: int, held_out: bool = True) -> None:
        """The plots of a run with this objective: the Preferences tab for DPO and ORPO."""
        tabs = self.plots.tabs
        index = tabs.indexOf(self.preference_plots)
        preference = objective != "sft"
        tabs.setTabVisible(index, preference)
        self.plots.set_loss_title(
            f"Loss ({objective.upper()} objective)" if preference else "Loss (mean cross-entropy)"
        )
        if preference:
            self.preference_plots.set_run(objective, total_steps, held_out)
            tabs.setCurrentIndex(index)  # the figures a preference run is watched by

    def _on_started(self, event: Started) -> None:
        plan = event.plan
        self._show_objective(plan.objective, plan.total_steps, plan.n_val > 0)
        self.total_steps = plan.total_steps
        self.last_step = plan.start_step
        if plan.start_step:  # a resumed run: its training time and tokens go on from the checkpoint's
            self.tokens_done, self.elapsed_s = plan.start_tokens, plan.start_seconds
        self.log_every = max(1, plan.total_steps // 50)
        self.phase = PHASE_FIRST_STEP
        cfg = self.run_config
        mem = plan.memory_bytes.get("total", 0)
        full = f" + {len(plan.full_tensors)} full tensors" if plan.full_tensors else ""
        resumed = f", resuming at step {plan.start_step}" if plan.start_step else ""
        line = (
            f"Started: {plan.n_train} training / {plan.n_val} validation samples, {plan.n_windows} windows "
            f"of {cfg.n_ctx if cfg else '?'} tokens ({plan.tokens_per_epoch:,} tokens, "
            f"{plan.label_tokens_per_epoch:,} trained per epoch), {plan.total_steps} steps{resumed}; "
            f"{plan.trainable_params:,} trainable parameters in {len(plan.lora_targets)} LoRA tensors{full}; "
            f"memory ≈ {human_bytes(mem)}"
        )
        if plan.problems:
            n_problems = max(plan.problems_total, len(plan.problems))  # the plan lists the first 1000
            shown = "; ".join(plan.problems[:3]) + ("; …" if n_problems > 3 else "")
            line += f"; {n_problems} dataset problems: {shown}"
            self.show_banner(
                f"The dataset has {n_problems} problems (samples skipped or truncated), e.g. "
                f"{plan.problems[0]}. Training goes on; fix them on the Dataset page.",
                "warning",
                page="Dataset",
            )
        self._log(line)
        self._ranks = plan.ranks
        if plan.ranks > 1:
            hosts = ", ".join(f"rank {r} on {h}" for r, h in enumerate(plan.hosts))
            self._log(f"{plan.ranks} processes, each with a share of every step's windows: {hosts}")
            self.state_label.setToolTip(f"Training on {plan.ranks} processes: {hosts}")
        self._show_state(self.run_states.started())  # a Stop that came first keeps the run stopping
        self._refresh_progress(force=True)

    def _on_failed(self, message: str) -> None:
        """The job ended with an error outside the run's own events (a bug, memory, no model)."""
        job, self.job = self.job, None
        self.plots.stop()
        self.phase = ""
        message = plain_words(message)
        self.show_banner(message)
        self._log(f"ERROR: {message}")
        for tb_line in (job.traceback if job is not None else "").rstrip().splitlines():
            self._log("    " + tb_line, stamp=False)
        failed = Failed(self.last_step + 1 if self.last_step else 0, message, self.last_checkpoint)
        self.last_result = failed
        self._tidy_after_failure()
        self._set_state("failed")
        self._refresh_progress(force=True)
        self.sig_run_finished.emit(failed)
        self._notify_end(failed)

    def _on_finished(self, result: object) -> None:
        self.job = None
        self.proc_run = None
        self.plots.stop()
        self.phase = ""
        if isinstance(result, Paused):
            self.last_step = result.step
            self._log(f"Paused at step {result.step}. Press Resume to go on from here.")
            self._set_state("paused")
            self._refresh_progress(force=True)
            return
        if result is None:  # ending a paused run whose model was closed in the meantime
            self._log("The paused run was already closed with its model; its checkpoints are kept.")
            self._set_state("finished")
            self._refresh_progress(force=True)
            return
        self.last_result = result
        self._latest_step = None
        if isinstance(result, Finished):
            self.last_step = result.step
            self.last_checkpoint = result.checkpoint_path or self.last_checkpoint
            loss = f", last loss {result.final_loss:.4f}" if result.final_loss is not None else ""
            wrote = "".join(
                f"; {what}: {path}"
                for what, path in (("adapter", result.adapter_path), ("model", result.merged_path),
                                   ("checkpoint", result.checkpoint_path))
                if path
            )  # fmt: skip
            self._log(f"{'Stopped' if result.stopped else 'Finished'} at step {result.step}{loss}{wrote}")
            self._set_state("finished")
        elif isinstance(result, Failed):
            self.last_checkpoint = result.checkpoint_path or self.last_checkpoint
            where = f"at step {result.step}" if result.step else "before training started"
            self._log(f"FAILED {where}: {result.message}")
            page = ""
            if result.checkpoint_path:
                hint = f" The last good checkpoint is {result.checkpoint_path}: fix the cause, then Resume."
            elif not result.step:
                hint = (" Nothing was trained: check the model (Model page), the dataset (Dataset page) "
                        "and the settings, then press Start.")  # fmt: skip
                page = "Dataset" if "sample" in result.message or "dataset" in result.message else ""
            else:
                hint = " Fix the cause, then press Start."
            self._tidy_after_failure()
            self.show_banner(
                f"Training failed {where}: {_sentence(plain_words(result.message))}{hint}", page=page
            )
            self._set_state("failed")
        self._refresh_progress(force=True)
        self.sig_run_finished.emit(result)
        self._notify_end(result)

    def _tidy_after_failure(self) -> None:
        """A run that failed before its first checkpoint leaves no folder behind."""
        if self.paths is None:
            return
        removed = clean_failed_run(self.paths.checkpoint_dir, self._created)
        if removed:
            self._log("Removed the folders of the failed run: " + ", ".join(removed))
        self._created = []

    # --- notification -----------------------------------------------------------------------
    def _notify_end(self, result: object) -> None:
        """A long run ended: alert the window, show a tray message when there is a tray, and say
        it in the window's status line (sig_notice)."""
        took = time.monotonic() - self._segment_t0
        if took < self.notify_after_s:
            return
        if isinstance(result, Finished):
            what = "stopped" if result.stopped else "finished"
            text = f"Training {what} at step {result.step} after {human_duration(took)}"
            text += f"; adapter written: {result.adapter_path}" if result.adapter_path else ""
        else:
            text = f"Training failed after {human_duration(took)}: {getattr(result, 'message', '')}"
        window = self.window()
        QApplication.alert(window)
        if QSystemTrayIcon.isSystemTrayAvailable():
            if self._tray is None:
                icon = window.windowIcon()
                if icon.isNull():
                    icon = self.style().standardIcon(QStyle.SP_ComputerIcon)
                self._tray = QSystemTrayIcon(icon, self)
                self._tray.messageClicked.connect(lambda: (window.raise_(), window.activateWindow()))
            self._tray.show()
            self._tray.showMessage("Tune Studio", text, QSystemTrayIcon.Information, 15_000)
            QTimer.singleShot(20_000, self._tray, self._tray.hide)
        if isinstance(window, QMainWindow):
            window.statusBar().showMessage(text, 30_000)
        self.sig_notice.emit(text)

    # --- progress ---------------------------------------------------------------------------
    def _refresh_progress(self, force: bool = False) -> None:
        if not (self._progress_dirty or force):
            return
        self._progress_dirty = False
        active = self.state.active
        plan = self.check.plan if self.check is not None else None
        if not active and self._show_next:  # the next run, as the check planned it
            if plan is not None and plan.total_steps:
                self.progress.setRange(0, plan.total_steps)
                self.progress.setValue(0)
                self.progress.setFormat("%v / %m steps")
                self.stats_label.setText(f"Next run: {plan.describe(self.project.config)}.")
            else:
                self.progress.setRange(0, 1)
                self.progress.setValue(0)
                waiting = self.info is None or self._input_blocker() is not None
                self.progress.setFormat(
                    "steps: waiting for a model and a dataset" if waiting
                    else "steps: no trainable sample" if plan is not None else "steps: counting…"
                )  # fmt: skip
                self.stats_label.setText("Not started.")
            self.stats_label.setToolTip(self.stats_label.text())
            return
        total = max(1, self.total_steps)
        self.progress.setRange(0, total)
        self.progress.setValue(min(self.last_step, total))
        self.progress.setFormat("%v / %m steps" if self.total_steps else "steps: counting…")
        self.stats_label.setText(self._stats_text())
        self.stats_label.setToolTip(self.stats_label.text())

    def _stats_text(self) -> str:
        s = self._latest_step
        if self.state.active and s is None:
            return self.phase or "Starting…"
        elapsed = human_duration(self.elapsed_s)
        if self.state.active and s is not None:
            return (
                f"Step {s.step:,} of {s.total_steps:,} · {elapsed} elapsed · {eta_words(s.eta_s)} · "
                f"{s.tokens_per_s:,.0f} tokens/s · epoch {s.epoch:.2f} · "
                f"{self.tokens_done:,} tokens processed"
            )
        if self.state == "paused":
            return (
                f"Paused at step {self.last_step:,} of {self.total_steps:,} · {elapsed} of training so far."
            )
        result = self.last_result
        if isinstance(result, Finished):
            what = "Stopped" if result.stopped else "Finished"
            loss = f" · last loss {result.final_loss:.4f}" if result.final_loss is not None else ""
            return (f"{what} at step {result.step:,} of {self.total_steps:,} · {elapsed} of training · "
                    f"{self.tokens_done:,} tokens processed{loss}")  # fmt: skip
        if isinstance(result, Failed):
            return (
                f"Failed at step {result.step:,} · {elapsed} of training."
                if result.step
                else "Failed before the first step."
            )
        return "Not started."

    # --- log --------------------------------------------------------------------------------
    def _log(self, line: str, stamp: bool = True) -> None:
        """Append a line; the view follows new lines unless the person scrolled up."""
        bar = self.log.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 1
        keep = bar.value()
        self.log.appendPlainText((time.strftime("[%H:%M:%S] ") if stamp else "") + line)
        if at_end:
            bar.setValue(bar.maximum())
        else:
            bar.setValue(min(keep, bar.maximum()))

    # --- lifetime ---------------------------------------------------------------------------
    def is_running(self) -> bool:
        """A training job is queued or running (a paused run is not running)."""
        processes = self.proc_run is not None and self.proc_run.running
        return (self.job is not None and self.job.active) or processes

    def stop_and_wait(self, timeout_s: float = 900.0) -> bool:
        """End the run (running, or paused in memory) after its current step, with its checkpoint and
        adapter written, and wait for that while the window keeps painting (input waits). True when
        no run is left; False when it did not end within `timeout_s`."""
        if self.state in ("loading", "training", "pausing", "paused"):
            self.stop()
        if not self.is_running():
            return True
        self._log("Waiting for the current step to end and the checkpoint to be written…")
        loop = QEventLoop()
        done = lambda *_: loop.quit() if not self.is_running() else None  # noqa: E731
        self.sig_state_changed.connect(done)
        self.sig_run_finished.connect(done)
        timer = QTimer()
        timer.setSingleShot(True)
        timer.timeout.connect(loop.quit)
        timer.start(int(timeout_s * 1000))
        if self.is_running():
            loop.exec(QEventLoop.ExcludeUserInputEvents)
        timer.stop()
        self.sig_state_changed.disconnect(done)
        self.sig_run_finished.disconnect(done)
        return not self.is_running()

    def reset(self) -> None:
        """A new project: no run, no curves, no log, no checkpoint offered (the run's files stay)."""
        if self.state.active or self.state == "paused":
            self.stop_and_wait()
        self.run_states.reset()
        self._forget_run()
        self.resumable = None
        self.log.clear()
        self.ever_started = False
        self.hide_banner()
        self._set_state("idle", force=True)
        self._refresh_progress(force=True)

    def shutdown(self) -> None:
        """Ask a running run to stop (the engine writes its checkpoint); the window then waits for
        the engine worker (Engine.shutdown). Processes beside the app stop after their step and
        write their checkpoint by themselves."""
        if self.job is not None and self.job.active:
            self.job.request_stop()
        if self.proc_run is not None:
            self.proc_run.stop()
        self.check_timer.stop()
        self.plots.timer.stop()
        if self._tray is not None:
            self._tray.hide()


_BYTES_REPR = re.compile(r"""\bb(['"])(.*?)\1""")


def plain_words(message: str) -> str:
    """A message for people: Python's byte reprs (b'hell') become quoted text ("hell")."""
    return _BYTES_REPR.sub(lambda m: f'"{m.group(2)}"', message)


def _sentence(message: str) -> str:
    """A message as a sentence: ends with a full stop."""
    message = message.strip()
    return message if message.endswith((".", "!", "?")) else message + "."


__all__ = ["RunState", "Phase", "RunPaths", "TrainPage", "eta_words", "human_duration", "plain_words"]
