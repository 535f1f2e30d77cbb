"""The one engine worker of the app: an `EngineSession` on one long-lived QThread, and the job queue.

Every page that needs the engine submits a `Job` to the window's `Engine` (`engine.submit(...)`);
jobs run one at a time, in order, on the worker thread, against the one open model
(`engine.open_model(...)` replaces it). A job is a function `fn(session, job)`: it may emit events
(`job.emit(event)`), and it checks `job.should_stop()` / `job.should_pause()` between steps. Its
callbacks (`on_event`, `on_done`, `on_error`) run on the UI thread: the worker's signals are queued
to the `Engine`, which lives there, and it calls the job's callbacks. Only host data crosses.

`Engine.jobs` is the one registry of queued and running work (the status bar shows it);
`sig_busy_changed(bool)` says when the worker starts and stops working. A job's state changes
under its own lock (`Job.begin`, `Job.cancel`, `Job.end`): a job cancelled before the worker takes
it never runs and its `on_done` never fires; one the worker took first is asked to stop. The open
model is announced as a `ModelHandle` (path, device, a number per opening): the `EngineSession`
itself never leaves the worker thread. `shutdown()` stops the running job (a training run writes
its checkpoint), drops the queued ones and waits for the thread: the window calls it on close, the
application's `aboutToQuit` calls it, and so does an exit hook for a program that builds an
`Engine` (a `MainWindow`) and exits without closing it. Threads are never terminated.

The worker object is superqt's shape: a QObject moved to a QThread (not a QThread subclass), with
signals for started / event / finished / errored. This module has no widgets.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal, Slot

from engine import EngineError, EngineSession

from .paths import same_file

log = logging.getLogger(__name__)

OUT_OF_MEMORY = (
    "out of memory: lower the context length or batch size, turn layer checkpointing on, lower the "
    "weight cache (Train page, Advanced), or train fewer tensors"
)

# seconds: how soon the UI thread gets the interpreter while the engine works. Each call from the UI's
# Python into Qt gives the lock up, and getting it back can wait one interval while the engine runs
# Python (parsing a header, building a vocabulary, computing norms): a plot axis repaint makes ~100
# such calls, so at 0.5 ms a repaint could take 60-100 ms (Qwen2.5-0.5B shape); at 0.1 ms, 40 ms.
SWITCH_INTERVAL_BUSY = 0.0001
_IDS = itertools.count(1)


@dataclass(eq=False)
class Job:
    """One piece of engine work and its callbacks (see the module docstring)."""

    name: str  # for people: "training", "generating answers", "exporting"
    fn: Callable[[EngineSession | None, Job], Any]
    on_event: Callable[[object], None] | None = None
    on_done: Callable[[Any], None] | None = None
    on_error: Callable[[str], None] | None = None
    model: tuple[str, str] | None = None  # (path, device) the job needs open; opened first if not
    needs_session: bool = True  # refuse to run without an open model
    id: int = field(default_factory=lambda: next(_IDS))
    state: str = "queued"  # queued, running, done, failed, cancelled
    result: Any = None
    error: str = ""
    traceback: str = ""  # of an unexpected exception (a bug), for the event log
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _pause: threading.Event = field(default_factory=threading.Event, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # guards state
    _emit: Callable[[Job, object], None] | None = field(default=None, repr=False)

    # --- any thread ------------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    def request_pause(self) -> None:
        self._pause.set()

    def should_stop(self) -> bool:
        return self._stop.is_set()

    def should_pause(self) -> bool:
        return self._pause.is_set()

    @property
    def active(self) -> bool:
        return self.state in ("queued", "running")

    def cancel(self) -> bool:
        """Drop the job if it is still queued (True: it will never run), else ask it to stop."""
        with self._lock:
            if self.state == "queued":
                self.state = "cancelled"
                return True
            if self.state == "running":
                self._stop.set()
            return False

    # --- the worker thread -----------------------------------------------------------------------
    def begin(self) -> bool:
        """Queued -> running, unless it was cancelled first (False: do not run it)."""
        with self._lock:
            if self.state != "queued":
                return False
            self.state = "running"
            return True

    def end(self, state: str, *, result: Any = None, error: str = "", tb: str = "") -> None:
        """Running -> done or failed, with its result or error."""
        with self._lock:
            self.result, self.error, self.traceback, self.state = result, error, tb, state

    def emit(self, event: object) -> None:
        """Send an event to the job's on_event (on the UI thread)."""
        if self._emit is not None:
            self._emit(self, event)


@dataclass(frozen=True)
class ModelHandle:
    """The model the worker has open, as the UI thread knows it: host data only, never the session."""

    path: str  # the model file
    device: str  # "cpu" or "cuda:N"
    number: int  # counts openings: another number is another load (of the same file or another)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


