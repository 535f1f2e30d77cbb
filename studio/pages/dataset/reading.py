"""Reading a dataset file into what the Dataset page shows, without Qt: on the calling thread
(`read_dataset`) or in a child process (`ReadJob`).

What reading makes: the samples and the problems found (the engine's `iter_jsonl`), the
document's lookups (`index_of`) and the table's rows with their search text and first words
(`make_rows`), as a `LoadResult`; the page then only swaps them in.

A large file is read in a child process (`ReadJob.read`, `studio.child_job`): parsing 100,000
samples is seconds of Python, and on a thread of the window's process the UI thread waited for the
interpreter lock at every call into Python while it ran (stalls of 250-430 ms, issue 38). The
child (`read_rows`) reads, indexes and makes the rows exactly as `read_dataset` does, then sends
the rows a few hundred at a time; the thread waiting for them only unpickles each batch (one short
hold of the lock) and files the rows in the lookups.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import DatasetError, Problem, Sample, iter_jsonl

from ...child_job import ChildJob, serve
from ...dataset_document import DocumentIndex, index_of
from .rows import PreparedRows, SampleRow, make_rows

PROGRESS_S = 0.1  # seconds between progress reports
ROWS_CHUNK = 256  # rows the child sends at once: unpickling them holds the interpreter about a millisecond

Progress = Callable[[int, int], None]  # (bytes read, bytes in the file)


@dataclass(frozen=True)
class LoadResult:
    """A file read off the UI thread, and what the document and the table need, made there too."""

    path: str
    samples: list[Sample]
    problems: list[Problem]
    index: DocumentIndex  # the document's lookups
    rows: PreparedRows  # the table's rows
    seconds: float


class ReadFailed(RuntimeError):
    """The reading process failed for another reason than the file (it died, or a bug): the file
    can still be read another way."""


def _parse(
    path: str, progress: Progress | None, go_on: Callable[[], bool] | None
) -> tuple[list, list] | None:
    """The samples and problems of a JSON Lines file; `go_on()` every 64 samples (False: None)."""
    total = os.path.getsize(path) if os.path.isfile(path) else 0
    problems: list[Problem] = []
    read = [0]
    samples: list[Sample] = []
    next_report = time.monotonic() + PROGRESS_S
    for k, sample in enumerate(iter_jsonl(path, problems, read)):
        samples.append(sample)
        if k & 63 == 63:
            if go_on is not None and not go_on():
                return None
            if progress is not None and time.monotonic() >= next_report:
                progress(read[0], total)
                next_report = time.monotonic() + PROGRESS_S
    if progress is not None:
        progress(total, total)
    return samples, problems


def read_dataset(
    path: str,
    *,
    progress: Progress | None = None,
    go_on: Callable[[], bool] | None = None,
) -> LoadResult | None:
    """Read a dataset file and make the document's lookups and the table's rows, on the calling
    thread. `progress(bytes read, bytes in the file)` now and then; `go_on()` every few dozen
    samples: False stops (None is returned). DatasetError when the file cannot be read."""
    t0 = time.perf_counter()
    parsed = _parse(path, progress, go_on)
    if parsed is None:
        return None
    samples, problems = parsed
    index = index_of(samples, problems)
    rows = make_rows(samples, index.problems_for, go_on)
    if rows is None:
        return None
    return LoadResult(path, samples, problems, index, rows, time.perf_counter() - t0)


def read_rows(conn: Any) -> None:
    """The child's work: read the path sent, as `read_dataset` does, and send back ("progress",
    bytes read, bytes in the file) now and then, ("rows", [SampleRow]) a chunk at a time, then
    ("done", problems, skipped problems, read counts, word ranks); ("done", None, what is wrong)
    when the file cannot be read; ("error", what and where) when something else fails."""
    serve(conn, _read_rows)


def _read_rows(conn: Any) -> None:
    path = conn.recv()
    try:
        parsed = _parse(path, lambda done, total: conn.send(("progress", done, total)), None)
    except (DatasetError, OSError) as exc:
        conn.send(("done", None, str(exc)))
        return
    assert parsed is not None
    samples, problems = parsed
    index = index_of(samples, problems)
    prepared = make_rows(samples, index.problems_for)
    assert prepared is not None
    skipped, read, ranks, rows = index.skipped, prepared.read, prepared.word_ranks, prepared.rows
    del samples, index, prepared  # the rows hold what is left: each batch sent is freed here
    for i in range(0, len(rows), ROWS_CHUNK):
        chunk = rows[i : i + ROWS_CHUNK]
        conn.send(("rows", chunk))
        rows[i : i + len(chunk)] = [None] * len(chunk)
    conn.send(("done", problems, skipped, read, ranks))


class ReadJob(ChildJob):
    """One file read in a child process; see the module docstring."""

    def __init__(self, target: Callable[[Any], None] = read_rows):
        super().__init__(target, "dataset-read", "dataset reading")

    def read(self, path: str, progress: Progress | None = None) -> LoadResult | None:
        """Read `path` in the child, on the calling thread; None when cancelled. DatasetError when the
        file cannot be read, ReadFailed when the child failed (what and where)."""
        t0 = time.perf_counter()
        rows: list[SampleRow] = []
        samples: list[Sample] = []
        by_sample: dict[int, SampleRow] = {}
        loaded: dict[int, Sample] = {}
        by_line: dict[int, list[Problem]] = {}
        end: list[tuple] = []

        def take(msg: tuple) -> None:
            if msg[0] == "progress":
                if progress is not None:
                    progress(msg[1], msg[2])
            elif msg[0] == "rows":
                rows.extend(msg[1])
                for r in msg[1]:  # index_of's and make_rows' lookups, of this process's objects
                    s = r.sample
                    samples.append(s)
                    by_sample[id(s)] = r
                    if s.line:
                        loaded[s.line] = s
                        if r.problems:
                            by_line[s.line] = list(r.problems)
            elif msg[0] == "done":
                end.append(msg)

        def feed() -> Iterator[str]:
            yield path

        error = self.run(feed(), take)
        if self.cancelled:
            return None
        if error is not None:
            raise ReadFailed(error)
        _, problems, *rest = end[0]
        if problems is None:
            raise DatasetError(rest[0])
        skipped, read, word_ranks = rest
        index = DocumentIndex(len(samples), len(problems), skipped, by_line, loaded)
        prepared = PreparedRows(list(samples), rows, by_sample, read, np.asarray(word_ranks))
        return LoadResult(path, samples, problems, index, prepared, time.perf_counter() - t0)


__all__ = ["LoadResult", "ReadFailed", "ReadJob", "read_dataset", "read_rows"]
