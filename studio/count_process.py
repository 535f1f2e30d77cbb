"""Token counting in a child process, so that the UI thread never waits for the interpreter.

Counting a large dataset's tokens is seconds of Python (the chat template, the tokenizer's merges).
On a thread of the app's own process it holds the interpreter lock and a core, and the UI thread
waited for both (376 ms stalls while a 100,000-sample file was counted, issue 38). Here a child
process (multiprocessing, spawn: nothing of the app's state or Qt is inherited; this module and
what the child imports are Qt-free) does the counting:

- `CountJob.start(samples, tokenizer, template, options, on_counts, on_done)` starts the child; a
  feeder thread sends it the settings and then the samples a chunk at a time through a pipe;
- the child encodes them with the engine's `encode_iter` and sends back, per chunk, NumPy arrays
  (tokens, trained tokens, truncated) and the problems found, by index;
- a reader thread calls `on_counts(rows)` with (sample, tokens (-1: dropped), trained tokens,
  truncated, problems) per sample, the problems' "sample N: " prefix removed;
  then `on_done(error)`: None when every sample was counted, else what failed and where (the
  child's traceback's last frame), also when the child died;
- `cancel()` kills the child and waits for it (no zombie), closing the pipe; the threads end.

The callbacks run on the reader thread: the caller hands them on to its own thread (the Dataset
page's loader emits queued Qt signals).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from engine import ChatTemplate, EncodeOptions, Problem, Sample, Tokenizer, encode_iter

log = logging.getLogger(__name__)

CHUNK = 512  # samples sent to the child, and counts sent back, at once
BATCH = 64  # samples the child tokenizes at once
NICE = 10  # the child's lower scheduling priority: on 2 cores it competes with the UI thread for a core


def _strip(problem: Problem, index: int) -> Problem:
    prefix = f"sample {index}: "
    return (
        replace(problem, message=problem.message[len(prefix) :])
        if problem.message.startswith(prefix)
        else problem
    )


def count_chunks(conn: Any) -> None:
    """The child's work: read (tokenizer, template, options), then lists of samples until None;
    send back ("counts", first, tokens, trained, truncated, problems) per chunk, then ("done",),
    or ("error", what and where) when counting fails."""
    try:
        os.nice(NICE)  # the window's UI thread goes first when the cores are busy
    except OSError:
        pass
    try:
        tokenizer, template, options = conn.recv()  # the template is compiled again here (its pickle)

        def given() -> Any:
            while True:
                chunk = conn.recv()
                if chunk is None:
                    return
                yield from chunk

        first = 0
        tokens: list[int] = []
        trained: list[int] = []
        truncated: list[bool] = []
        problems: list[tuple[int, Problem]] = []

        def flush() -> None:
            conn.send(
                (
                    "counts",
                    first,
                    np.asarray(tokens, dtype=np.int64),
                    np.asarray(trained, dtype=np.int64),
                    np.asarray(truncated, dtype=bool),
                    list(problems),
                )
            )

        for k, (_sample, encoded, found) in enumerate(
            encode_iter(given(), tokenizer, template, options, batch=BATCH)
        ):
            i = k - first
            for p in found:
                problems.append((i, _strip(p, k)))
            if encoded is None:
                tokens.append(-1)
                trained.append(0)
                truncated.append(False)
            else:
                tokens.append(len(encoded.tokens))
                trained.append(int(np.count_nonzero(encoded.trained)))
                truncated.append(bool(encoded.truncated))
            if len(tokens) >= CHUNK:
                flush()
                first = k + 1
                tokens, trained, truncated, problems = [], [], [], []
        if tokens:
            flush()
        conn.send(("done",))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # the app went away or cancelled
    except Exception as exc:  # noqa: BLE001 - reported to the app with where it happened
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{frame.filename}:{frame.lineno} in {frame.name}"
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc} (at {where})"))
        except OSError:
            pass


OnCounts = Callable[[list[Any]], None]
OnDone = Callable[[str | None], None]


class CountJob:
    """One counting in a child process; see the module docstring."""

    def __init__(self, target: Callable[[Any], None] = count_chunks):
        self._target = target
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._stop_lock = threading.Lock()  # one thread at a time kills, reaps and closes
        self._feed_error: str | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(
        self,
        samples: Sequence[Sample],
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        options: EncodeOptions,
        on_counts: OnCounts,
        on_done: OnDone,
    ) -> None:
        """Start counting; returns at once (the child starts on a thread of its own)."""
        samples = list(samples)
        threading.Thread(
            target=self._run,
            args=(samples, (tokenizer, template, options), on_counts, on_done),
            name="count-process",
            daemon=True,
        ).start()

    def _run(self, samples: list[Sample], settings: tuple, on_counts: OnCounts, on_done: OnDone) -> None:
        with self._lock:
            if self._cancelled.is_set():
                return
            parent, child = self._ctx.Pipe(duplex=True)
            self._proc = self._ctx.Process(
                target=self._target, args=(child,), name="token-count", daemon=True
            )
            self._proc.start()
            child.close()
            self._conn = parent
        feeder = threading.Thread(target=self._feed, args=(parent, samples, settings), daemon=True)
        feeder.start()
        error: str | None = None
        done = False
        try:
            while not self._cancelled.is_set():
                msg = parent.recv()
                if msg[0] == "counts":
                    _, first, tokens, trained, truncated, problems = msg
                    by_row: dict[int, list[Problem]] = {}
                    for i, p in problems:
                        by_row.setdefault(i, []).append(p)
                    on_counts(
                        [
                            (
                                samples[first + i],
                                int(tokens[i]),
                                int(trained[i]),
                                bool(truncated[i]),
                                tuple(by_row.get(i, ())),
                            )
                            for i in range(len(tokens))
                        ]
                    )
                elif msg[0] == "done":
                    done = True
                    break
                else:
                    error = msg[1]
                    break
        except (EOFError, OSError):
            if not self._cancelled.is_set():
                with self._stop_lock:  # reading the exit code reaps too: not beside a cancel's join
                    code = self._proc.exitcode if self._proc is not None else None
                error = (
                    self._feed_error or f"the token counting process ended unexpectedly (exit code {code})"
                )
        finally:
            self._stop_child()
        if self._cancelled.is_set():
            return
        if not done and error is None:
            error = "the token counting stopped before the end"
        on_done(error)

    def _feed(self, conn: Any, samples: list[Sample], settings: tuple) -> None:
        try:
            conn.send(settings)
            for i in range(0, len(samples), CHUNK):
                if self._cancelled.is_set():
                    return
                conn.send(samples[i : i + CHUNK])
            conn.send(None)
        except (OSError, ValueError):
            return  # the child was stopped
        except Exception as exc:  # noqa: BLE001 - e.g. a sample that does not pickle: reported, the child stopped
            self._feed_error = (
                f"the samples could not be sent to the counting process: {type(exc).__name__}: {exc}"
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
        """Stop counting: the child is killed and reaped; no callback is called after this."""
        self._cancelled.set()
        self._stop_child()


__all__ = ["CHUNK", "CountJob", "count_chunks"]
