"""Trainers for child-process runs in tests (studio.worker.CHILD_TRAINER names one of these).

A child process does not see a test's monkeypatching, so faults and pauses travel as a factory the
child imports by name, with picklable keyword arguments:
- `gated`: holds the run right after it emitted Step `step` (touches `<gate>/reached`, then waits for
  `<gate>/go`, see `release`), so a test can press Pause or Stop at a known step of a run that takes
  milliseconds.
- `failing_at`: the loss of step `step` raises `error(message)` (a builtin exception's name,
  RuntimeError by default; or MemoryError) in the child.
- `dying_at`: the child kills itself with SIGKILL at step `step`, as the kernel's OOM killer would.
"""

from __future__ import annotations

import builtins
import os
import signal
import time
from pathlib import Path

import engine.train.trainer
from engine import Step, Trainer


def gated(model, data, config, *, gate: str, step: int, **kwargs):
    trainer = Trainer(model, data, config, **kwargs)
    real_run = trainer.run

    def run(on_event, should_stop):
        def hold(event):
            on_event(event)
            if isinstance(event, Step) and event.step == step:
                Path(gate, "reached").touch()
                go = Path(gate, "go")
                deadline = time.monotonic() + 30
                while not go.exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                if go.exists() and go.read_text() == "stop":  # the test asked to stop first: wait
                    while not should_stop() and time.monotonic() < deadline:  # until it arrived
                        time.sleep(0.01)

        return real_run(hold, should_stop)

    trainer.run = run
    return trainer


def failing_loss(step: int, action):
    """engine.train.trainer.loss_and_grads, except that its call number `step` runs action() first."""
    real = engine.train.trainer.loss_and_grads
    calls = []

    def patched(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            action()
        return real(*args, **kwargs)

    return patched


def raiser(error: str = "RuntimeError", message: str = ""):
    """A function that raises the builtin exception named `error` with `message`."""

    def fail():
        raise getattr(builtins, error)(message)

    return fail


def failing_at(model, data, config, *, step: int, message: str = "", error: str = "RuntimeError", **kwargs):
    engine.train.trainer.loss_and_grads = failing_loss(step, raiser(error, message))  # this child's only run
    return Trainer(model, data, config, **kwargs)


def dying_at(model, data, config, *, step: int, **kwargs):
    engine.train.trainer.loss_and_grads = failing_loss(step, lambda: os.kill(os.getpid(), signal.SIGKILL))
    return Trainer(model, data, config, **kwargs)


def release(gate: str, stopping: bool = False) -> None:
    """Let a gated run go on; stopping=True: the test has asked it to stop, so the run waits until
    that request has reached it (a stop travels to the child asynchronously)."""
    Path(gate, "go").write_text("stop" if stopping else "")


def reached(gate: str) -> bool:
    return Path(gate, "reached").exists()
