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

With "Processes" above 1, Start (or a resume) runs `tune-engine train --ranks N` beside the app
(studio.pages.train.processes): the page follows rank 0's events file as it follows the worker, Stop
ends every rank after the same step; there is no Pause. "Across machines…" gives the `mpiexec` line.

A new model resets what belonged to the old one: Resume is no longer offered (a checkpoint of
another model neither), and the hyperparameters go back to their defaults (the targets stay).

States (`state`, `sig_state_changed`): idle, loading (the model loads in the worker), training,
pausing, paused, stopping, finished, failed. Problems (no model or dataset, an output folder that
cannot be written, a failed run) are shown in a banner on the page that says what to do next.

Where things are: this module wires the widgets to the run; what they show is decided without Qt
in `controller` (the run: its events, results, stats line) and `next_run` (before Start: blockers,
paths, the first look; before a resume: whose settings go on), with the states in `run_state`. The
widgets are made in `layout`; the check of the next run is `checker` (its job: `plan.check_run`);
the resume question and the end-of-run alert are in `dialogs`. At about 860 lines this module is
over the ~600 the studio aims at: what is left is the wiring of one page (each method joins widgets,
the engine worker and the controller), and cutting it further would spread one page's slots over
modules that each need the whole page.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QTimer, Signal, Slot
from PySide6.QtWidgets import QFileDialog, QWidget

from engine import (
    CheckpointInfo,
    EngineError,
    PreferenceEval,
    PreferenceStep,
    SampleAnswers,
    Started,
    Step,
    TrainConfig,
    describe_settings,
    local_ranks_available,
    plan_warning,
)

from ...dataset_document import DatasetDocument
from ...paths import same_file
from ...project import DataStats, ModelInfo, Project, matching_preset
from ...widgets.runs import load_runs, resume_checkpoint, same_model
from ...worker import Engine, Job
from . import controller as ctl
from . import next_run as nr
from .checker import NextRunCheck
from .controller import PHASE_DATA, PHASE_OPENING, Phase, Reaction, RunHandle, TrainController
from .dialogs import EndAlert, ask_resume, wait_while
from .folders import clean_failed_run, missing_folders
from .layout import setup_ui, show_objective
from .next_run import RunPaths
from .plan import Blocker, RunCheck
from .processes import MachinesDialog, ProcessRun, RunFiles
from .run_state import RunState, controls

CHECK_DELAY_MS = 400  # settings and dataset changes are checked this long after the last one


def _delegate(name: str, doc: str) -> property:
    """A page attribute that is the controller's (tests and the window read and set them here)."""
    return property(
        lambda self: getattr(self.controller, name),
        lambda self, value: setattr(self.controller, name, value),
        doc=doc,
    )


