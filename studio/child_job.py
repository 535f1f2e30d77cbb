"""Work of seconds of Python in a child process, so that the window's UI thread never waits for it.

A thread of the app's own process running Python holds the interpreter lock, and the UI thread
waits for it at every call into Python (PySide takes the lock for each virtual call of a
Python-derived widget): counting a 100,000-sample file's tokens on a thread stalled the window
376 ms, reading and parsing it 250-430 ms (issue 38). A child process (multiprocessing, spawn:
nothing of the app's state or Qt is inherited; the target's module and what it imports must be
Qt-free) does the work instead, and the app's threads only wait on a pipe.

`ChildJob(target, name, what)` runs `target(conn)` in the child:

- `start(feed, on_message, on_done)` starts it from a thread of its own (`run(feed, on_message)`
  the same on the calling thread, returning what `on_done` would be given); a feeder thread sends
  each item of `feed` (an iterable, read lazily) through the pipe;
- the child sends back tuples; a reader thread calls `on_message(msg)` for each, until a
  ("done", ...) message (also passed to `on_message`) or an ("error", what and where) one;
- then `on_done(error)`: None when the child said done, else what failed and where, also when
  the child died or its input could not be sent;
- `cancel()` kills the child and reaps it (no zombie), closing the pipe; no callback follows.

The callbacks run on the reader thread: the caller hands them on to its own thread (the Dataset
page's loader emits queued Qt signals). A child's target runs its work through `serve(conn,
work)`: at a lower priority, with an unexpected exception sent as ("error", its type, message and
the line it came from).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.util  # noqa: F401 - registers its exit function now, so that ours runs before it
import os
import threading
import traceback
import weakref
from collections.abc import Callable, Iterable
from typing import Any

NICE = 10  # the child's lower scheduling priority: on 2 cores it competes with the UI thread for a core

OnMessage = Callable[[tuple], None]
OnDone = Callable[[str | None], None]


def serve(conn: Any, work: Callable[[Any], None]) -> None:
    """A child's whole life: at a lower priority than the window (on 2 cores it competes with the
    UI thread for a core), `work(conn)`; an unexpected exception is sent as ("error", what and
    where), the app going away or cancelling ends it quietly."""
    nice = getattr(os, "nice", None)  # POSIX only: elsewhere the child runs at the window's priority
    if nice is not None:
        try:
            nice(NICE)
        except OSError:
            pass
    try:
        work(conn)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    except Exception as exc:  # noqa: BLE001 - reported to the app with where it happened
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{frame.filename}:{frame.lineno} in {frame.name}"
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc} (at {where})"))
        except OSError:
            pass


_LIVE: weakref.WeakSet[ChildJob] = weakref.WeakSet()  # jobs whose child may run


@atexit.register
def _cancel_all() -> None:
    """The interpreter is exiting: every job is cancelled first (registered after multiprocessing's
    own exit function, this one runs before it), so that a thread waiting for a child takes its end
    for a cancel, not for a failure to work around (the Train check encoded 100,000 samples here)."""
    for job in list(_LIVE):
        job.cancel()


class ChildJob:
    """One piece of work in a child process; see the module docstring."""

    def __init__(self, target: Callable[[Any], None], name: str, what: str):
        self._target = target
        self._name = name  # the child process's name
        self._what = what  # what it does, in messages: "token counting"
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._stop_lock = threading.Lock()  # one thread at a time kills, reaps and closes
        self._feed_error: str | None = None
        _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def start(self, feed: Iterable[Any], on_message: OnMessage, on_done: OnDone) -> None:
        """Start the child; returns at once (the child starts on a thread of its own)."""

        def run() -> None:
            error = self.run(feed, on_message)
            if not self._cancelled.is_set():
                on_done(error)

        threading.Thread(target=run, name=self._name, daemon=True).start()

    def run(self, feed: Iterable[Any], on_message: OnMessage) -> str | None:
        """Run the child and read what it sends, on the calling thread, until it is done: None when
        it said done (or when cancelled: see `cancelled`), else what failed and where."""
        with self._lock:
            if self._cancelled.is_set():
                return None
            parent, child = self._ctx.Pipe(duplex=True)
            proc = self._ctx.Process(target=self._target, args=(child,), name=self._name, daemon=True)
            try:
                proc.start()
            except Exception as exc:  # noqa: BLE001 - e.g. no processes left, or a __main__ spawn cannot import
                parent.close()
                child.close()
                what = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
                return f"the {self._what} process could not start: {what}"
            self._proc = proc
            child.close()
            self._conn = parent
        threading.Thread(
            target=self._feed, args=(parent, feed), name=f"{self._name}-feed", daemon=True
        ).start()
        error: str | None = None
        done = False
        try:
            while not self._cancelled.is_set():
                msg = parent.recv()
                if msg[0] == "error":
                    error = msg[1]
                    break
                on_message(msg)
                if msg[0] == "done":
                    done = True
                    break
        except (EOFError, OSError):
            if not self._cancelled.is_set():
                with self._stop_lock:  # reading the exit code reaps too: not beside a cancel's join
                    code = self._proc.exitcode if self._proc is not None else None
                error = self._feed_error or f"the {self._what} process ended unexpectedly (exit code {code})"
        finally:
            self._stop_child()
        if self._cancelled.is_set():
            return None
        if not done and error is None:
            error = f"the {self._what} stopped before the end"
        return error

    def _feed(self, conn: Any, feed: Iterable[Any]) -> None:
        try:
            for item in feed:
                if self._cancelled.is_set():
                    return
                conn.send(item)
        except (OSError, ValueError):
            return  # the child was stopped
        except Exception as exc:  # noqa: BLE001 - e.g. a sample that does not pickle: reported, the child stopped
            self._feed_error = (
                f"the {self._what} process could not be sent its work: {type(exc).__name__}: {exc}"
            )
            self._stop_child()

    def _stop_child(self) -> None:
        """Kill and reap the child; the pipe is closed once, by whichever thread gets here first (cancel
        on the UI thread and the reader's own end both come here: a second close raised EBADF).

        The two callers are serialised: when both reaped at once, one thread's `waitpid` took the child
        while the other's got ECHILD, which multiprocessing reads as "still running", so `cancel` could
        return with the child still listed in `active_children` (seen once in CI). Serialised, the
        second caller's `join` finds the exit code the first one stored and returns at once."""
        with self._stop_lock:
            with self._lock:
                proc, conn = self._proc, self._conn
                self._conn = None
            if proc is not None:
                if proc.is_alive():
                    proc.kill()
                proc.join(5)
            if conn is not None:
                conn.close()

    def cancel(self) -> None:
        """Stop: the child is killed and reaped; no callback is called after this."""
        self._cancelled.set()
        self._stop_child()


__all__ = ["ChildJob", "NICE", "serve"]
