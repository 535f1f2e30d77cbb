"""What the Train page decides about its run, without Qt: which checkpoint Resume continues, what
each engine event means for the run's numbers and its log, what a result means (state, banner, the
failed run's folders), and the texts of the progress bar and the stats line. What the page decides
before a run starts (blockers, paths, whose settings a resume takes) is in `next_run`.

`TrainController` holds the run of the page: its state (`run_state.RunStates`), the engine's run token,
the model it trains, its paths and settings, its last result and checkpoint, and its numbers
(steps, tokens, training time). The engine's events go to it (`on_event`, `on_started`,
`on_result`, `on_job_failed`) and it answers with what the page must show: log lines, a banner,
the state to move to (`Reaction`). The page (studio.pages.train.page) lays out the widgets, submits
the jobs (`train_job`, `stop_paused_job`) and shows what this module answers;
tests/studio/test_train_controller.py walks runs through it without a QApplication.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine import (
    Checkpoint,
    CheckpointInfo,
    EngineError,
    Eval,
    Failed,
    Finished,
    Paused,
    PreferenceEval,
    PreferenceStep,
    Started,
    Step,
    TrainConfig,
    human_bytes,
)

from ...paths import latest_checkpoint, same_file
from .next_run import RunPaths
from .plan import DataPlan
from .run_state import RunState, RunStates

NOTIFY_AFTER_S = 60.0  # a run segment longer than this alerts the window when it ends
# settings that change the step total, the data check or the memory estimate
CHECKED_SETTINGS = frozenset({
    "n_ctx", "batch_size", "grad_accum", "epochs", "steps", "val_split", "seed", "train_on_prompt",
    "prompt_format", "targets", "rank", "full", "checkpoint_layers", "cache_budget", "device",
})  # fmt: skip
PHASE_OPENING = "Opening the model…"
PHASE_DATA = "Preparing the data…"
PHASE_FIRST_STEP = "First step: dequantizing and warming up…"


# --- words ------------------------------------------------------------------------------------
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


_BYTES_REPR = re.compile(r"""\bb(['"])(.*?)\1""")


def plain_words(message: str) -> str:
    """A message for people: Python's byte reprs (b'hell') become quoted text ("hell")."""
    return _BYTES_REPR.sub(lambda m: f'"{m.group(2)}"', message)


def sentence(message: str) -> str:
    """A message as a sentence: ends with a full stop."""
    message = message.strip()
    return message if message.endswith((".", "!", "?")) else message + "."


def end_notice(result: object, took: float) -> str:
    """What the window says when a long run segment (`took` seconds) ended with `result`."""
    if isinstance(result, Finished):
        what = "stopped" if result.stopped else "finished"
        text = f"Training {what} at step {result.step} after {human_duration(took)}"
        return text + (f"; adapter written: {result.adapter_path}" if result.adapter_path else "")
    return f"Training failed after {human_duration(took)}: {getattr(result, 'message', '')}"


# --- what the training job sends besides the engine's events ----------------------------------
@dataclass(frozen=True)
class RunHandle:
    """Sent by the training job before its first step: the engine's run, as an identity token."""

    run: object


@dataclass(frozen=True)
class Phase:
    """Sent by the training job: what it is doing before the first step, for the stats line."""

    text: str


def train_job(data, config: TrainConfig, resume: str | None, continue_run: bool, expected, template_file):
    """The engine job of a run segment: a new run on `data` with `config` (from checkpoint `resume`
    when given), or the paused run `expected` going on in memory (`continue_run`; from its latest
    checkpoint when another model was opened since). It sends `Phase` and `RunHandle` first."""

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

    return train


def stop_paused_job(run):
    """The engine job that ends the paused run `run` (its checkpoint and adapter are written)."""

    def stop_paused(session, job):
        if session is None or session.run is not run or not session.paused:
            return None  # the model was closed since: its checkpoints are on disk
        return session.stop_run(job.emit)

    return stop_paused


# --- the run ------------------------------------------------------------------------------------
@dataclass
class Reaction:
    """What the page shows after an event or a result: log lines (in order), then the failed run's
    folders tidied, a banner (text, level, page), the state to move to, and whether the run
    segment ended (sig_run_finished and the end notice)."""

    lines: list[str] = field(default_factory=list)
    unstamped: list[str] = field(default_factory=list)  # logged after `lines`, without the time
    tidy: bool = False
    banner: tuple[str, str, str] | None = None
    state: RunState | None = None
    ended: bool = False


@dataclass(frozen=True)
class Progress:
    """The progress bar and the stats line."""

    maximum: int
    value: int
    format: str
    stats: str


class TrainController:
    """The Train page's run: its state, identity, paths, settings, result and numbers; see the module
    docstring."""

    def __init__(self) -> None:
        self.states = RunStates()
        self.run = None  # the engine's run of this page (an identity token; it lives in the worker)
        self.run_model: str | None = None  # the model file of the current (or last) run
        self.paths: RunPaths | None = None  # of the current (or last) run
        self.config: TrainConfig | None = None  # the settings the run trains with
        self.last_result: Finished | Failed | None = None
        self.last_checkpoint: str | None = None
        self.total_steps = 0
        self.last_step = 0
        self.tokens_done = 0
        self.elapsed_s = 0.0  # the run's training time, from its latest Step
        self.latest_step: Step | None = None  # of the segment on screen
        self.phase = ""  # what a starting run is doing, until its first step
        self.log_every = 10  # log one Step line in this many
        self.ranks = 1  # processes of the run in flight (its Started event says)
        self.created: list[str] = []  # folders the current run would create (removed if it fails early)
        self.segment_t0 = 0.0  # time.monotonic() when the run segment began
        self.notify_after_s = NOTIFY_AFTER_S

    @property
    def state(self) -> RunState:
        return self.states.state

    # --- what Resume does -------------------------------------------------------------------------
    def _finished_whole(self) -> bool:
        return isinstance(self.last_result, Finished) and not self.last_result.stopped

    def can_resume(self, open_model: str | None, resumable: tuple[str, str] | None) -> bool:
        """The run is paused in memory, or a checkpoint of it exists and it has steps left; and it is
        a run of the open model. resumable: (checkpoint, run name) of a stopped run of the open model
        in the history."""
        if self.run_model and open_model and not same_file(self.run_model, open_model):
            return False
        return self.state is RunState.PAUSED or self.resume_checkpoint(resumable) is not None

    def resume_checkpoint(self, resumable: tuple[str, str] | None) -> tuple[str, bool] | None:
        """The checkpoint Resume continues when the run is not paused in memory, and whether it is
        this run's own: its latest unless it finished its plan, else the history's; None when neither."""
        own = latest_checkpoint(self.paths.checkpoint_dir) if self.paths is not None else None
        if own is not None and not self._finished_whole():
            return own, True
        if resumable is not None:
            return resumable[0], False
        return None

    # --- a segment begins ---------------------------------------------------------------------------
    def begin(self, paths: RunPaths, model: str, total_steps: int, created: list[str]) -> None:
        """A new run from step 0 writing to `paths`."""
        self.paths = paths
        self.created = created
        self.tokens_done, self.last_step, self.elapsed_s = 0, 0, 0.0
        self.total_steps = total_steps
        self.last_checkpoint = None
        self.last_result = None
        self.run_model = model

    def begin_resume(self, info: CheckpointInfo, paths: RunPaths, model: str, created: list[str]) -> None:
        """The run of checkpoint `info` going on: its steps, training time and tokens from there."""
        self.paths = paths
        self.created = created
        self.tokens_done, self.elapsed_s, self.last_step = info.tokens, info.seconds, info.step
        self.total_steps = info.total_steps
        self.run_model = model

    def is_same_run(self, folder: str) -> bool:
        """`folder` holds this run's checkpoints."""
        return self.paths is not None and same_file(self.paths.checkpoint_dir, folder)

    def launched(self, config: TrainConfig, phase: str, ranks: int = 1) -> None:
        """A segment was submitted with `config`; `phase` is what the stats line says until a step."""
        self.config = config
        self.ranks = ranks
        self.latest_step = None
        self.phase = phase
        self.segment_t0 = time.monotonic()

    def forget(self) -> list[str]:
        """The open model changed: the last run is not offered any more; the log line to write."""
        lines = []
        if self.state is RunState.PAUSED:
            lines.append(f"The run paused at step {self.last_step} ended with its model "
                         "(its checkpoints, if any, are kept on disk).")  # fmt: skip
        self.run = None
        self.run_model = None
        self.paths = None
        self.last_result = None
        self.last_checkpoint = None
        self.tokens_done, self.elapsed_s, self.last_step = 0, 0.0, 0
        return lines

    # --- events -------------------------------------------------------------------------------------
    def on_phase(self, event: Phase | RunHandle) -> bool:
        """The job's own messages; True when the stats line changes."""
        if isinstance(event, RunHandle):
            self.run = event.run
            return False
        if self.latest_step is None and not self.phase.startswith("Resuming"):
            self.phase = event.text
            return True
        return False

    def _logged(self, step: int) -> bool:
        return step % self.log_every == 0 or step == 1

    def on_event(self, event: object) -> list[str]:
        """A Step, Eval or Checkpoint of the run: its numbers, and the log lines it makes."""
        if isinstance(event, Step):
            self.last_step = event.step
            self.total_steps = event.total_steps
            self.tokens_done += event.tokens
            self.elapsed_s = event.elapsed_s
            self.latest_step = event
            self.phase = ""
            if self._logged(event.step):
                return [
                    f"step {event.step}/{event.total_steps}  loss {event.mean_ce:.4f}  lr {event.lr:.3g}  "
                    f"‖g‖ {event.grad_norm:.3g}  {event.tokens_per_s:,.0f} tok/s"
                ]
        elif isinstance(event, Eval):
            return [f"eval at step {event.step}: validation loss {event.mean_ce:.4f} (perplexity "
                    f"{event.perplexity:.3g}) over {event.n_tokens:,} tokens"]  # fmt: skip
        elif isinstance(event, Checkpoint):
            self.last_checkpoint = event.path
            return [f"checkpoint at step {event.step}: {event.path}"]
        return []

    def on_preference(self, event: PreferenceStep | PreferenceEval) -> list[str]:
        """A DPO / ORPO run's figures of a step or of the held-out pairs: the log lines they make."""
        if isinstance(event, PreferenceEval):
            return [f"held-out pairs at step {event.step}: accuracy {event.accuracy:.0%}, margin "
                    f"{event.margin:+.4f}, {event.objective.upper()} loss {event.loss:.4f} "
                    f"({event.n_pairs} pairs)"]  # fmt: skip
        if self._logged(event.step):
            return [f"  pairs: accuracy {event.accuracy:.0%}, margin {event.margin:+.4f}, log p chosen "
                    f"{event.chosen_logp:.3f}, rejected {event.rejected_logp:.3f}"]  # fmt: skip
        return []

    def on_started(self, event: Started) -> Reaction:
        """The run's plan: its numbers, the Started line (and one per process), a banner when the
        dataset has problems (the page moves the state: `RunStates.started`)."""
        plan = event.plan
        self.total_steps = plan.total_steps
        self.last_step = plan.start_step
        if plan.start_step:  # a resumed run: its training time and tokens go on from the checkpoint's
            self.tokens_done, self.elapsed_s = plan.start_tokens, plan.start_seconds
        self.log_every = max(1, plan.total_steps // 50)
        self.phase = PHASE_FIRST_STEP
        cfg = self.config
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
        reaction = Reaction()
        if plan.problems:
            n_problems = max(plan.problems_total, len(plan.problems))  # the plan lists the first 1000
            shown = "; ".join(plan.problems[:3]) + ("; …" if n_problems > 3 else "")
            line += f"; {n_problems} dataset problems: {shown}"
            reaction.banner = (
                f"The dataset has {n_problems} problems (samples skipped or truncated), e.g. "
                f"{plan.problems[0]}. Training goes on; fix them on the Dataset page.",
                "warning",
                "Dataset",
            )
        reaction.lines.append(line)
        self.ranks = plan.ranks
        if plan.ranks > 1:
            reaction.lines.append(f"{plan.ranks} processes, each with a share of every step's windows: "
                                  f"{self.hosts(plan.hosts)}")  # fmt: skip
        return reaction

    @staticmethod
    def hosts(hosts: Sequence[str]) -> str:
        return ", ".join(f"rank {r} on {h}" for r, h in enumerate(hosts))

    def on_result(self, result: object) -> Reaction:
        """The job's end: Paused (in memory), Finished (complete or stopped), Failed, or None (a paused
        run whose model was closed meanwhile)."""
        self.phase = ""
        if isinstance(result, Paused):
            self.last_step = result.step
            return Reaction([f"Paused at step {result.step}. Press Resume to go on from here."],
                            state=RunState.PAUSED)  # fmt: skip
        if result is None:
            return Reaction(["The paused run was already closed with its model; its checkpoints are kept."],
                            state=RunState.FINISHED)  # fmt: skip
        self.last_result = result
        self.latest_step = None
        reaction = Reaction(ended=True)
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
            reaction.lines.append(
                f"{'Stopped' if result.stopped else 'Finished'} at step {result.step}{loss}{wrote}"
            )
            reaction.state = RunState.FINISHED
        elif isinstance(result, Failed):
            self.last_checkpoint = result.checkpoint_path or self.last_checkpoint
            where = f"at step {result.step}" if result.step else "before training started"
            reaction.lines.append(f"FAILED {where}: {result.message}")
            page = ""
            if result.checkpoint_path:
                hint = f" The last good checkpoint is {result.checkpoint_path}: fix the cause, then Resume."
            elif not result.step:
                hint = (" Nothing was trained: check the model (Model page), the dataset (Dataset page) "
                        "and the settings, then press Start.")  # fmt: skip
                page = "Dataset" if "sample" in result.message or "dataset" in result.message else ""
            else:
                hint = " Fix the cause, then press Start."
            reaction.tidy = True
            reaction.banner = (f"Training failed {where}: {sentence(plain_words(result.message))}{hint}",
                               "error", page)  # fmt: skip
            reaction.state = RunState.FAILED
        return reaction

    def on_job_failed(self, message: str, traceback: str) -> tuple[Failed, Reaction]:
        """The job ended with an error outside the run's own events (a bug, memory, no model): the
        Failed result it stands for, and what the page shows (the traceback indented, unstamped)."""
        self.phase = ""
        message = plain_words(message)
        failed = Failed(self.last_step + 1 if self.last_step else 0, message, self.last_checkpoint)
        self.last_result = failed
        reaction = Reaction([f"ERROR: {message}"], tidy=True, banner=(message, "error", ""),
                            state=RunState.FAILED, ended=True)  # fmt: skip
        reaction.unstamped = ["    " + line for line in traceback.rstrip().splitlines()]
        return failed, reaction

    # --- progress -----------------------------------------------------------------------------------
    def progress(self) -> Progress:
        """The progress bar and stats line of the run on screen (running or ended)."""
        total = max(1, self.total_steps)
        fmt = "%v / %m steps" if self.total_steps else "steps: counting…"
        return Progress(total, min(self.last_step, total), fmt, self.stats_text())

    def stats_text(self) -> str:
        s = self.latest_step
        active = self.state.active
        if active and s is None:
            return self.phase or "Starting…"
        elapsed = human_duration(self.elapsed_s)
        if active and s is not None:
            return (
                f"Step {s.step:,} of {s.total_steps:,} · {elapsed} elapsed · {eta_words(s.eta_s)} · "
                f"{s.tokens_per_s:,.0f} tokens/s · epoch {s.epoch:.2f} · "
                f"{self.tokens_done:,} tokens processed"
            )
        if self.state is RunState.PAUSED:
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


def next_run_progress(plan: DataPlan | None, waiting: bool, config: TrainConfig) -> Progress:
    """The progress bar and stats line before Start: the next run as the check planned it (waiting:
    a model or a dataset is missing)."""
    if plan is not None and plan.total_steps:
        return Progress(plan.total_steps, 0, "%v / %m steps", f"Next run: {plan.describe(config)}.")
    fmt = (
        "steps: waiting for a model and a dataset" if waiting
        else "steps: no trainable sample" if plan is not None else "steps: counting…"
    )  # fmt: skip
    return Progress(1, 0, fmt, "Not started.")


__all__ = [
    "CHECKED_SETTINGS", "PHASE_DATA", "PHASE_FIRST_STEP", "PHASE_OPENING", "Phase", "Progress", "Reaction",
    "RunHandle", "TrainController", "end_notice", "eta_words", "human_duration", "next_run_progress",
    "plain_words", "stop_paused_job", "train_job",
]  # fmt: skip
