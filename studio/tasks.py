"""Running one engine function off the UI thread: a worker object moved to a QThread.

`run_task(parent, fn, on_done, on_error)` calls fn() in a new thread and delivers its result (host
data only) or its exception message to `on_done` / `on_error` on the thread of `parent` (the UI
thread): the callbacks go through a relay object that lives there, so plain functions and closures
are safe too. The returned `Task` keeps itself alive until its thread has ended; the thread quits
and the worker is deleted once the thread has ended. Threads are never terminated.

Every worker object here (and in studio.worker and studio.export_dialog) ends its run by moving
itself back to the UI thread (`return_to_ui_thread`), so that Qt deletes it there. A Python-made
QObject deleted in a worker thread makes that thread take the binding's wrapper lock and then the
interpreter lock while the UI thread, holding the interpreter lock, may be creating widgets, which
takes the wrapper lock: a deadlock (seen about once in 15 runs of the Rewards page tests).
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QCoreApplication, QObject, Qt, QThread, Signal, Slot


def return_to_ui_thread(obj: QObject) -> None:
    """Called by a worker from its own thread when its run is over: it then lives (and will be
    deleted) in the application's main thread."""
    app = QCoreApplication.instance()
    if app is not None and obj.thread() is not app.thread():
        obj.moveToThread(app.thread())


# (thread, worker) pairs not yet deleted: neither may be garbage-collected while the thread runs
_RUNNING: set[tuple[QThread, QObject]] = set()


def running_threads() -> int:
    """Worker threads started by `start_in_thread` that Qt has not deleted yet (tests wait for 0)."""
    return len(_RUNNING)


def start_in_thread(worker: QObject, name: str, parent: QObject | None = None, start: bool = True) -> QThread:
    """Move `worker` (a QObject with a `run` slot and a `sig_finished` signal, emitted once at the
    end of run, after `return_to_ui_thread`) to a new QThread and wire its lifetime: run when the
    thread starts, quit when it finishes (a direct connection: `thread.wait()` from the UI thread
    cannot deadlock), both deleted after the thread has ended. With start=False, connect to the
    worker's signals first, then call `thread.start()`."""
    thread = QThread(parent)
    thread.setObjectName(name)
    worker.moveToThread(thread)
    thread.started.connect(worker.run)
    worker.sig_finished.connect(thread.quit, Qt.DirectConnection)
    thread.finished.connect(worker.deleteLater)  # the worker lives in the UI thread by then
    thread.finished.connect(thread.deleteLater)
    pair = (thread, worker)
    _RUNNING.add(pair)
    # released once Qt has deleted the thread (never while it runs: that would destroy a running QThread)
    thread.destroyed.connect(lambda *_: _RUNNING.discard(pair))
    if start:
        thread.start()
    return thread


class TaskWorker(QObject):
    sig_done = Signal(object)
    sig_error = Signal(str)
    sig_finished = Signal()

    def __init__(self, fn: Callable[[], object]):
        super().__init__()
        self.fn = fn

    @Slot()
    def run(self) -> None:
        try:
            self.sig_done.emit(self.fn())
        except MemoryError:
            self.sig_error.emit("out of memory: close other programs or choose a smaller model or type")
        except Exception as exc:  # noqa: BLE001 - every failure reaches the window
            self.sig_error.emit(f"{exc}" if str(exc) else type(exc).__name__)
        finally:
            return_to_ui_thread(self)
            self.sig_finished.emit()


class TaskRelay(QObject):
    """Lives in the caller's thread; the worker's signals reach these slots queued, so the callbacks
    run there. Emits sig_finished once the task's thread has ended, then deletes itself."""

    sig_finished = Signal()

    def __init__(self, parent: QObject, on_done, on_error):
        super().__init__(parent)
        self._on_done, self._on_error = on_done, on_error
        self.task: Task | None = None  # keeps the handle (and so the worker) alive until the thread ends

    @Slot(object)
    def done(self, result) -> None:
        self._on_done(result)

    @Slot(str)
    def failed(self, message: str) -> None:
        self._on_error(message)

    @Slot()
    def finish(self) -> None:
        self.task = None
        self.sig_finished.emit()
        self.deleteLater()


class Task:
    """A running task. `is_running()` tells whether its thread is still at work; `wait(ms)` waits."""

    def __init__(self, parent: QObject, fn, on_done, on_error):
        self.relay = TaskRelay(parent, on_done, on_error)
        self.relay.task = self
        # not start_in_thread: its direct quit made the Rewards page tests fail (focus not on the first
        # answer card after generating); here the quit is queued to the UI thread, as before
        self.thread = QThread(parent)
        self.worker = TaskWorker(fn)
        self.worker.moveToThread(self.thread)
        self.thread.started.connect(self.worker.run)
        self.worker.sig_done.connect(self.relay.done)
        self.worker.sig_error.connect(self.relay.failed)
        self.worker.sig_finished.connect(self.thread.quit)
        self.thread.finished.connect(self.worker.deleteLater)  # the worker lives in the UI thread by then
        self.thread.finished.connect(self.relay.finish)
        self.thread.finished.connect(self.thread.deleteLater)
        self.thread.start()

    @property
    def sig_finished(self):
        return self.relay.sig_finished

    def is_running(self) -> bool:
        try:
            return self.thread.isRunning()
        except RuntimeError:  # the thread object was already deleted: it has ended
            return False

    def wait(self, timeout_ms: int = 60_000) -> bool:
        try:
            return bool(self.thread.wait(timeout_ms))
        except RuntimeError:
            return True


def run_task(parent: QObject, fn, on_done, on_error) -> Task:
    return Task(parent, fn, on_done, on_error)
