"""A dataset's rows as the table shows them, made without Qt: on a loader's thread, or in the child
process that reads a large file (`studio.pages.dataset.read_process`), so the UI thread does not.

`SampleRow` is one row (a sample, what reading it found, its counts with the open model, and its
search text and first words, made once); `make_rows` makes them for samples as read, with what the
table sorts the first words by (`dense_ranks`), as `PreparedRows`. `RowCounts` are one sample's
counts with a model as a counter reports them (`count_row`), `DatasetStats` the table's totals.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from engine import Encoded, Problem, Sample


def first_words(sample: Sample, limit: int = 90) -> str:
    """The start of the first user turn (or prompt, or text), on one line."""
    if sample.kind == "text":
        source = sample.text or ""
    elif sample.kind == "prompt":
        source = sample.prompt or ""
    else:
        users = [m.get("content") or "" for m in sample.messages if m.get("role") == "user"]
        source = users[0] if users else (sample.messages[0].get("content") or "" if sample.messages else "")
    words = " ".join(str(source).split())
    return words if len(words) <= limit else words[: limit - 1].rstrip() + "…"


def sample_text(sample: Sample) -> str:
    """All the text of a sample (roles and contents, reward), for searching."""
    parts = [sample.kind]
    if sample.kind == "text":
        parts.append(sample.text or "")
    else:
        for m in sample.messages:
            parts.append(str(m.get("role", "")))
            parts.append(str(m.get("content") or ""))
    if sample.rejected is not None:
        parts.append(sample.rejected)
    if sample.reward is not None:
        parts.append(f"{sample.reward:g}")
    return "\n".join(parts)


@dataclass(eq=False)
class SampleRow:
    """One row: a sample, what reading/validating it found, and its token counts with the open
    model (valid while `count_gen` is the model's: a new tokenizer, template or n_ctx makes every
    count stale at once)."""

    sample: Sample
    problems: list[Problem] = field(default_factory=list)  # from loading or validating the sample
    count_gen: int = -1  # the SamplesModel generation its counts belong to
    n_tokens: int = -1  # tokens after truncation; -1: the sample cannot be encoded (dropped)
    n_trained: int = 0
    truncated: bool = False
    encode_problems: list[Problem] = field(default_factory=list)
    text: str | None = None  # all its text, casefolded (search), made when first needed
    words: str | None = None  # its first words (the column), made when first needed
    key: str | None = None  # the same, casefolded: how the column sorts

    def search_text(self) -> str:
        if self.text is None:
            self.text = sample_text(self.sample).casefold()
        return self.text

    def first_words(self) -> str:
        if self.words is None:
            self.words = first_words(self.sample)
        return self.words

    def words_key(self) -> str:
        """Its first words as they sort (casefolded)."""
        if self.key is None:
            self.key = self.first_words().casefold()
        return self.key


@dataclass
class PreparedRows:
    """Rows made ahead for the samples a document is about to hold, with the model's lookups."""

    samples: list[Sample]
    rows: list[SampleRow]
    by_sample: dict[int, SampleRow]  # id(sample) -> its row
    read: list[int]  # reading problems, errors, samples with a reward
    word_ranks: np.ndarray  # how the rows sort by first words


def make_rows(
    samples: Sequence[Sample],
    problems_for: Callable[[Sample], list[Problem]],
    go_on: Callable[[], bool] | None = None,
) -> PreparedRows | None:
    """Rows for samples, with their search text and first words made now, and what the model looks
    them up by (a loader thread makes them, so that the UI thread does not). `go_on()` is asked
    every few hundred rows; None when it said stop."""
    rows: list[SampleRow] = []
    by_sample: dict[int, SampleRow] = {}
    read = [0, 0, 0]
    for k, s in enumerate(samples):
        if go_on is not None and k & 255 == 255 and not go_on():
            return None
        row = SampleRow(s, problems_for(s))
        row.search_text()
        row.words_key()
        rows.append(row)
        by_sample[id(s)] = row
        if row.problems:
            read[0] += len(row.problems)
            read[1] += sum(1 for p in row.problems if p.severity == "error")
        if s.reward is not None:
            read[2] += 1
    return PreparedRows(list(samples), rows, by_sample, read, dense_ranks([r.words_key() for r in rows]))


def dense_ranks(keys: list[Any], run: int = 8192) -> np.ndarray:
    """Per key, its rank among the distinct keys in sorted order (equal keys, equal ranks).

    Sorted a run of keys at a time and merged: one sort call holds the interpreter for its whole
    length, and a loader thread must not hold it from the UI thread for long."""
    n = len(keys)
    if not n:
        return np.zeros(0, dtype=np.int64)
    key = keys.__getitem__
    runs = [sorted(range(a, min(a + run, n)), key=key) for a in range(0, n, run)]
    order = runs[0] if len(runs) == 1 else list(heapq.merge(*runs, key=key))  # stable: ties by index
    ordered = [keys[i] for i in order]
    pairs = zip(ordered[:-1], ordered[1:], strict=True)
    steps = np.fromiter((a != b for a, b in pairs), dtype=bool, count=n - 1)
    ranks = np.empty(n, dtype=np.int64)
    ranks[np.asarray(order)] = np.concatenate(([0], np.cumsum(steps)))
    return ranks


@dataclass(frozen=True)
class DatasetStats:
    samples: int
    with_reward: int
    problems: int  # on samples in the table (skipped lines are counted by the page)
    errors: int
    tokens: int | None  # None without a model or while counting
    trained: int | None
    counted: int  # rows whose tokens are known


@dataclass(frozen=True)
class RowCounts:
    """One sample's counts with a model, as a background counter reports them."""

    sample: Sample
    n_tokens: int  # -1: dropped
    n_trained: int
    truncated: bool
    problems: tuple[Problem, ...]


def count_row(sample: Sample, encoded: Encoded | None, problems: Sequence[Problem], index: int) -> RowCounts:
    """RowCounts from `encode_samples`' result for a sample (its "sample N: " prefix removed)."""
    prefix = f"sample {index}: "
    cleaned = tuple(
        replace(p, message=p.message[len(prefix) :]) if p.message.startswith(prefix) else p for p in problems
    )
    if encoded is None:
        return RowCounts(sample, -1, 0, False, cleaned)
    trained = int(np.count_nonzero(encoded.trained))
    return RowCounts(sample, len(encoded.tokens), trained, encoded.truncated, cleaned)


__all__ = [
    "DatasetStats",
    "PreparedRows",
    "RowCounts",
    "SampleRow",
    "count_row",
    "dense_ranks",
    "first_words",
    "make_rows",
    "sample_text",
]
