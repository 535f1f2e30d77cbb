"""Training in a child process: the caller's process never shares its interpreter lock, its CPU
priority or its fate with a training run.

A `Trainer` running in a thread of the studio's process holds the GIL for most of each step (the
engine's Python between NumPy calls), so every time the UI thread re-enters Python (a slot, a paint
override) it waits for the interpreter's switch interval; with dozens of re-entries per repaint the
window froze for 50-100 ms at a time. `TrainProcess` runs the trainer in a separate interpreter
(`python -m engine.train.train_child`, the same on Linux, macOS and Windows), at a lower CPU priority,
and streams its events back; the caller reads them in any thread. A crash of the run (a segfault,
the kernel's out-of-memory killer) ends the child, not the caller.

Protocol: length-prefixed pickles over the child's stdin and stdout (the child's own prints go to
its stderr). Parent -> child: the job (with the parent's sys.path, so that a trainer named by a
test resolves), then "stop" when asked (finish the current step, checkpoint, end gracefully); when
stdin closes (the parent died) the child stops the same way. Child -> parent: ("event", e) for each
engine event as the trainer emits it; then exactly one of ("result", Finished | Failed) or
("raised", exception or None, type name, message, traceback text) for an exception the trainer did
not turn into an event.

This module is UI-free: it knows nothing about Qt; the studio's worker thread drives it.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .events import Failed, Finished
from .trainer import TrainConfig

DEFAULT_TRAINER = "engine.train.trainer:Trainer"
DEFAULT_NICE = 10  # below the desktop's own processes: the window stays responsive while training


@dataclass(frozen=True)
class TrainJob:
    """Everything a child needs to build and run one trainer (all of it picklable).

    `trainer` names the callable that builds the trainer ("module:attribute", called with
    (model, data, config, template=, resume=, init_adapter=, **trainer_kwargs)); tests name their own
    to inject faults or pause a run at a known step."""

    model: str
    data: Any  # a JSONL path or a list of engine Samples
    config: TrainConfig = TrainConfig()  # noqa: RUF009 - frozen dataclass
    template: str | None = None
    resume: str | None = None
    init_adapter: str | None = None
    nice: int = DEFAULT_NICE
    trainer: str = DEFAULT_TRAINER
    trainer_kwargs: dict = field(default_factory=dict)


class ChildRaised(Exception):
    """The trainer in the child raised instead of ending with an event. `original` is the exception
    itself when it could be sent across (else None), `type_name` and `message` describe it, and
    `child_traceback` is the child's formatted traceback."""

    def __init__(self, original: BaseException | None, type_name: str, message: str, child_traceback: str):
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.original = original
        self.type_name = type_name
        self.message = message
        self.child_traceback = child_traceback


class ChildDied(Exception):
    """The child ended without sending its result: killed (often by the system when memory ran
    out) or crashed. `exitcode` is the process's exit status (negative: the signal number)."""

    def __init__(self, exitcode: int | None):
        self.exitcode = exitcode
        super().__init__(describe_exit(exitcode))


def describe_exit(exitcode: int | None) -> str:
    """A person's reading of a child's exit status."""
    if exitcode is None:
        return "the training process stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        text = f"the training process was killed ({name})"
        if -exitcode == getattr(signal, "SIGKILL", 9):
            text += "; the system kills a process this way when memory runs out"
        return text
    return f"the training process ended unexpectedly (exit status {exitcode})"


def resolve(name: str) -> Callable[..., Any]:
    """The callable named "package.module:attribute"."""
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise ValueError(f"a trainer is named 'module:attribute', got {name!r}")
    return getattr(importlib.import_module(module), attr)


def lower_priority(nice: int) -> None:
    """Lower this process's CPU priority by `nice`, every thread of it: on Linux a nice value
    belongs to a thread, and NumPy's BLAS threads were started (at import) before this runs."""
    if nice <= 0:
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: a per-process nice value (macOS, BSD)
        tids = []
    if tids:
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
            except OSError:  # the thread has ended, or this is not allowed: leave it
                pass
        return
    try:
        os.nice(nice)
    except (AttributeError, OSError):  # not on this platform (Windows), or not allowed
        pass


def _describe_exception(exc: BaseException) -> tuple:
    try:
        original = pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - an exception that cannot cross is described by text
        original = None
    return ("raised", original, type(exc).__name__, str(exc), traceback.format_exc())


_HEADER = struct.Struct(">Q")


