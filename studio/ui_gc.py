"""Python's cyclic garbage collector, run on the UI thread from a timer, and held off while a large
dataset is read.

Automatic collections run in whatever thread allocates. In a worker thread they may destroy Qt
objects there, which crashes Qt; and a collection walks every object of its generations: with
100,000 samples being read (about five tracked objects each) a full one took 100-240 ms holding the
interpreter, so the window froze that long. `UiCollector` turns automatic collection off and
collects from a timer on the UI thread (pyqtgraph's recipe: the young generations when enough was
allocated, the old one when they were collected often enough), and collects nothing while some
thread holds `held()`. The Dataset page's loader holds it from the first batch of rows it takes in
until it has moved the samples out of the collector's reach (`gc.freeze`: they hold no cycles,
refcounting frees them).
Holding off only the full collection would not do: everything allocated between two looks of the
timer is young, so a young collection in the middle of a read walks what was read since (40 ms).
The price: a reference cycle that became garbage during the read is frozen with the samples and
stays until the process ends (the UI makes few; the reader none).

One collector per application (`collect_on_ui_thread(app)` in `studio.app`); `UiCollector.for_app()`
finds it from any thread, or None (the tests collect after each test instead).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from PySide6.QtCore import QCoreApplication, QObject, QTimer

INTERVAL_S = 0.5  # how often the UI thread looks at the collector's counts
_ATTRIBUTE = "_tune_studio_ui_gc"


class UiCollector(QObject):
    """See the module docstring. Made on the UI thread; `held()` from any thread."""

    def __init__(self, interval_s: float = INTERVAL_S, parent: QObject | None = None):
        super().__init__(parent)
        self.threshold = gc.get_threshold()
        self._holds = 0
        self._lock = threading.Lock()
        self.skipped = 0  # looks at the counts that collected nothing because someone held held()
        self._was_enabled = gc.isenabled()
        gc.disable()
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.check)
        self.timer.start(int(interval_s * 1000))

    @classmethod
    def install(cls, app: QCoreApplication, interval_s: float = INTERVAL_S) -> UiCollector:
        """The application's collector, made now if it has none."""
        found = cls.for_app(app)
        if found is None:
            found = cls(interval_s, app)
            setattr(app, _ATTRIBUTE, found)
        return found

    @classmethod
    def for_app(cls, app: QCoreApplication | None = None) -> UiCollector | None:
        app = app if app is not None else QCoreApplication.instance()
        return getattr(app, _ATTRIBUTE, None) if app is not None else None

    @contextmanager
    def held(self) -> Iterator[None]:
        """While held (from any thread, nested), nothing is collected."""
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1

    def check(self) -> None:
        l0, l1, l2 = gc.get_count()
        t0, t1, t2 = self.threshold
        if l0 <= t0:
            return
        if self._holds:
            self.skipped += 1
            return
        gc.collect(0)
        if l1 > t1:
            gc.collect(1)
            if l2 > t2:
                gc.collect(2)

    def stop(self) -> None:
        """Stop collecting from the timer; automatic collection is as it was before; the application
        has no collector any more."""
        self.timer.stop()
        if self._was_enabled:
            gc.enable()
        app = QCoreApplication.instance()
        if app is not None and getattr(app, _ATTRIBUTE, None) is self:
            delattr(app, _ATTRIBUTE)


@contextmanager
def collections_held() -> Iterator[None]:
    """The application collector's `held()`; nothing where the app has none."""
    collector = UiCollector.for_app()
    if collector is None:
        yield
        return
    with collector.held():
        yield


__all__ = ["INTERVAL_S", "UiCollector", "collections_held"]
