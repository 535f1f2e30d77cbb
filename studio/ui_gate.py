"""Giving the UI thread the interpreter at once while background threads run Python.

A background thread that runs Python holds the interpreter in turns with the UI thread, and a
view that repaints calls Python for every cell it draws: each call can wait a switch interval
for the interpreter. `UiGate` knows when the UI thread is awake (its event loop's `awake` and
`aboutToBlock`); background work calls `pause()` between small pieces (a few milliseconds each),
which waits while the UI thread is awake (at most `PAUSE_S`) with the interpreter released, so
the UI thread runs its Python at full speed, and work goes on while it sleeps. `pause()` also
keeps the switch interval short (`SWITCH_INTERVAL_S`: the UI thread's first call waits that long
at most), as the engine worker does while a job runs; a short interval costs nothing while only
one thread wants the interpreter.

One gate per application (`UiGate.for_app()`, made on the UI thread). What it is not: a lock (work
goes on after PAUSE_S even if the UI thread never sleeps), nor a thread of its own.
"""

from __future__ import annotations

import sys
import threading

from PySide6.QtCore import QAbstractEventDispatcher, QCoreApplication, QThread

PAUSE_S = 0.02  # the longest background work waits for the UI thread to go idle (its bursts are shorter)
SWITCH_INTERVAL_S = 0.0001  # the engine worker's busy interval (studio.worker.SWITCH_INTERVAL_BUSY)
_ATTRIBUTE = "_tune_studio_ui_gate"


class UiGate:
    """See the module docstring. Made on the UI thread; `pause()` from any thread."""

    def __init__(self) -> None:
        self._idle = threading.Event()
        self._idle.set()
        dispatcher = QAbstractEventDispatcher.instance(QThread.currentThread())
        if dispatcher is not None:
            dispatcher.awake.connect(self._idle.clear)
            dispatcher.aboutToBlock.connect(self._idle.set)

    @classmethod
    def for_app(cls) -> UiGate:
        """The application's gate (made on first use, which must be on the UI thread)."""
        app = QCoreApplication.instance()
        gate = getattr(app, _ATTRIBUTE, None) if app is not None else None
        if gate is None:
            gate = cls()
            if app is not None:
                setattr(app, _ATTRIBUTE, gate)
        return gate

    def pause(self) -> None:
        """Wait while the UI thread is awake (at most PAUSE_S), the interpreter released."""
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        if threading.current_thread() is not threading.main_thread():
            self._idle.wait(PAUSE_S)


__all__ = ["PAUSE_S", "UiGate"]