_OPENINGS = itertools.count(1)


class EngineWorker(QObject):
    """Lives on the worker thread; its event loop runs the jobs the Engine queues, in order."""

    sig_started = Signal(object)  # job
    sig_event = Signal(object, object)  # job, event
    sig_finished = Signal(object)  # job (state done: its result is job.result)
    sig_errored = Signal(object)  # job (state failed: job.error, job.traceback)
    sig_session = Signal(object)  # the ModelHandle of the model just opened, or None when it closed

    def __init__(self) -> None:
        super().__init__()
        self.session: EngineSession | None = None  # only ever used on the worker thread
        self.handle: ModelHandle | None = None

    def _emit(self, job: Job, event: object) -> None:
        self.sig_event.emit(job, event)

    @Slot(object)
    def run_job(self, job: Job) -> None:
        if job.begin():  # False: cancelled while queued, never run
            self._run_one(job)

    @Slot()
    def farewell(self) -> None:
        """The last call on the worker thread: let the model go, move this object to the UI thread
        (a Python-made QObject must not be deleted on a worker thread: the binding's wrapper lock
        against the interpreter lock can deadlock) and end the thread's event loop."""
        self.session = self.handle = None
        app = QCoreApplication.instance()
        if app is not None:
            self.moveToThread(app.thread())
        QThread.currentThread().quit()

    def _run_one(self, job: Job) -> None:
        job._emit = self._emit
        self.sig_started.emit(job)
        previous = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_BUSY)
        try:
            if job.model is not None:
                self._ensure(*job.model)
            if job.needs_session and self.session is None:
                raise EngineError("no model is open: open a model on the Model page first")
            result = job.fn(self.session, job)
            job.end("done", result=result)
            self.sig_finished.emit(job)
        except EngineError as exc:
            self._failed(job, str(exc))
        except MemoryError:
            self._failed(job, OUT_OF_MEMORY, traceback.format_exc())
        except Exception as exc:  # noqa: BLE001 - every failure must reach the window
            tb = traceback.format_exc()
            log.error("%s failed\n%s", job.name, tb)
            self._failed(
                job,
                f"{job.name} stopped by an unexpected error: {type(exc).__name__}: {exc}. This is a bug: "
                "please report it with the traceback from the event log.",
                tb,
            )
        finally:
            sys.setswitchinterval(previous)

    def _ensure(self, path: str, device: str) -> None:
        """Make `path` on `device` the open model (the session is kept when it already is)."""
        s = self.session
        if s is not None and s.device == device and same_file(s.path, path):
            return
        if s is not None:
            self.session = self.handle = None  # release the old model before the new one loads
            self.sig_session.emit(None)
        self.session = EngineSession(path, device=device)
        self.session.summary  # noqa: B018 - read the summary here, not on the UI thread
        self.handle = ModelHandle(self.session.path, self.session.device, next(_OPENINGS))
        self.sig_session.emit(self.handle)

    def _failed(self, job: Job, message: str, tb: str = "") -> None:
        job.end("failed", error=message, tb=tb)
        self.sig_errored.emit(job)


