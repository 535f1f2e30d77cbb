"""Token counting in a child process (`studio.child_job`), so that the UI thread never waits for it.

Counting a large dataset's tokens is seconds of Python (the chat template, the tokenizer's merges);
on a thread of the app's own process it stalled the window 376 ms on 100,000 samples (issue 38).

- `CountJob.start(samples, tokenizer, template, options, on_counts, on_done)` starts the child and
  sends it the settings and then the samples a chunk at a time;
- the child (`count_chunks`) encodes them with the engine's `encode_iter` and sends back, per
  chunk, NumPy arrays (tokens, trained tokens, truncated) and the problems found, by index;
- `on_counts(rows)` gets (sample, tokens (-1: dropped), trained tokens, truncated, problems,
  targets (trained tokens after the first: `Encoded.n_targets`)) per sample, the problems'
  "sample N: " prefix removed; then `on_done(error)`: None when every sample was counted, else
  what failed and where (the child's traceback's last frame), also when the child died;
  `count(...)` does the same on the calling thread, returning what `on_done` would be given;
- `cancel()` kills the child and waits for it (no zombie).

The callbacks run on the job's reader thread (see `studio.child_job`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from engine import ChatTemplate, EncodeOptions, Problem, Sample, Tokenizer, encode_iter

from .child_job import ChildJob, OnDone, serve

MANY = 2000  # samples worth a child process: fewer are counted where they are (starting one takes ~1 s)
CHUNK = 512  # samples sent to the child, and counts sent back, at once
BATCH = 64  # samples the child tokenizes at once


def _strip(problem: Problem, index: int) -> Problem:
    prefix = f"sample {index}: "
    return (
        replace(problem, message=problem.message[len(prefix) :])
        if problem.message.startswith(prefix)
        else problem
    )


def count_chunks(conn: Any) -> None:
    """The child's work: read (tokenizer, template, options), then lists of samples until None;
    send back ("counts", first, tokens, trained, truncated, problems, targets) per chunk, then ("done",),
    or ("error", what and where) when counting fails."""
    serve(conn, _count)


def _count(conn: Any) -> None:
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
    targets: list[int] = []
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
                np.asarray(targets, dtype=np.int64),
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
            targets.append(0)
            truncated.append(False)
        else:
            tokens.append(len(encoded.tokens))
            trained.append(int(np.count_nonzero(encoded.trained)))
            targets.append(encoded.n_targets)
            truncated.append(bool(encoded.truncated))
        if len(tokens) >= CHUNK:
            flush()
            first = k + 1
            tokens, trained, targets, truncated, problems = [], [], [], [], []
    if tokens:
        flush()
    conn.send(("done",))


OnCounts = Callable[[list[Any]], None]


class CountJob(ChildJob):
    """One counting in a child process; see the module docstring."""

    def __init__(self, target: Callable[[Any], None] = count_chunks):
        super().__init__(target, "token-count", "token counting")

    def start(  # type: ignore[override]
        self,
        samples: Sequence[Sample],
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        options: EncodeOptions,
        on_counts: OnCounts,
        on_done: OnDone,
    ) -> None:
        """Start counting; returns at once (the child starts on a thread of its own)."""
        super().start(*self._plumbing(samples, tokenizer, template, options, on_counts), on_done)

    def count(
        self,
        samples: Sequence[Sample],
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        options: EncodeOptions,
        on_counts: OnCounts,
    ) -> str | None:
        """Count on the calling thread (it waits on the pipe, holding no lock): what `on_done` would be
        given (None when every sample was counted, or when cancelled)."""
        return self.run(*self._plumbing(samples, tokenizer, template, options, on_counts))

    @staticmethod
    def _plumbing(
        samples: Sequence[Sample],
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        options: EncodeOptions,
        on_counts: OnCounts,
    ) -> tuple[Iterator[Any], Callable[[tuple], None]]:
        """What the child is sent, and what turns its messages into `on_counts` rows."""
        samples = list(samples)

        def feed() -> Iterator[Any]:
            yield tokenizer, template, options
            for i in range(0, len(samples), CHUNK):
                yield samples[i : i + CHUNK]
            yield None

        def message(msg: tuple) -> None:
            if msg[0] != "counts":
                return
            _, first, tokens, trained, truncated, problems, targets = msg
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
                        int(targets[i]),
                    )
                    for i in range(len(tokens))
                ]
            )

        return feed(), message


__all__ = ["CHUNK", "MANY", "CountJob", "count_chunks"]