class TrainPage(QWidget):
    """Train the project's model on its dataset with its settings; see the module docstring."""

    sig_state_changed = Signal(str)
    sig_run_finished = Signal(object)  # the engine's Finished or Failed of each run segment
    sig_go_to_page = Signal(str)  # a link asked for another page: "Model", "Dataset", "Targets"
    sig_notice = Signal(str)  # a long run ended: what the window also showed in its status line
    sig_open_dataset = Signal(str)  # a resumed run's dataset, for an empty editor to show

    # the run's own data lives in the controller (controller.TrainController)
    run = _delegate("run", "the engine's run of this page (an identity token; it lives in the worker)")
    run_model = _delegate("run_model", "the model file of the current (or last) run")
    paths = _delegate("paths", "where the current (or last) run writes (RunPaths)")
    run_config = _delegate("config", "the settings of the current (or last) run")
    last_result = _delegate("last_result", "Finished or Failed of the last run segment")
    last_checkpoint = _delegate("last_checkpoint", "the newest checkpoint the run wrote")
    last_step = _delegate("last_step", "the run's latest step")
    tokens_done = _delegate("tokens_done", "tokens the run processed")
    notify_after_s = _delegate("notify_after_s", "a run segment longer than this alerts the window")
    _segment_t0 = _delegate("segment_t0", "time.monotonic() when the run segment began")

    @property
    def check_timer(self) -> QTimer:
        """Checks the next run when it times out (after changes: checker.NextRunCheck)."""
        return self.checker.timer

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
        self.controller = TrainController()
        self.run_states = self.controller.states
        self.resumable: tuple[str, str] | None = None  # (checkpoint, run name) of a run of this model
        # ask_resume(text, run_data) -> "run" | "page" | "cancel": before resuming with settings or data
        # that differ from the checkpoint's run (run_data False: the run's data is gone); tests replace it
        self.ask_resume = self._ask_resume
        self.dataset = dataset  # the samples the editor shows: trained as they are, unsaved edits included
        self.info: ModelInfo | None = None
        self.job: Job | None = None  # the training job in flight
        self.proc_run: ProcessRun | None = None  # a run on several processes beside the app
        self.machines_dialog: MachinesDialog | None = None
        self.ever_started = False  # a run was started from this page (the first look is over)
        self._progress_dirty = False
        self._config_model = project.model_path  # the model the hyperparameters were set for
        # the check of the next run (plan.check_run), done by an engine job
        self.check: RunCheck | None = None
        self.check_config: TrainConfig | None = None  # the settings `check` was made with
        self._show_next = True  # the progress bar shows the next run's plan (not the last run's end)
        self._alert = EndAlert(self)  # a long run ended: the window, the tray, the status line
        self.checker = NextRunCheck(engine, CHECK_DELAY_MS, self)
        self.checker.sig_due.connect(self.check_now)
        self.checker.sig_checked.connect(self._check_done)
        self.checker.sig_failed.connect(self._check_failed)
        self.banner_level = ""
        self._banner_plain = ""
        self._samples_opened = False  # the Sample answers tab was opened from the first look, before any run
        setup_ui(self, project)  # the widgets: studio.pages.train.layout

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
        ranks = self.controller.ranks
        on = f" on {ranks} processes" if ranks > 1 and active else ""
        self.state_label.setText(f"<b>{state}</b>{on}")
        self._update_start()
        if changed or announce:
            self.sig_state_changed.emit(state.value)
            if not active and changed:
                self.schedule_check()  # memory and data may have changed with the run

    def _can_resume(self) -> bool:
        """The run is paused in memory, or a checkpoint of it exists and it has steps left; and it
        is a run of the open model."""
        return self.controller.can_resume(self.project.model_path, self.resumable)

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
            reset = nr.settings_for_model(self.project, self._config_model, info, self.settings.data)
            if reset:
                name = Path(info.path).name
                self._log(f"New model {name}: {reset}.")
                self.show_banner(f"{name} is a new model: {reset}. Pick another preset or adjust them, then "
                                 "press Start.", "info")  # fmt: skip
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
        for line in self.controller.forget():
            self._log(line)
        self._show_next = True
        self.plots.clear()  # the curves were the old model's
        self._set_state("idle")
        self._show_paths()

    def _project_changed(self, changed: set[str]) -> None:
        if {"model_path", "config"} <= changed:  # a project loaded, restored or reset: its settings
            self._config_model = self.project.model_path  # belong to its model
        if changed & {"dataset_path", "output_dir", "path", "model_path", "config"}:
            self._show_paths()
        settings = {c[len("config.") :] for c in changed if c.startswith("config.")}
        relevant = changed & {"model_path", "dataset_path", "template_file", "device"} or (
            "config" in changed and (not settings or settings & ctl.CHECKED_SETTINGS)
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
        self.checker.schedule()

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
        config = p.config
        return self.checker.submit(nr.check_job(info, nr.check_data(self.dataset, p), config,
                                                p.template_file, self.checker.encodings), config)  # fmt: skip

    def _check_done(self, result: RunCheck, config: TrainConfig) -> None:
        self.check = result
        self.check_config = config  # the settings it checked
        plan = result.plan
        if plan is not None and plan.n_usable:  # a preset follows the dataset (it may check again)
            stats = DataStats(plan.n_usable, plan.usable_tokens, plan.longest, self.project.config.n_ctx)
            self.settings.set_data_stats(stats)
        self._update_start()
        self._refresh_progress(force=True)

    def _check_failed(self, message: str) -> None:
        self.check = None
        self._log(f"The next run could not be checked: {message}")
        self._update_start()

    def _input_blocker(self) -> Blocker | None:
        """What is missing before anything can be checked: a model, a dataset."""
        return nr.input_blocker(self.project, self._edited_samples() is not None)

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
            or nr.processes_blocker(self.project.config, self.processes.value())
            or (self.check.blocker if self.check is not None else None)
        )

    def _update_start(self) -> None:
        active = self.state.active
        blocker = None if active else self.blocker()
        weak = None if active or blocker is not None else self.plan_warning()
        hint = nr.start_hint(active, blocker, weak)
        self.start_button.setEnabled(hint.enabled)
        self.start_button.setToolTip(hint.tooltip)
        if hint.reason:
            self.reason_label.setText(hint.reason)
        self.reason_label.setVisible(bool(hint.reason))
        if not self.ever_started and not self._samples_opened:
            edited, summary = self._edited_samples(), self.sample_answers.summary()
            self.plots.show_placeholder(nr.first_look(self.project, self.check, edited, summary))

    # --- banner -----------------------------------------------------------------------------
    def show_banner(self, text: str, level: str = "error", page: str = "") -> None:
        """A message on the page itself (error / warning / info) with what to do next; `page`
        adds a link to the page that fixes it."""
        self.banner_level = level
        self._banner_plain = text + (f" Go to the {page} page" if page else "")
        self.banner.show_message(level, nr.link_html(text, page))

    def hide_banner(self) -> None:
        self.banner_level = ""
        self.banner.hide()

    def banner_text(self) -> str:
        """The banner's message as plain text ("" when hidden)."""
        return self._banner_plain if not self.banner.isHidden() else ""

    # --- paths ------------------------------------------------------------------------------
    def default_paths(self, stamp: str | None = None) -> RunPaths:
        """Where a run started now writes (next_run.default_paths)."""
        return nr.default_paths(self.project, stamp)

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
        problem = nr.paths_problem(paths)
        if problem:
            self.show_banner(problem)
        return not problem

    def _edited_samples(self):
        """The editor's samples when they are not the dataset file as saved, else None."""
        return nr.edited_samples(self.dataset, self.project)

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
        created = missing_folders(os.path.dirname(os.path.abspath(paths.out)), paths.checkpoint_dir)
        total = self.check.plan.total_steps if self.check and self.check.plan else 0
        self.controller.begin(paths, self.project.model_path, total, created)
        self.plots.clear()
        if total:
            # the step axes get their final range now, before the engine computes, rather than at
            # the run's Started event: there every shown panel repainted both of its axes at once
            # as the first matmuls began (one 29 ms chunk of UI work, 43-50 ms of wall clock)
            self.plots.set_total_steps(total)
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
        found = self.controller.resume_checkpoint(self.resumable)
        if found is not None:
            return self.resume_from(found[0], same_run=found[1])
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
        info, blocker = nr.open_checkpoint(folder, self.project)
        if blocker is not None:
            self.show_banner(blocker.reason, page=blocker.page)
            return False
        chosen = self._resume_choice(info)
        if chosen is None:
            return False
        config, data = chosen
        paths = nr.resume_paths(info, config, self.default_paths().out)
        if not self._check_writable(paths):
            return False
        if not (same_run and self.controller.is_same_run(paths.checkpoint_dir)):
            self.plots.clear()
            self.last_result = None
            self.plots.add_history(*nr.curves_to(paths.checkpoint_dir, info.step))
        created = missing_folders(os.path.dirname(os.path.abspath(paths.out)))
        self.controller.begin_resume(info, paths, self.project.model_path, created)
        if info.total_steps:
            self.plots.set_total_steps(info.total_steps)
        self.ever_started = True
        self.hide_banner()
        planned = f" of {info.total_steps}" if info.total_steps else ""
        self._log(f"Resuming {Path(paths.checkpoint_dir).name} at step {info.step}{planned} from "
                  f"{info.path}: {describe_settings(config, info.total_steps)}")  # fmt: skip
        config = replace(config, out=paths.out, checkpoint_dir=paths.checkpoint_dir)
        blocker = nr.processes_blocker(config, self.processes.value())
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
        custom = matching_preset(p.config, self.settings.n_params, self.settings.data) is None
        question = nr.resume_question(info, p, self._edited_samples(), custom)
        if question.impossible:
            self.show_banner(question.impossible, page="Dataset")
            return None
        answer = "run"
        if question.text:
            answer = self.ask_resume(question.text, question.run_data is not None)
            if answer == "cancel" or (answer == "run" and question.run_data is None):
                return None
        if answer == "page":
            self._log("Resuming with the page's settings and data: " + "; ".join(question.differences))
            return p.config, question.page_data
        config = nr.run_settings(info, p)  # the run as it was: its settings go on the page
        if info.dataset and not p.dataset_path and self.dataset is not None and not len(self.dataset):
            self.sig_open_dataset.emit(info.dataset)  # an empty project shows what the run trains on
        return config, question.run_data

    def _ask_resume(self, text: str, run_data: bool) -> str:
        return ask_resume(self, text, run_data)

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
            self._segment_t0 = time.monotonic()
            self.job = self.engine.submit("ending the run", ctl.stop_paused_job(self.run),
                                          on_event=self._on_event, on_done=self._on_finished,
                                          on_error=self._on_failed)  # fmt: skip

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
        self._show_next = False
        p = self.project
        if data is None:
            edited = self._edited_samples()
            data = edited if edited is not None else p.dataset_path
            if edited is not None and not continue_run:
                self._log(f"Training the {len(edited)} samples the editor shows (unsaved edits included)")
        elif isinstance(data, str):
            self._log(f"Training on {data}")
        phase = (
            f"Resuming at step {self.last_step}…"
            if continue_run
            else (PHASE_DATA if self._model_is_open() else PHASE_OPENING)
        )
        train = ctl.train_job(data, config, resume, continue_run, self.run, p.template_file)
        self.controller.launched(config, phase)
        self.job = self.engine.submit(
            "training",
            train,
            on_event=self._on_event,
            on_done=self._on_finished,
            on_error=self._on_failed,
            model=(p.model_path, p.device),
        )
        self._began("training" if continue_run else "loading")

    def _began(self, state: str) -> None:
        """A run segment was submitted: its state, paths, figures and progress on show."""
        self._set_state(state)
        self._show_paths()
        self.plots.start()
        self._refresh_progress(force=True)

    def _with_sample_prompts(self, config: TrainConfig) -> TrainConfig:
        """`config` with the Sample answers tab's prompts (typed, or from the validation split)."""
        return replace(config, **self.project.sample_answers.config_changes())

    # --- runs on several processes ------------------------------------------------------------
    def _run_files(
        self, paths: RunPaths, data, config: TrainConfig | None = None, hint: str = ""
    ) -> RunFiles | None:
        """The run's files beside its adapter, written: its settings (`config`, default the page's) and
        `data` when they are samples (a path, or None for the project's dataset, is read as it is).
        None, and a banner (ending with `hint`), when they cannot be written."""
        config = replace(config or self.project.config, out=paths.out, checkpoint_dir=paths.checkpoint_dir)
        config = self._with_sample_prompts(config)
        self.run_config = config
        dataset = data if isinstance(data, str) else self.project.dataset_path
        files = RunFiles.beside(paths.out, paths.checkpoint_dir, dataset)
        inputs = {"model": self.project.model_path, "chat template": self.project.template_file}
        try:
            return files.write(config, None if isinstance(data, str) else data, inputs)
        except OSError as exc:
            self.show_banner(f"The run's settings cannot be written ({exc.strerror or exc}){hint or '.'}")
        except EngineError as exc:  # a file of the run beside its adapter would replace an input
            self.show_banner(f"{exc}")
        return None

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
        files = self._run_files(self.paths, data, config, ": choose another output folder")
        if files is None:
            return False
        p = self.project
        command = files.command(p.model_path, ranks=n, template_file=p.template_file, device=p.device,
                                resume=resume, accept_changes=resume is not None)  # fmt: skip
        self._log(f"Training on {n} processes: {' '.join(command[3:])}")
        self._log(f"Events: {files.events}; output of the processes: {files.output}")
        self.proc_run = ProcessRun(command, files, self)
        self.proc_run.sig_event.connect(self._on_event)
        self.proc_run.sig_done.connect(self._on_finished)
        self.controller.launched(self.run_config, PHASE_OPENING, ranks=n)
        try:
            self.proc_run.start()
        except OSError as exc:
            self.proc_run = None
            self.show_banner(f"The training processes cannot be started: {exc.strerror or exc}")
            return False
        self._began("loading")
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
        files = self._run_files(self.default_paths(), self._edited_samples())
        if files is None:
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
        """An event of the run: what it means is the controller's (`TrainController.on_event`)."""
        if isinstance(event, (RunHandle, Phase)):
            if self.controller.on_phase(event):
                self._refresh_progress(force=True)
            return
        self.plots.add_event(event)
        if isinstance(event, (PreferenceStep, PreferenceEval)):
            self._on_preference(event)
        elif isinstance(event, Started):
            self._on_started(event)
        elif isinstance(event, SampleAnswers):
            self.sample_answers.add_event(event)
        else:
            for line in self.controller.on_event(event):
                self._log(line)
            self._progress_dirty |= isinstance(event, Step)

    def _on_preference(self, event: PreferenceStep | PreferenceEval) -> None:
        self.preference_plots.add_event(event)
        for line in self.controller.on_preference(event):
            self._log(line)

    def _on_started(self, event: Started) -> None:
        plan = event.plan
        show_objective(self, plan.objective, plan.total_steps, plan.n_val > 0)
        self._react(self.controller.on_started(event))
        if plan.ranks > 1:
            hosts = self.controller.hosts(plan.hosts)
            self.state_label.setToolTip(f"Training on {plan.ranks} processes: {hosts}")
        self._show_state(self.run_states.started())  # a Stop that came first keeps the run stopping
        self._refresh_progress(force=True)

    def _react(self, reaction: Reaction) -> None:
        """Show what the controller answered: log lines, the failed run tidied, a banner, the state."""
        for line in reaction.lines:
            self._log(line)
        for line in reaction.unstamped:
            self._log(line, stamp=False)
        if reaction.tidy:
            self._tidy_after_failure()
        if reaction.banner is not None:
            text, level, page = reaction.banner
            self.show_banner(text, level, page=page)
        if reaction.state is not None:
            self._set_state(reaction.state)

    def _on_failed(self, message: str) -> None:
        """The job ended with an error outside the run's own events (a bug, memory, no model)."""
        job, self.job = self.job, None
        self.plots.stop()
        failed, reaction = self.controller.on_job_failed(message, job.traceback if job is not None else "")
        self._react(reaction)
        self._refresh_progress(force=True)
        self.sig_run_finished.emit(failed)
        self._notify_end(failed)

    def _on_finished(self, result: object) -> None:
        self.job = None
        self.proc_run = None
        self.plots.stop()
        reaction = self.controller.on_result(result)
        self._react(reaction)
        self._refresh_progress(force=True)
        if reaction.ended:
            self.sig_run_finished.emit(result)
            self._notify_end(result)

    def _tidy_after_failure(self) -> None:
        """A run that failed before its first checkpoint leaves no folder behind."""
        if self.paths is None:
            return
        removed = clean_failed_run(self.paths.checkpoint_dir, self.controller.created)
        if removed:
            self._log("Removed the folders of the failed run: " + ", ".join(removed))
        self.controller.created = []

    # --- notification -----------------------------------------------------------------------
    def _notify_end(self, result: object) -> None:
        """A long run ended: alert the window, show a tray message when there is a tray, and say
        it in the window's status line (sig_notice)."""
        took = time.monotonic() - self._segment_t0
        if took < self.notify_after_s:
            return
        text = ctl.end_notice(result, took)
        self._alert.show(text)
        self.sig_notice.emit(text)

    # --- progress ---------------------------------------------------------------------------
    def _refresh_progress(self, force: bool = False) -> None:
        if not (self._progress_dirty or force):
            return
        self._progress_dirty = False
        if not self.state.active and self._show_next:  # the next run, as the check planned it
            plan = self.check.plan if self.check is not None else None
            waiting = self.info is None or self._input_blocker() is not None
            shown = ctl.next_run_progress(plan, waiting, self.project.config)
        else:
            shown = self.controller.progress()
        self.progress.setRange(0, shown.maximum)
        self.progress.setValue(shown.value)
        self.progress.setFormat(shown.format)
        self.stats_label.setText(shown.stats)
        self.stats_label.setToolTip(self.stats_label.text())

    def _log(self, line: str, stamp: bool = True) -> None:
        """Append a line to the event log; it follows new lines unless the person scrolled up."""
        self.log.add(line, stamp)

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
        return wait_while(self.is_running, (self.sig_state_changed, self.sig_run_finished), timeout_s)

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
        self.checker.stop()
        self.plots.timer.stop()
        self._alert.hide()


__all__ = ["TrainPage"]