class Engine(QObject):
    """The UI thread's side of the worker: submit jobs, open models, hear what happened."""

    sig_busy_changed = Signal(bool)
    sig_jobs_changed = Signal()
    sig_model_opened = Signal(object)  # ModelHandle (the session stays on the worker: jobs get it)
    _sig_submit = Signal(object)  # to the worker's run_job (queued: it lives on the worker thread)
    _sig_farewell = Signal()

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.jobs: list[Job] = []  # queued and running, in order
        self.running: Job | None = None
        self.model: ModelHandle | None = None  # the model the worker has open
        self._thread = QThread()
        self._thread.setObjectName("tune-studio-engine")
        self._worker = EngineWorker()
        self._worker.moveToThread(self._thread)
        self._sig_submit.connect(self._worker.run_job)
        self._sig_farewell.connect(self._worker.farewell)
        self._worker.sig_started.connect(self._started)
        self._worker.sig_event.connect(self._event)
        self._worker.sig_finished.connect(self._finished)
        self._worker.sig_errored.connect(self._errored)
        self._worker.sig_session.connect(self._session)
        self._thread.start()
        self._closed = False
        _ENGINES.add(self)  # stopped by the exit hook if nothing else stops it first
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)

    # --- submitting ------------------------------------------------------------------------------
    def submit(
        self,
        name: str,
        fn: Callable[[EngineSession | None, Job], Any],
        *,
        on_event: Callable[[object], None] | None = None,
        on_done: Callable[[Any], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        model: tuple[str, str] | None = None,
        needs_session: bool = True,
    ) -> Job:
        """Queue `fn(session, job)`; the callbacks run on the UI thread. Returns the job.

        model: (path, device) the job needs: the worker opens it first unless it is already open."""
        job = Job(name, fn, on_event, on_done, on_error, model, needs_session)
        if self._closed:
            job.state, job.error = "failed", "the app is closing"
            if on_error is not None:
                on_error(job.error)
            return job
        self.jobs.append(job)
        self.sig_jobs_changed.emit()
        self._sig_submit.emit(job)
        return job

    def open_model(
        self,
        path: str,
        *,
        device: str = "cpu",
        on_done: Callable[[Any], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        describe: Callable[[EngineSession], Any] | None = None,
    ) -> Job:
        """Open a model file in the worker (the previous one is closed); on_done(what) with what
        `describe(session)` returns, run on the worker thread (host data: the facts a page shows),
        or the ModelHandle without `describe`."""
        worker = self._worker

        def fn(session: EngineSession, job: Job) -> Any:
            return describe(session) if describe is not None else worker.handle

        return self.submit(
            f"opening {os.path.basename(path)}", fn, on_done=on_done, on_error=on_error, model=(path, device)
        )

    def cancel(self, job: Job) -> None:
        """Drop a queued job (it never runs), or ask a running one to stop."""
        if job.cancel():
            self._forget(job)

    @property
    def busy(self) -> bool:
        return self.running is not None

    def describe(self) -> str:
        """What the engine is doing, for the status bar."""
        if self.running is None:
            return "Engine: idle"
        waiting = sum(1 for j in self.jobs if j.state == "queued")
        return f"Engine: {self.running.name}" + (f" (+{waiting} waiting)" if waiting else "")

    # --- from the worker (queued to this thread) -------------------------------------------------
    @Slot(object)
    def _started(self, job: Job) -> None:
        self.running = job
        self.sig_busy_changed.emit(True)
        self.sig_jobs_changed.emit()

    @Slot(object, object)
    def _event(self, job: Job, event: object) -> None:
        if job.on_event is not None:
            job.on_event(event)

    @Slot(object)
    def _session(self, handle: ModelHandle | None) -> None:
        self.model = handle
        if handle is not None:
            self.sig_model_opened.emit(handle)

    @Slot(object)
    def _finished(self, job: Job) -> None:
        self._end(job)
        if job.on_done is not None:
            job.on_done(job.result)

    @Slot(object)
    def _errored(self, job: Job) -> None:
        self._end(job)
        if job.traceback:
            log.error("%s: %s", job.name, job.error)
        if job.on_error is not None:
            job.on_error(job.error)

    def _end(self, job: Job) -> None:
        if self.running is job:
            self.running = None
            self.sig_busy_changed.emit(False)
        self._forget(job)

    def _forget(self, job: Job) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
            self.sig_jobs_changed.emit()

    # --- closing ---------------------------------------------------------------------------------
    def shutdown(self, timeout_ms: int = 120_000) -> bool:
        """Stop the running job, drop queued ones, end the worker thread; True when it has ended."""
        if self._closed:
            return not self._thread.isRunning()
        self._closed = True
        _ENGINES.discard(self)
        for job in list(self.jobs):
            job.cancel()  # queued: never runs; running (or about to): asked to stop after its step
            job.request_stop()
        self._sig_farewell.emit()  # after the running job: the worker's event loop takes them in order
        done = bool(self._thread.wait(timeout_ms))
        if done:
            self.model = None
            self.jobs.clear()
            self._worker.deleteLater()
        return done

    def wait_idle(self, timeout_ms: int = 60_000) -> bool:
        """Process events until no job is queued or running (tests, and closing)."""
        import time

        deadline = time.monotonic() + timeout_ms / 1000
        app = QCoreApplication.instance()
        while self.jobs and time.monotonic() < deadline:
            app.processEvents()
            time.sleep(0.002)
        return not self.jobs


_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()  # engines whose thread may still run


@atexit.register
def _stop_engines_at_exit() -> None:
    """A program that built an Engine (a MainWindow) and exits without closing it: end each worker
    thread before the interpreter goes, or Qt aborts ("QThread: Destroyed while thread is still
    running"). A running job is asked to stop after its step, as on close."""
    for engine in list(_ENGINES):
        try:
            engine.shutdown()
        except RuntimeError:  # its Qt object is gone already: so is its thread
            pass


__all__ = ["OUT_OF_MEMORY", "Engine", "EngineWorker", "Job", "ModelHandle"]
