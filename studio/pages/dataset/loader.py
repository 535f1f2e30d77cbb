"""Reading dataset files and counting their tokens off the UI thread, for the Dataset page.

`DatasetLoader.load(path)` reads a JSON Lines file in a child process (`reading.ReadJob`: the
samples, the document's lookups and the table's rows with their search text and first words),
reporting progress (`sig_progress`); `sig_loaded(job, LoadResult)` hands them over and the page
only swaps them in. Where the child fails for another reason than the file, the file is read on
the job's thread instead (`reading.read_dataset`), giving way to the UI thread between small
pieces of work (`studio.ui_gate.UiGate`). `count(generation, samples, ...)` counts tokens with the
engine's `encode_iter` in a child process too (`studio.count_process`) and hands the counts over
a few hundred rows at a time (`sig_counts`), then `sig_counted`; a child that fails or dies is
reported (`sig_count_failed`, what and where) and the rows left are counted on the UI thread.
A newer load or count makes an older one stop; stopping kills and reaps the child. (A thread of
this process running that Python held the interpreter lock and stalled the UI thread: 250-430 ms
reading 100,000 samples, 376 ms counting them.)

The threads that wait for the children are plain Python threads, one per job, not QThreads: a
job may outlive the page that asked for it (a window closed while a file is read) without a
running QThread being destroyed; the loader is a QObject on the UI thread, so its signals reach
the page queued, and a job whose loader is gone stops. Only host data crosses. The app's
collector collects nothing while a file is read, until its samples are frozen
(`studio.ui_gc.collections_held`): a collection walking the samples read so far held the
interpreter 40-240 ms at 100,000.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Sequence

from PySide6.QtCore import QCoreApplication, QObject, Signal

from engine import ChatTemplate, DatasetError, EncodeOptions, Sample, Tokenizer

from ...count_process import CountJob
from ...ui_gate import UiGate
from ...ui_gc import collections_held
from .reading import LoadResult, ReadFailed, ReadJob, read_dataset
from .rows import RowCounts

log = logging.getLogger(__name__)


class DatasetLoader(QObject):
    """Reads files and counts tokens on background threads; see the module docstring."""

    sig_progress = Signal(int, int, int)  # job, bytes read, bytes in the file
    sig_loaded = Signal(int, object)  # job, LoadResult
    sig_failed = Signal(int, str)  # job, what went wrong
    sig_counts = Signal(int, object)  # generation, list[RowCounts]
    sig_counted = Signal(int)  # generation: counting stopped (done, or overtaken)
    sig_count_failed = Signal(int, str)  # generation, what failed and where (the rows left are counted here)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.gate = UiGate.for_app()
        self._load_job = 0  # the load that may go on; older ones stop
        self._count_gen = -1  # the counting that may go on
        self._count_job: CountJob | None = None
        self._read_job: ReadJob | None = None  # the reading in a child process under way
        self._read_lock = threading.Lock()
        app = QCoreApplication.instance()
        if app is not None:  # the app closing while counting: the child is killed and reaped
            app.aboutToQuit.connect(self.stop_counting)

    # --- reading ------------------------------------------------------------------------------
    def load(self, path: str) -> int:
        """Start reading `path`; the job number that its signals carry."""
        self.cancel_load()
        job = self._load_job
        threading.Thread(target=self._load, args=(job, path), name=f"dataset-load-{job}", daemon=True).start()
        return job

    def cancel_load(self) -> None:
        """Stop the reading under way (its child process is killed and reaped)."""
        with self._read_lock:
            self._load_job += 1
            read, self._read_job = self._read_job, None
        if read is not None:
            read.cancel()

    def loading(self, job: int) -> bool:
        return job == self._load_job

    def _load(self, job: int, path: str) -> None:
        def progress(done: int, total: int) -> None:
            self._emit(self.sig_progress, job, done, total)

        try:
            with collections_held():  # no collection walking the samples as they pile up...
                result = self._read(job, path, progress)
                if result is not None:
                    gc.freeze()  # ...nor after: they hold no cycles, refcounting frees them
            if result is not None and job == self._load_job:
                self._emit(self.sig_loaded, job, result)
        except _Gone:
            return
        except (DatasetError, OSError) as exc:
            self._emit(self.sig_failed, job, str(exc))
        except Exception as exc:  # noqa: BLE001 - every failure must reach the page
            log.exception("reading %s failed", path)
            self._emit(self.sig_failed, job, f"{type(exc).__name__}: {exc}")

    def _read(self, job: int, path: str, progress: Callable[[int, int], None]) -> LoadResult | None:
        """Read in a child process (`reading.ReadJob`); where the child fails for another reason than
        the file (it died, or could not start), read on this thread instead, giving way to the UI."""
        read = ReadJob()
        with self._read_lock:
            if job != self._load_job:
                return None
            self._read_job = read
        try:
            return read.read(path, progress)
        except ReadFailed as exc:
            log.warning("reading %s in a child process failed (%s); reading it here instead", path, exc)
        finally:
            with self._read_lock:  # done with it: a later cancel has nothing of this read to stop
                if self._read_job is read:
                    self._read_job = None

        def go_on() -> bool:
            self.gate.pause()
            return job == self._load_job

        return read_dataset(path, progress=progress, go_on=go_on)

    def _emit(self, signal: Signal, *args: object) -> None:
        """Emit from a job's thread; `_Gone` when the loader was deleted (its page closed)."""
        try:
            signal.emit(*args)
        except RuntimeError as exc:  # "Internal C++ object ... already deleted"
            raise _Gone from exc

    # --- counting -----------------------------------------------------------------------------
    def count(
        self,
        generation: int,
        samples: Sequence[Sample],
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        options: EncodeOptions,
    ) -> None:
        """Count the tokens of `samples` for the model generation `generation` (an older counting
        stops)."""
        self.stop_counting()
        self._count_gen = generation
        job = CountJob()
        self._count_job = job
        job.start(
            samples,
            tokenizer,
            template,
            options,
            on_counts=_quiet(job, lambda rows: self._counts(generation, rows)),
            on_done=_quiet(job, lambda error: self._count_done(generation, error)),
        )

    def stop_counting(self) -> None:
        """Stop the counting under way (its process is killed and reaped)."""
        self._count_gen = -1
        job, self._count_job = self._count_job, None
        if job is not None:
            job.cancel()

    @property
    def count_pid(self) -> int | None:
        """The counting child process's id (None when none runs or it has not started yet)."""
        return None if self._count_job is None else self._count_job.pid

    def _count_done(self, generation: int, error: str | None) -> None:
        if error is not None:
            log.error("counting tokens in a child process failed: %s", error)
            self._emit(self.sig_count_failed, generation, error)
        self._emit(self.sig_counted, generation)

    def _counts(self, generation: int, rows: list) -> None:
        self._emit(self.sig_counts, generation, [RowCounts(*row[:5]) for row in rows])

    def shutdown(self) -> None:
        """Stop a counting (its child process is killed and reaped); the page is closing."""
        self.stop_counting()


def _quiet(job: CountJob, call: Callable[..., None]) -> Callable[..., None]:
    """A callback from the counting's reader thread; when the loader is gone (its page deleted)
    the counting stops (the child is killed)."""

    def run(*args: object) -> None:
        try:
            call(*args)
        except _Gone:
            threading.Thread(target=job.cancel, daemon=True).start()

    return run


class _Gone(Exception):
    """The loader a job reports to was deleted."""


__all__ = ["DatasetLoader"]
