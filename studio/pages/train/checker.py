"""The Train page's check of the next run as engine jobs (the job itself: next_run.check_job).

Changes come in bursts (a spin box held down, a dataset being edited), so a check starts
`delay_ms` after the last one (`schedule`, then `sig_due`); one check runs at a time, and a change
during a check makes that check's result stale: it is not shown, and the next run is checked again
at once (`sig_due`) when it ends. `sig_checked(result, config)` gives the latest check and the
settings it was made with; `sig_failed(message)` a check that could not be made.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal

from ...ui_gate import UiGate
from ...worker import Engine, Job
from .plan import EncodingCache


class NextRunCheck(QObject):
    """See the module docstring."""

    sig_due = Signal()  # time to check (the page decides what, and whether there is anything to check)
    sig_checked = Signal(object, object)  # plan.RunCheck, the TrainConfig it checked
    sig_failed = Signal(str)

    def __init__(self, engine: Engine, delay_ms: int, parent: QObject | None = None):
        super().__init__(parent)
        self.engine = engine
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(delay_ms)
        self.timer.timeout.connect(self.sig_due)
        self.job: Job | None = None
        self._gen = 0
        self._again = False
        # used by the check jobs only, in the worker, which give the UI thread its turn as they go
        self.encodings = EncodingCache(pause=UiGate.for_app().pause)

    def stop(self) -> None:
        """The page is closing: no check is due, and one under way stops at once (a large dataset's
        encoding child is killed; the check fails instead of keeping the engine worker)."""
        self.timer.stop()
        self.encodings.stop()

    def schedule(self) -> None:
        """Check soon: `delay_ms` after the last call."""
        self.timer.start()

    def submit(self, check, config) -> Job | None:
        """Run `check` (an engine job of `config`) unless one is running: then it is checked again
        when that one ends (None)."""
        if self.job is not None and self.job.active:
            self._again = True
            return None
        self._gen += 1
        gen = self._gen
        self.job = self.engine.submit(
            "checking the next run",
            check,
            on_done=lambda result, g=gen, c=config: self._done(g, result, c),
            on_error=lambda message, g=gen: self._failed(g, message),
            needs_session=False,
        )
        return self.job

    def _done(self, gen: int, result, config) -> None:
        self.job = None
        stale = self._again  # something changed while it ran: check again, show this one not
        if gen == self._gen and not stale:
            self.sig_checked.emit(result, config)
        if stale:
            self._again = False
            self.sig_due.emit()

    def _failed(self, gen: int, message: str) -> None:
        self.job = None
        if gen == self._gen:
            self.sig_failed.emit(message)
        if self._again:
            self._again = False
            self.schedule()