def write_frame(stream, obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream) -> object:
    """The next object on `stream`; EOFError when the other end has closed."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("the other end closed the pipe")
    (n,) = _HEADER.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("the other end closed the pipe mid-message")
    return pickle.loads(data)


def child_main() -> None:
    """The child process: read the job, build the trainer, run it, send events and the outcome."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")  # the protocol's channel
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints (ours or a library's) go to stderr
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C in a terminal is the parent's to handle
    stop = threading.Event()
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        try:
            with send_lock:
                write_frame(out, message)
        except (BrokenPipeError, OSError, ValueError):  # nobody listens any more: end gracefully
            stop.set()

    try:
        sys_path, job = read_frame(inp)
    except EOFError:
        return
    lower_priority(job.nice)
    sys.path[:] = list(dict.fromkeys([*sys_path, *sys.path]))

    def watch_control() -> None:
        try:
            while True:
                if read_frame(inp) == "stop":
                    stop.set()
        except (EOFError, OSError, ValueError):  # the parent closed stdin or died: stop as if asked
            stop.set()

    threading.Thread(target=watch_control, name="tune-training-control", daemon=True).start()
    try:
        make = resolve(job.trainer)
        trainer = make(
            job.model,
            job.data,
            job.config,
            template=job.template,
            resume=job.resume,
            init_adapter=job.init_adapter,
            **job.trainer_kwargs,
        )
        result = trainer.run(lambda e: send(("event", e)), stop.is_set)
        del trainer
        send(("result", result))
    except BaseException as exc:  # noqa: BLE001 - every outcome reaches the parent
        send(_describe_exception(exc))
    finally:
        out.close()


class TrainProcess:
    """One training run in a child process. `run(on_event)` starts it, calls on_event(event) in the
    calling thread for each engine event, and returns the run's `Finished` or `Failed`; it raises
    `ChildRaised` or `ChildDied` when the child could not produce one. `request_stop()` and `kill()`
    may be called from any thread."""

    def __init__(self, job: TrainJob):
        self.job = job
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._stop_requested = False
        self.exitcode: int | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def request_stop(self) -> None:
        """Ask the run to end after the current step (it writes its checkpoint first)."""
        with self._lock:
            self._stop_requested = True
            self._send_stop()

    def _send_stop(self) -> None:  # with self._lock held
        if self._process is not None:
            try:
                write_frame(self._process.stdin, "stop")
            except (BrokenPipeError, OSError, ValueError):  # the child has already ended
                pass

    def kill(self) -> None:
        """End the child at once (no checkpoint is written); for a run that ignores stop."""
        if self.is_alive():
            self._process.kill()

    def _start(self) -> subprocess.Popen:
        flags = getattr(subprocess, "BELOW_NORMAL_PRIORITY_CLASS", 0)  # Windows' lower priority
        process = subprocess.Popen(
            [sys.executable, "-m", "engine.train.train_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            creationflags=flags,
        )
        with self._lock:
            self._process = process
            try:
                write_frame(process.stdin, (list(sys.path), self.job))
            except (BrokenPipeError, OSError):  # it died at once: run() reports how it ended
                pass
            if self._stop_requested:  # asked before the child existed
                self._send_stop()
        return process

    def messages(self) -> Iterator[tuple]:
        """Every message the child sends, until it closes its end (it ended, or died)."""
        while True:
            try:
                yield read_frame(self._process.stdout)
            except (EOFError, OSError):
                return

    def run(self, on_event: Callable[[object], None] = lambda e: None) -> Finished | Failed:
        process = self._start()
        outcome: tuple | None = None
        try:
            for message in self.messages():
                kind = message[0]
                if kind == "event":
                    on_event(message[1])
                elif kind in ("result", "raised"):
                    outcome = message
        finally:
            self._finish(process)
        if outcome is None:
            raise ChildDied(self.exitcode)
        if outcome[0] == "raised":
            raise ChildRaised(*outcome[1:])
        return outcome[1]

    def _finish(self, process: subprocess.Popen) -> None:
        with self._lock:
            try:
                process.stdin.close()  # the child sees EOF: it stops if it has not
            except OSError:
                pass
        try:
            process.wait(10.0)
        except subprocess.TimeoutExpired:  # sent its outcome but does not exit: do not leave it behind
            process.kill()
            process.wait(5.0)
        process.stdout.close()
        self.exitcode = process.returncode


__all__ = [
    "ChildDied",
    "ChildRaised",
    "DEFAULT_NICE",
    "TrainJob",
    "TrainProcess",
    "describe_exit",
    "lower_priority",
]
