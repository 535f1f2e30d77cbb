"""A UI-responsiveness probe: a precise QTimer on the UI thread that records the gaps between its
timeouts, and the UI thread's own CPU time within each. While training runs in a worker thread (or
a dataset is read), the longest gap is the longest time the UI thread could not run (the worker
holding the GIL, slow slots on the UI thread itself, or other programs holding the cores); the
most CPU time within one gap is the UI thread's longest piece of work.

Used by bench/ui_stall.py, bench/dataset_stall.py and the Train page tests; measures only, changes
nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import numpy as np
from PySide6.QtCore import QObject, Qt, QTimer


class StallProbe(QObject):
    """`start()`, let the event loop run, `stop()`; then `max_gap_ms`, `percentile(99)`, `n_ticks`.

    Marks (`mark("training")`) split the record into phases, so the stall while loading the model
    can be told apart from the stall between steps: `phase_max_ms()` -> {phase: max gap in ms}.
    """

    def __init__(self, interval_ms: int = 5, parent: QObject | None = None):
        super().__init__(parent)
        self.interval_ms = interval_ms
        self.timer = QTimer(self)
        self.timer.setTimerType(Qt.PreciseTimer)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._tick)
        self.gaps: list[float] = []  # seconds
        self.busy: list[float] = []  # seconds of the UI thread's own CPU time within each gap
        self.phases: list[tuple[int, str]] = []  # (index into gaps where the phase starts, name)
        self._last = 0.0
        self._last_cpu = 0.0

    def start(self, phase: str = "start") -> None:
        self.gaps.clear()
        self.busy.clear()
        self.phases = [(0, phase)]
        self._last = time.perf_counter()
        self._last_cpu = time.thread_time()
        self.timer.start()

    def mark(self, phase: str) -> None:
        self.phases.append((len(self.gaps), phase))

    def stop(self) -> None:
        self.timer.stop()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Not measuring while the body runs (a screenshot taken for the record, say)."""
        self.timer.stop()
        try:
            yield
        finally:
            self._last, self._last_cpu = time.perf_counter(), time.thread_time()
            self.timer.start()

    def _tick(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        self.gaps.append(now - self._last)
        self.busy.append(cpu - self._last_cpu)
        self._last, self._last_cpu = now, cpu

    @property
    def n_ticks(self) -> int:
        return len(self.gaps)

    @property
    def max_gap_ms(self) -> float:
        return 1000.0 * max(self.gaps, default=0.0)

    @property
    def max_busy_ms(self) -> float:
        """The most CPU time the UI thread itself spent between two ticks: its longest piece of
        work, whatever else ran (a wall gap longer than this was spent waiting: for the interpreter,
        or for a core other programs held)."""
        return 1000.0 * max(self.busy, default=0.0)

    def percentile(self, q: float) -> float:
        return 1000.0 * float(np.percentile(self.gaps, q)) if self.gaps else 0.0

    def phase_max_ms(self) -> dict[str, float]:
        out: dict[str, float] = {}
        bounds = [*self.phases, (len(self.gaps), "")]
        for (i, name), (j, _) in zip(bounds[:-1], bounds[1:], strict=True):
            out[name] = max(out.get(name, 0.0), 1000.0 * max(self.gaps[i:j], default=0.0))
        return out

    def summary(self) -> str:
        phases = ", ".join(f"{k} {v:.1f} ms" for k, v in self.phase_max_ms().items())
        return (
            f"max UI stall {self.max_gap_ms:.1f} ms (timer every {self.interval_ms} ms, {self.n_ticks} "
            f"ticks, p99 {self.percentile(99):.1f} ms; by phase: {phases})"
        )


__all__ = ["StallProbe"]
