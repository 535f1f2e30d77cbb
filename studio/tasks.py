"""Running one engine function off the UI thread: a worker object moved to a QThread.

`run_task(parent, fn, on_done, on_error)` calls fn() in a new thread and delivers its result (host
data only) or its exception message back on the UI thread. The thread quits and both objects are
deleted when it ends; callers keep the returned handle while it runs.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, QThread, Signal, Slot


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
            self.sig_finished.emit()


class Task:
    """A running task; `thread.isRunning()` tells whether it is still at work."""

    def __init__(self, parent: QObject, fn, on_done, on_error):
        self.thread = QThread(parent)
        self.worker = TaskWorker(fn)
        self.worker.moveToThread(self.thread)
        self.thread.started.connect(self.worker.run)
        self.worker.sig_done.connect(on_done)
        self.worker.sig_error.connect(on_error)
        self.worker.sig_finished.connect(self.thread.quit)
        self.worker.sig_finished.connect(self.worker.deleteLater)
        self.thread.finished.connect(self.thread.deleteLater)
        self.thread.start()


def run_task(parent: QObject, fn, on_done, on_error) -> Task:
    return Task(parent, fn, on_done, on_error)
