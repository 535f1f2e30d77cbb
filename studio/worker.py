"""Training off the UI thread: a `TrainWorker` QObject moved to a QThread, and `start_training`.

By default the worker runs the engine `Trainer` in a child process (`engine.TrainProcess`) and its
thread only relays what the child sends: a trainer in a thread of this process would hold the
interpreter lock for most of each step and freeze the window each time the UI thread re-enters
Python (measured: 40-100 ms stalls; bench/ui_stall.py), and a crash of the run would take the window
with it. A model given as an object (not a path), or `isolate=False`, runs the trainer in the thread.

Either way every engine event arrives as `sig_event(event)`; the run's outcome (engine `Finished` or
`Failed`) arrives once as `sig_finished(result)`, always, whatever happened. An exception the engine
did not turn into an event (a bug, or running out of memory) also emits `sig_failed(message)` with
what to do next, and a `Failed` is made for it, so no error is ever lost; a child killed by the
system is reported the same way. `request_stop()` may be called from any thread; the trainer checks
it between optimizer steps and ends gracefully, writing a checkpoint when the run has a checkpoint
folder.

This module is the only place the studio runs training; it has no widgets and draws nothing. Only
host data (the engine's frozen dataclasses, strings) crosses its signals.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine import (
    Checkpoint,
    ChildDied,
    ChildRaised,
    EngineError,
    Failed,
    Finished,
    Started,
    Step,
    TrainConfig,
    Trainer,
    TrainJob,
    TrainProcess,
)

from .project import Project
from .tasks import return_to_ui_thread, start_in_thread

log = logging.getLogger(__name__)

OUT_OF_MEMORY = (
    "out of memory: lower the context length or batch size, or enable layer checkpointing "
    "(Train page, Advanced), or train fewer tensors"
)
# what builds the trainer in a child process ("module:attribute" and keyword arguments); tests
# replace it to inject faults or hold a run at a known step
CHILD_TRAINER: tuple[str, dict] = ("engine.train.trainer:Trainer", {})


class TrainWorker(QObject):
    """One training run. Create it in the UI thread, move it to a QThread, connect, start the thread.

    Signals (all emitted from the worker thread; connect them to QObject methods so that Qt queues
    them to the receiver's thread):
    - sig_event(event): every engine event as the trainer emits it (Started, Step, Eval, ...).
    - sig_finished(result): exactly once, the run's `Finished` or `Failed`.
    - sig_failed(str): an unexpected exception, as a message saying what went wrong and what to do.
    """

    sig_event = Signal(object)
    sig_finished = Signal(object)
    sig_failed = Signal(str)

    def __init__(
        self,
        model: Any,
        data: Any,
        config: TrainConfig,
        *,
        template: Any = None,
        resume: str | None = None,
        init_adapter: str | None = None,
        isolate: bool | None = None,
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.model = model
        self.data = data
        self.config = config
        self.template = template
        self.resume = resume
        self.init_adapter = init_adapter
        self._stop = threading.Event()
        self.result: Finished | Failed | None = None  # set just before sig_finished
        self.traceback: str | None = None  # of an unexpected exception, for the event log
        self._started = False
        self._last_step = 0
        self._last_checkpoint: str | None = resume
        # a child process needs a model path and picklable arguments; else the thread trains
        can_isolate = isinstance(model, (str, os.PathLike)) and (
            template is None or isinstance(template, str)
        )
        self.isolate = can_isolate if isolate is None else bool(isolate and can_isolate)
        self.process: TrainProcess | None = None

    # --- any thread -------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask the run to end after the current step (thread-safe, returns at once)."""
        self._stop.set()
        process = self.process
        if process is not None:
            process.request_stop()

    def kill(self) -> None:
        """End a child-process run at once, without a checkpoint (a run that does not stop)."""
        process = self.process
        if process is not None:
            process.kill()

    def stop_requested(self) -> bool:
        return self._stop.is_set()

    # --- the worker thread ------------------------------------------------------------------
    def _on_event(self, event: object) -> None:
        if isinstance(event, Started):
            self._started = True
            self._last_step = event.plan.start_step
        elif isinstance(event, Step):
            self._last_step = event.step
        elif isinstance(event, Checkpoint):
            self._last_checkpoint = event.path
        self.sig_event.emit(event)

    @Slot()
    def run(self) -> None:
        """Build the trainer (loads the model) and train; always ends with sig_finished."""
        result: Finished | Failed
        try:
            result = self._train_in_child() if self.isolate else self._train_here()
        except EngineError as exc:
            # expected problems outside Trainer.run (the model cannot be loaded or trained)
            result = self._engine_error(exc)
        except MemoryError:
            result = self._out_of_memory(traceback.format_exc())
        except ChildRaised as exc:
            if isinstance(exc.original, EngineError):
                result = self._engine_error(exc.original)
            elif exc.type_name == "MemoryError":
                result = self._out_of_memory(exc.child_traceback)
            else:
                result = self._bug(exc.type_name, exc.message, exc.child_traceback)
        except ChildDied as exc:
            self.traceback = None
            log.error("training process died: %s", exc)
            result = self._unexpected(self._with_checkpoint(f"{exc}{self._where()}."))
        except Exception as exc:  # noqa: BLE001 - every failure must reach the UI
            result = self._bug(type(exc).__name__, str(exc), traceback.format_exc())
        self.result = result
        return_to_ui_thread(self)  # deleted there (see studio.tasks)
        self.sig_finished.emit(result)

    def _train_here(self) -> Finished | Failed:
        trainer = Trainer(
            self.model,
            self.data,
            self.config,
            template=self.template,
            resume=self.resume,
            init_adapter=self.init_adapter,
        )
        try:
            return trainer.run(self._on_event, self._stop.is_set)
        finally:
            del trainer  # free the model's memory before the UI hears the run is over

    def _train_in_child(self) -> Finished | Failed:
        name, kwargs = CHILD_TRAINER
        job = TrainJob(
            model=os.fspath(self.model),
            data=self.data,
            config=self.config,
            template=self.template,
            resume=self.resume,
            init_adapter=self.init_adapter,
            trainer=name,
            trainer_kwargs=dict(kwargs),
        )
        self.process = TrainProcess(job)
        if self._stop.is_set():
            self.process.request_stop()
        return self.process.run(self._on_event)

    def _where(self) -> str:
        return f" at step {self._last_step + 1}" if self._started else " before the first step"

    def _with_checkpoint(self, text: str) -> str:
        return text + (" The last good checkpoint is kept; resume from it." if self._last_checkpoint else "")

    def _engine_error(self, exc: EngineError) -> Failed:
        result = Failed(0, str(exc), self._last_checkpoint)
        self.sig_event.emit(result)
        return result

    def _out_of_memory(self, tb: str) -> Failed:
        self.traceback = tb
        log.error("training ran out of memory\n%s", tb)
        return self._unexpected(OUT_OF_MEMORY)

    def _bug(self, type_name: str, message: str, tb: str) -> Failed:
        self.traceback = tb
        log.error("training failed\n%s", tb)
        return self._unexpected(
            self._with_checkpoint(
                f"training stopped{self._where()} by an unexpected error: {type_name}: {message}. "
                "This is a bug: please report it with the traceback from the event log."
            )
        )

    def _unexpected(self, message: str) -> Failed:
        self.sig_failed.emit(message)
        step = self._last_step + 1 if self._started else 0
        return Failed(step, message, self._last_checkpoint)


def start_training(
    project: Project | None = None,
    *,
    model: Any = None,
    data: Any = None,
    config: TrainConfig | None = None,
    template: Any = None,
    resume: str | None = None,
    init_adapter: str | None = None,
    isolate: bool | None = None,
    start: bool = True,
    parent: QObject | None = None,
) -> tuple[QThread, TrainWorker]:
    """A TrainWorker in its own QThread, wired up and (unless start=False) started.

    Arguments come from `project` (model_path, dataset_path, template_file, config) unless given
    explicitly. With start=False, connect to the worker's signals and call `thread.start()`: signals
    emitted before a connection exists are lost. The thread's lifetime: studio.tasks.start_in_thread.
    """
    if project is not None:
        model = model if model is not None else project.model_path
        data = data if data is not None else project.dataset_path
        config = config if config is not None else project.config
        template = template if template is not None else project.template_file
    if model is None or data is None:
        raise ValueError("start_training needs a model and a dataset (or a project that names them)")
    worker = TrainWorker(
        model,
        data,
        config or TrainConfig(),
        template=template,
        resume=resume,
        init_adapter=init_adapter,
        isolate=isolate,
    )
    thread = start_in_thread(worker, "tune-studio-training", parent, start=start)
    return thread, worker


__all__ = ["OUT_OF_MEMORY", "TrainWorker", "start_training"]
