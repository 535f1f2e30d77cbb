"""The Train page: hyperparameters, start / pause / resume / stop, progress, live plots, event log.

Training is a job of the app's one engine worker (studio.worker): the run lives in the engine
session beside the open model, and this page only reacts to its events. Events are buffered by
`TrainPlotsWidget` and drawn from a timer, so a fast run never floods the UI. Pause takes effect
after the current step and keeps the run in memory: Resume goes on from that step with nothing
reloaded. Stop ends the run after the current step with a checkpoint and the adapter. After a stop,
a failure, or a restart of the app, Resume continues from the latest checkpoint (the same
trajectory); "Resume from checkpoint…" continues any checkpoint folder. Each run writes
`<output folder>/<dataset stem>-<time>.gguf` and its checkpoints to the sibling folder
`<dataset stem>-<time>-checkpoints`, unless the project's TrainConfig names `out` /
`checkpoint_dir` itself.

States (`state`, `sig_state_changed`): idle, loading (the model loads in the worker), training,
pausing, paused, stopping, finished, failed. Problems (no model or dataset, an output folder that
cannot be written, a failed run) are shown in a banner on the page that says what to do next.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import (
    Checkpoint,
    EngineError,
    Eval,
    Failed,
    Finished,
    Paused,
    Started,
    Step,
    TrainConfig,
    human_bytes,
)

from ...dataset_document import DatasetDocument
from ...paths import latest_checkpoint, writable_problem
from ...project import ModelInfo, Project
from ...widgets.plots import TrainPlotsWidget
from ...worker import Engine, Job
from .settings import TrainSettingsWidget

STATES = ("idle", "loading", "training", "pausing", "paused", "stopping", "finished", "failed")
ACTIVE = ("loading", "training", "pausing", "stopping")
LOG_MAX_LINES = 5000

BANNER_STYLES = {
    "error": "QFrame#banner { background: rgba(192, 57, 43, 0.13); border: 1px solid #c0392b; "
    "border-radius: 4px; } QLabel { color: #8e2b20; }",
    "warning": "QFrame#banner { background: rgba(230, 160, 20, 0.16); border: 1px solid #d49a12; "
    "border-radius: 4px; } QLabel { color: #6b4a00; }",
    "info": "QFrame#banner { background: rgba(41, 128, 185, 0.12); border: 1px solid #2980b9; "
    "border-radius: 4px; } QLabel { color: #1b4f72; }",
}


def human_duration(seconds: float) -> str:
    if seconds != seconds or seconds < 0:  # NaN
        return "–"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@dataclass
class RunPaths:
    out: str  # adapter GGUF written at the end
    checkpoint_dir: str  # checkpoint folders


class TrainPage(QWidget):
    """Train the project's model on its dataset with its settings; see the module docstring."""

    sig_state_changed = Signal(str)
    sig_run_finished = Signal(object)  # the engine's Finished or Failed of each run segment

    def __init__(
        self,
        project: Project,
        engine: Engine,
        dataset: DatasetDocument | None = None,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.project = project
        self.engine = engine
        self.dataset = dataset  # the samples the editor shows: trained as they are, unsaved edits included
        self.info: ModelInfo | None = None
        self._state = "idle"
        self.job: Job | None = None  # the training job in flight
        self.run = None  # the engine's run of this page (an identity token; it lives in the worker)
        self.paths: RunPaths | None = None  # of the current (or last) run
        self.run_config: TrainConfig | None = None
        self.last_result: Finished | Failed | None = None
        self.last_checkpoint: str | None = None
        self.total_steps = 0
        self.last_step = 0
        self.tokens_done = 0
        self._latest_step: Step | None = None
        self._progress_dirty = False
        self.log_every = 10  # log one Step line in this many

        # --- settings (left) ---
        self.settings = TrainSettingsWidget(project)
        scroll = QScrollArea()
        scroll.setWidget(self.settings)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        scroll.setFrameShape(QFrame.NoFrame)
        scroll.setMinimumWidth(self.settings.sizeHint().width() + 24)
        self.settings_scroll = scroll

        # --- banner ---
        self.banner = QFrame()
        self.banner.setObjectName("banner")
        self.banner_label = QLabel()
        self.banner_label.setWordWrap(True)
        self.banner_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.banner_level = ""
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss this message")
        close.clicked.connect(self.hide_banner)
        bl = QHBoxLayout(self.banner)
        bl.setContentsMargins(8, 4, 4, 4)
        bl.addWidget(self.banner_label, 1)
        bl.addWidget(close, 0, Qt.AlignTop)
        self.banner.hide()

        # --- controls ---
        b = self._button
        self.start_button = b(
            "Start", "Ctrl+Return", self.start, "Start a new training run with these settings (Ctrl+Enter)."
        )
        self.pause_button = b(
            "Pause",
            "Ctrl+P",
            self.pause,
            "Stop after the current step and write a checkpoint; Resume continues from it (Ctrl+P).",
        )
        self.resume_button = b(
            "Resume",
            "Ctrl+Shift+Return",
            self.resume,
            "Continue this run from its latest checkpoint (Ctrl+Shift+Enter).",
        )
        self.stop_button = b(
            "Stop",
            "Ctrl+.",
            self.stop,
            "End the run after the current step; the adapter and a checkpoint are written (Ctrl+.).",
        )
        self.resume_from_button = b("Resume from checkpoint…", None, self.choose_checkpoint,
                                    "Continue training from a checkpoint folder (ckpt-NNNNNN, or a "
                                    "folder of them: the newest).")  # fmt: skip
        self.state_label = QLabel()
        self.state_label.setMinimumWidth(90)
        self.state_label.setAlignment(Qt.AlignRight | Qt.AlignVCenter)
        controls = QHBoxLayout()
        controls.setSpacing(4)
        for b in (self.start_button, self.pause_button, self.resume_button, self.stop_button):
            controls.addWidget(b)
        controls.addSpacing(8)
        controls.addWidget(self.resume_from_button)
        controls.addStretch(1)
        controls.addWidget(self.state_label)

        # --- progress ---
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("%v / %m steps")
        self.progress.setTextVisible(True)
        self.stats_label = QLabel("Not started.")
        self.stats_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        # its text changes at every tick: never let that re-layout the page
        self.stats_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)
        self.paths_label = QLabel()
        self.paths_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.paths_label.setWordWrap(True)
        self.paths_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.output_button = QPushButton("Output folder…")
        self.output_button.setToolTip(
            "Choose where adapters and checkpoints are written. Default: a tune-studio-out folder "
            "beside the project file (or the dataset)."
        )
        self.output_button.clicked.connect(self.choose_output_folder)
        paths_row = QHBoxLayout()
        paths_row.addWidget(self.paths_label, 1)
        paths_row.addWidget(self.output_button, 0, Qt.AlignTop)

        # --- plots and log ---
        self.plots = TrainPlotsWidget()
        self.plots.timer.timeout.connect(self._refresh_progress)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(LOG_MAX_LINES)
        self.log.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.log.setPlaceholderText("Events of the run appear here.")
        font = self.log.font()
        font.setStyleHint(font.StyleHint.Monospace)
        font.setFamily("monospace")
        self.log.setFont(font)
        vsplit = QSplitter(Qt.Vertical)
        vsplit.addWidget(self.plots)
        vsplit.addWidget(self.log)
        vsplit.setStretchFactor(0, 4)
        vsplit.setStretchFactor(1, 1)
        vsplit.setSizes([480, 120])
        vsplit.setChildrenCollapsible(False)

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(4)
        rl.addWidget(self.banner)
        rl.addLayout(controls)
        rl.addWidget(self.progress)
        rl.addWidget(self.stats_label)
        rl.addLayout(paths_row)
        rl.addWidget(vsplit, 1)

        split = QSplitter(Qt.Horizontal)
        split.addWidget(scroll)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setChildrenCollapsible(False)
        self.splitter = split
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(split)

        project.subscribe(self._project_changed)
        self.destroyed.connect(lambda *_, cb=self._project_changed: project.unsubscribe(cb))
        self._set_state("idle", force=True)
        self._show_paths()

    def _button(self, text: str, shortcut: str | None, slot, tip: str) -> QPushButton:
        b = QPushButton(text)
        if shortcut:
            b.setShortcut(QKeySequence(shortcut))
        b.setToolTip(tip)
        b.clicked.connect(slot)
        return b

    # --- state ------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._state

    def _set_state(self, state: str, force: bool = False) -> None:
        assert state in STATES, state
        changed = state != self._state
        self._state = state
        active = state in ACTIVE
        resumable = state in ("paused", "failed", "finished") and self._can_resume()
        self.start_button.setEnabled(not active)
        self.pause_button.setEnabled(state == "training")
        self.resume_button.setEnabled(resumable)
        self.stop_button.setEnabled(state in ("loading", "training", "paused"))  # paused: end it
        self.resume_from_button.setEnabled(not active)
        self.output_button.setEnabled(not active)
        self.settings.setEnabled(not active)
        self.state_label.setText(f"<b>{state}</b>")
        if changed or force:
            self.sig_state_changed.emit(state)

    def _can_resume(self) -> bool:
        """The run is paused in memory, or a checkpoint of it exists and it has steps left."""
        if self._state == "paused":
            return True
        if self.paths is None or latest_checkpoint(self.paths.checkpoint_dir) is None:
            return False
        if isinstance(self.last_result, Finished) and not self.last_result.stopped:
            return False
        return True

    # --- model ------------------------------------------------------------------------------
    def set_model_info(self, info: ModelInfo | None) -> None:
        """The open model (for the heatmaps' layer and expert counts); None when none is open."""
        self.info = info
        if info is None:
            self.plots.set_model_shape(None, 0)
        else:
            cfg = info.summary.config
            self.plots.set_model_shape(cfg.L, cfg.E)
        if self.banner_level == "error" and info is not None and "model" in self.banner_label.text():
            self.hide_banner()

    def _project_changed(self, changed: set[str]) -> None:
        if changed & {"dataset_path", "output_dir", "path", "model_path", "config"}:
            self._show_paths()

    # --- banner -----------------------------------------------------------------------------
    def show_banner(self, text: str, level: str = "error") -> None:
        """A message on the page itself (error / warning / info) with what to do next."""
        self.banner_level = level
        self.banner.setStyleSheet(BANNER_STYLES[level])
        self.banner_label.setText(text)
        self.banner.show()

    def hide_banner(self) -> None:
        self.banner_level = ""
        self.banner.hide()

    def banner_text(self) -> str:
        return self.banner_label.text() if not self.banner.isHidden() else ""

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
        if self.paths is not None and self._state != "idle":
            p = self.paths
            self.paths_label.setText(f"Adapter: {p.out}\nCheckpoints: {p.checkpoint_dir}")
        else:
            p = self.default_paths(stamp="<date-time>")
            self.paths_label.setText(f"Next run writes: {p.out}\nCheckpoints: {p.checkpoint_dir}")
        self.paths_label.setToolTip(self.paths_label.text())

    def choose_output_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Output folder", self.project.output_folder())
        if folder:
            self.project.update(output_dir=folder)
            self._show_paths()

    # --- actions ----------------------------------------------------------------------------
    def _check_inputs(self) -> bool:
        p = self.project
        if not p.model_path:
            self.show_banner("No model is chosen. Open a .gguf model on the Model page, then press Start.")
            return False
        if not os.path.isfile(p.model_path):
            self.show_banner(f"The model file {p.model_path} does not exist any more. Open it again on the "
                             "Model page.")  # fmt: skip
            return False
        if self._edited_samples() is not None:
            return True  # the editor's samples, saved or not
        if not p.dataset_path:
            self.show_banner("No dataset is chosen. Open or create a JSONL dataset on the Dataset page, then "
                             "press Start.")  # fmt: skip
            return False
        if not os.path.isfile(p.dataset_path):
            self.show_banner(f"The dataset file {p.dataset_path} does not exist. Choose it again on the "
                             "Dataset page.")  # fmt: skip
            return False
        return True

    def _check_writable(self, paths: RunPaths) -> bool:
        for folder in {os.path.dirname(os.path.abspath(paths.out)), paths.checkpoint_dir}:
            why = writable_problem(folder)
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
        saved = (
            doc.path and self.project.dataset_path and os.path.samefile(doc.path, self.project.dataset_path)
        )
        return None if (saved and not doc.dirty) else doc.samples()

    def start(self) -> bool:
        """Start a new run with the project's settings; False (and a banner) if it cannot start."""
        if self._state in ACTIVE:
            return False
        if not self._check_inputs():
            return False
        paths = self.default_paths()
        if not self._check_writable(paths):
            return False
        self.hide_banner()
        self.paths = paths
        self.plots.clear()
        self.tokens_done = 0
        self.last_step = 0
        self.total_steps = 0
        self.last_checkpoint = None
        self.last_result = None
        self._log(f"New run: {os.path.basename(self.project.model_path)} on "
                  f"{os.path.basename(self.project.dataset_path)}; adapter → {paths.out}")  # fmt: skip
        self._launch(resume=None)
        return True

    def resume(self) -> bool:
        """Continue the current run: in memory after Pause, else from its latest checkpoint."""
        if self._state in ACTIVE or self.paths is None:
            return False
        if self._state == "paused":
            self.hide_banner()
            self._log(f"Resuming at step {self.last_step}")
            self._launch(resume=None, continue_run=True)
            return True
        ckpt = latest_checkpoint(self.paths.checkpoint_dir)
        if ckpt is None:
            self.show_banner(f"No checkpoint of this run was found in {self.paths.checkpoint_dir}. "
                             "Start a new run, or resume from another checkpoint folder.")  # fmt: skip
            return False
        return self.resume_from(ckpt, same_run=True)

    def choose_checkpoint(self) -> None:
        start_dir = self.paths.checkpoint_dir if self.paths else self.project.output_folder()
        folder = QFileDialog.getExistingDirectory(self, "Resume from checkpoint", start_dir)
        if folder:
            self.resume_from(folder)

    def resume_from(self, folder: str, same_run: bool = False) -> bool:
        """Continue training from a checkpoint folder (ckpt-NNNNNN, or a folder holding them)."""
        if self._state in ACTIVE or not self._check_inputs():
            return False
        ckpt = folder if os.path.basename(os.path.normpath(folder)).startswith("ckpt-") else None
        ckpt = ckpt or latest_checkpoint(folder)
        if ckpt is None or not os.path.isdir(ckpt):
            self.show_banner(f"{folder} is not a checkpoint: choose a ckpt-NNNNNN folder (inside a run's "
                             "-checkpoints folder), or the -checkpoints folder itself.")  # fmt: skip
            return False
        ckpt = os.path.abspath(ckpt)
        if not same_run:
            parent = os.path.dirname(ckpt)
            out = parent[: -len("-checkpoints")] + ".gguf" if parent.endswith("-checkpoints") else None
            paths = RunPaths(out or self.default_paths().out, parent)
            if not self._check_writable(paths):
                return False
            self.paths = paths
            self.plots.clear()
            self.tokens_done = 0
            self.last_result = None
        self.hide_banner()
        self._log(f"Resuming from {ckpt}")
        self._launch(resume=ckpt)
        return True

    def pause(self) -> None:
        """Pause after the current step; the run stays in memory and Resume goes on from there."""
        if self._state == "training" and self.job is not None:
            self.job.request_pause()
            self._set_state("pausing")
            self._log("Pausing after the current step…")

    def stop(self) -> None:
        """End the run after the current step (the adapter and a checkpoint are written). No question."""
        if self._state in ("loading", "training") and self.job is not None:
            self.job.request_stop()
            self._set_state("stopping")
            self._log("Stopping after the current step…")
        elif self._state == "paused":
            self._log(f"Ending the run paused at step {self.last_step}…")
            self._set_state("stopping")
            run = self.run

            def stop_paused(session, job):
                if session is None or session.run is not run or not session.paused:
                    return None  # the model was closed since: its checkpoints are on disk
                return session.stop_run(job.emit)

            self.job = self.engine.submit("ending the run", stop_paused, on_event=self._on_event,
                                          on_done=self._on_finished, on_error=self._on_failed)  # fmt: skip

    def _launch(self, resume: str | None, continue_run: bool = False) -> None:
        assert self.paths is not None
        config = replace(self.project.config, out=self.paths.out, checkpoint_dir=self.paths.checkpoint_dir)
        self.run_config = config
        self._latest_step = None
        p = self.project
        edited = self._edited_samples()
        data = edited if edited is not None else p.dataset_path
        if edited is not None and not continue_run:
            self._log(f"Training the {len(edited)} samples the editor shows (unsaved edits included)")
        template_file, expected = p.template_file, self.run

        def train(session, job):
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

    # --- worker signals (queued to the UI thread) -------------------------------------------
    @Slot(object)
    def _on_event(self, event: object) -> None:
        if isinstance(event, RunHandle):
            self.run = event.run
            return
        self.plots.add_event(event)
        if isinstance(event, Step):
            self.last_step = event.step
            self.total_steps = event.total_steps
            self.tokens_done += event.tokens
            self._latest_step = event
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

    def _on_started(self, event: Started) -> None:
        plan = event.plan
        self.total_steps = plan.total_steps
        self.last_step = plan.start_step
        self.log_every = max(1, plan.total_steps // 50)
        self.progress.setRange(0, max(1, plan.total_steps))
        self.progress.setValue(plan.start_step)
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
            shown = "; ".join(plan.problems[:3]) + ("; …" if len(plan.problems) > 3 else "")
            line += f"; {len(plan.problems)} dataset problems: {shown}"
            self.show_banner(
                f"The dataset has {len(plan.problems)} problems (samples skipped or truncated), e.g. "
                f"{plan.problems[0]}. Training goes on; fix them on the Dataset page.",
                "warning",
            )
        self._log(line)
        self._set_state("training")

    def _on_failed(self, message: str) -> None:
        """The job ended with an error outside the run's own events (a bug, memory, no model)."""
        job, self.job = self.job, None
        self.plots.stop()
        self.show_banner(message)
        self._log(f"ERROR: {message}")
        for tb_line in (job.traceback if job is not None else "").rstrip().splitlines():
            self._log("    " + tb_line, stamp=False)
        failed = Failed(self.last_step + 1 if self.last_step else 0, message, self.last_checkpoint)
        self.last_result = failed
        self._set_state("failed")
        self.sig_run_finished.emit(failed)

    def _on_finished(self, result: object) -> None:
        self.job = None
        self.plots.stop()
        self._refresh_progress(force=True)
        if isinstance(result, Paused):
            self.last_step = result.step
            self._log(f"Paused at step {result.step}. Press Resume to go on from here.")
            self._set_state("paused")
            return
        if result is None:  # ending a paused run whose model was closed in the meantime
            self._log("The paused run was already closed with its model; its checkpoints are kept.")
            self._set_state("finished")
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
            if result.stopped:
                self._log(f"Stopped at step {result.step}{loss}{wrote}")
                self._set_state("finished")
            else:
                self._log(f"Finished at step {result.step}{loss}{wrote}")
                self._set_state("finished")
        elif isinstance(result, Failed):
            self.last_checkpoint = result.checkpoint_path or self.last_checkpoint
            where = f"at step {result.step}" if result.step else "before training started"
            self._log(f"FAILED {where}: {result.message}")
            if result.checkpoint_path:
                hint = f" The last good checkpoint is {result.checkpoint_path}: fix the cause, then Resume."
            elif not result.step:
                hint = (" Nothing was trained: check the model (Model page), the dataset (Dataset page) "
                        "and the settings, then press Start.")  # fmt: skip
            else:
                hint = " Fix the cause, then press Start."
            self.show_banner(f"Training failed {where}: {result.message}{hint}")
            self._set_state("failed")
        self.sig_run_finished.emit(result)

    # --- progress ---------------------------------------------------------------------------
    def _refresh_progress(self, force: bool = False) -> None:
        if not (self._progress_dirty or force):
            return
        self._progress_dirty = False
        s = self._latest_step
        self.progress.setRange(0, max(1, self.total_steps))
        self.progress.setValue(min(self.last_step, max(1, self.total_steps)))
        if s is None:
            return
        elapsed = human_duration(s.elapsed_s)
        self.stats_label.setText(
            f"{self.tokens_done:,} tokens processed · elapsed {elapsed}"
            f" · ETA {human_duration(s.eta_s)} · {s.tokens_per_s:,.0f} tokens/s · epoch {s.epoch:.2f}"
        )

    # --- log --------------------------------------------------------------------------------
    def _log(self, line: str, stamp: bool = True) -> None:
        self.log.appendPlainText((time.strftime("[%H:%M:%S] ") if stamp else "") + line)

    # --- lifetime ---------------------------------------------------------------------------
    def is_running(self) -> bool:
        """A training job is queued or running (a paused run is not running)."""
        return self.job is not None and self.job.active

    def shutdown(self) -> None:
        """Ask a running run to stop (the engine writes its checkpoint); the window then waits for
        the engine worker (Engine.shutdown)."""
        if self.job is not None and self.job.active:
            self.job.request_stop()
        self.plots.timer.stop()


@dataclass(frozen=True)
class RunHandle:
    """Sent by the training job before its first step: the engine's run, as an identity token."""

    run: object


__all__ = ["STATES", "RunPaths", "TrainPage"]
