"""Preference pairs: a prompt with a better ("chosen") and a worse ("rejected") answer.

Preference lines of a JSON Lines dataset ({"prompt" or "messages", "chosen", "rejected"}, and the
shapes other tools write) are read by `engine.train.data.parse_sample` into samples of kind
"preference": their messages are the prompt and the chosen answer (so one also trains as an
ordinary conversation, on its chosen answer), their `rejected` the other answer; problems are by
line, like every dataset's.

For training (engine.train.preferences): a pair is two token sequences (the same prompt, each
answer trained: its tokens are the ones whose log-probability counts). The trainer prepares them
with the other datasets' pipeline: `engine.train.prepared.prepare_data(..., pairs=True)` encodes
the samples `pair_rows` gives (each pair as its chosen then its rejected answer) into the
memory-mapped, cached files, and `PreparedPairs` reads pairs back from them; `encode_pairs` is the
same in memory (the reference the prepared pairs are tested against). `PairBatches` packs
`batch_size` pairs per batch on demand (`PairBatch`, whose `sample_ids` number the sequences: 2j
the chosen and 2j + 1 the rejected answer of pair j).

For collecting pairs: `BlindPair` holds two answers shown as A and B in a random order, sources
hidden until a choice is made; `append_preference` appends the chosen pair to a preferences file and
flushes it to disk before returning (a choice is never lost).

What this module is not: it computes no loss (engine.train.preferences) and decides nothing.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DatasetError
from ..io.files import durable_append
from .batches import Batch, BatchesOnDemand, make_batches, pack, pack_order
from .data import PREFERENCE, WARNING, Problem, Sample, parse_sample
from .encode import Encoded, EncodeOptions, encode_samples

if TYPE_CHECKING:
    from ..text.chat_template import ChatTemplate
    from ..text.tokenizer import Tokenizer

KIND = PREFERENCE
CHOICES = ("A", "B", "tie", "skip")  # what a person can answer to a blind pair


def chosen_text(sample: Sample) -> str:
    """The chosen answer of a preference sample."""
    return str(sample.messages[-1].get("content") or "") if sample.messages else ""


def with_answers(sample: Sample, chosen: str | None = None, rejected: str | None = None) -> Sample:
    """A preference sample with other answer texts (None: unchanged)."""
    messages = sample.messages
    if chosen is not None:
        messages = (*messages[:-1], {**messages[-1], "content": chosen})
    return replace(sample, messages=messages, rejected=sample.rejected if rejected is None else rejected)


# -- encoding and batches ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodedPair:
    """One preference pair as two token sequences with the same prompt."""

    index: int  # what the pair is known by: its sample's index in the list given to encode_pairs,
    # or its pair number in a prepared dataset (PreparedPairs)
    chosen: Encoded  # the prompt and the chosen answer (its tokens trained)
    rejected: Encoded  # the prompt and the rejected answer


def encode_pairs(
    samples: Sequence[Sample], tokenizer: Tokenizer, template: ChatTemplate | None, n_ctx: int
) -> tuple[list[EncodedPair], list[Problem]]:
    """Token sequences of the preference samples (other samples are a warning each: DPO and ORPO
    learn from pairs only), and the problems met. The answers' tokens (and end-of-turn) are the
    trained ones; a sequence longer than n_ctx keeps its first n_ctx tokens (a warning)."""
    problems: list[Problem] = []
    wanted = [i for i, s in enumerate(samples) if s.kind == KIND and s.rejected is not None]
    sequences = list(pair_rows(samples, problems))
    encoded, found = encode_samples(sequences, tokenizer, template, EncodeOptions(n_ctx))
    by_seq = {e.index: e for e in encoded}
    seen_lines = set()
    for p in found:  # one report per line (both answers of a pair share it)
        key = (p.line, p.message)
        if key not in seen_lines:
            seen_lines.add(key)
            problems.append(p)
    pairs = []
    for j, i in enumerate(wanted):
        c, r = by_seq.get(2 * j), by_seq.get(2 * j + 1)
        if c is None or r is None:
            continue
        pairs.append(EncodedPair(i, replace(c, index=i), replace(r, index=i)))
    return pairs, problems


@dataclass(frozen=True)
class PairBatch(Batch):
    """A `Batch` of preference pairs: sequence 2j is pair j's chosen answer, 2j + 1 its rejected one
    (`sample_ids`); `pair_ids[j]` is pair j's `EncodedPair.index` (what the pair is known by, e.g.
    its DPO reference log-probabilities)."""

    pair_ids: np.ndarray | None = None  # (P,) int64

    @property
    def n_pairs(self) -> int:
        return 0 if self.pair_ids is None else int(self.pair_ids.size)


def pair_rows(samples: Iterable[Sample], problems: list[Problem]) -> Iterator[Sample]:
    """The samples to prepare for pair training (engine.train.prepared.prepare_data(pairs=True)):
    each preference pair as two samples in a row, its chosen answer then its rejected one (the same
    prompt, group and line); any other sample is left out with a warning appended to `problems`
    (a sample made in memory named by its position, "sample 3: ...")."""
    for i, s in enumerate(samples):
        if s.kind == KIND and s.rejected is not None:
            yield s
            yield with_answers(s, chosen=s.rejected)
        else:
            problems.append(_not_a_pair(s, i))


def _not_a_pair(sample: Sample, i: int) -> Problem:
    where = "" if sample.line else f"sample {i}: "
    return Problem(
        sample.line,
        f'{where}not a preference pair (no "chosen" and "rejected"): left out of preference training',
        WARNING,
    )


class PreparedPairs(Sequence[EncodedPair]):
    """Pairs of a dataset prepared with `prepare_data(..., pairs=True)`: pair k is rows 2k (chosen)
    and 2k + 1 (rejected) of `data.samples`, made from the prepared files when read. `pairs`: the
    pair numbers taken, in order (each pair's `EncodedPair.index` is its number)."""

    def __init__(self, data, pairs: np.ndarray):
        self.data, self.pairs = data, np.asarray(pairs, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> EncodedPair:  # type: ignore[override]
        if not -len(self.pairs) <= i < len(self.pairs):
            raise IndexError(f"pair {i} of {len(self.pairs)}")
        k = int(self.pairs[i])
        return EncodedPair(k, self.data.encoded(2 * k, k), self.data.encoded(2 * k + 1, k))

    def sizes(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, loss terms) of each pair's chosen and rejected sequences, (P, 2) each, from the
        prepared table (no tokens read)."""
        rows = (2 * self.pairs[:, None] + np.arange(2)).reshape(-1)
        table = self.data.samples[rows]
        lengths, labels = (table[k].astype(np.int64).reshape(-1, 2) for k in ("length", "targets"))
        return lengths, labels


def _sizes(pairs: Sequence[EncodedPair]) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(pairs, PreparedPairs):
        return pairs.sizes()
    seqs = [e for p in pairs for e in (p.chosen, p.rejected)]
    lengths = np.fromiter((len(e.tokens) for e in seqs), dtype=np.int64, count=len(seqs)).reshape(-1, 2)
    labels = np.fromiter((e.n_targets for e in seqs), dtype=np.int64, count=len(seqs)).reshape(-1, 2)
    return lengths, labels


class PairBatches(BatchesOnDemand):
    """One epoch's batches of preference pairs, each made when asked for: `batch_size` pairs per
    batch (pairs shuffled by `shuffle_seed`), their 2 x batch_size sequences packed whole into
    windows of n_ctx tokens (as many windows as they need). `n_windows`, `n_tokens` and
    `n_label_tokens` count the whole epoch (as `engine.train.prepared.PackedBatches` does)."""

    def __init__(
        self, pairs: Sequence[EncodedPair], n_ctx: int, batch_size: int, *, shuffle_seed: int | None = None
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.pairs, self.n_ctx, self.batch_size = pairs, n_ctx, batch_size
        lengths, labels = _sizes(pairs)
        if lengths.size and lengths.max() > n_ctx:
            raise ValueError(f"a sequence has {lengths.max()} tokens, more than n_ctx={n_ctx}")
        n = len(pairs)
        self._order = (
            np.random.default_rng(shuffle_seed).permutation(n) if shuffle_seed is not None else np.arange(n)
        )
        self.n_tokens, self.n_label_tokens = int(lengths.sum()), int(labels.sum())
        self.n_windows = 0
        ordered = lengths[self._order]
        for first in range(0, n, batch_size):  # a batch whose sequences fit one window needs no packing
            chunk = ordered[first : first + batch_size].reshape(-1)
            fits = int(chunk.sum()) <= n_ctx
            self.n_windows += 1 if fits else len(pack_order(chunk, n_ctx)[1]) - 1

    def __len__(self) -> int:
        return math.ceil(len(self.pairs) / self.batch_size)

    def _make(self, i: int) -> PairBatch:
        chunk = [self.pairs[int(k)] for k in self._order[i * self.batch_size : (i + 1) * self.batch_size]]
        seqs = []
        for j, p in enumerate(chunk):
            seqs.append(replace(p.chosen, index=2 * j, weight=1.0))
            seqs.append(replace(p.rejected, index=2 * j + 1, weight=1.0))
        windows = pack(seqs, self.n_ctx)
        (batch,) = make_batches(windows, len(windows), self.n_ctx)
        values = {f.name: getattr(batch, f.name) for f in fields(Batch)}
        return PairBatch(**values, pair_ids=np.asarray([p.index for p in chunk], dtype=np.int64))


# -- collecting pairs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlindPair:
    """Two answers to one prompt shown as A and B in a random order; who gave each (`sources`) is
    hidden until a choice is made."""

    answers: tuple[str, str]  # as given: (first, second)
    sources: tuple[str, str]  # who gave each, e.g. ("base model", "adapter")
    swapped: bool  # A shows the second answer

    @property
    def a(self) -> str:
        return self.answers[1 if self.swapped else 0]

    @property
    def b(self) -> str:
        return self.answers[0 if self.swapped else 1]

    @property
    def a_source(self) -> str:
        return self.sources[1 if self.swapped else 0]

    @property
    def b_source(self) -> str:
        return self.sources[0 if self.swapped else 1]

    def choose(self, choice: str) -> tuple[str, str] | None:
        """(chosen, rejected) texts for "A" or "B"; None for "tie" and "skip" (no pair to learn from)."""
        if choice not in CHOICES:
            raise ValueError(f"a choice is one of {', '.join(CHOICES)}, got {choice!r}")
        if choice == "A":
            return self.a, self.b
        if choice == "B":
            return self.b, self.a
        return None

    def chosen_source(self, choice: str) -> str | None:
        return {"A": self.a_source, "B": self.b_source}.get(choice)


def blind_pair(
    first: str, second: str, sources: tuple[str, str] = ("first", "second"), rng: random.Random | None = None
) -> BlindPair:
    """The two answers in a random order (a coin per pair)."""
    coin = (rng or random.Random()).random() < 0.5
    return BlindPair((first, second), tuple(sources), coin)


def append_preference(
    path: str,
    chosen: str,
    rejected: str,
    *,
    prompt: str | None = None,
    messages: Sequence[Mapping[str, str]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Append one pair to a preferences file (created if missing), flushed to disk before returning:
    {"prompt" or "messages", "chosen", "rejected", ...extra, "time"}. The line is checked to read back
    as a preference first; DatasetError (nothing written) when it would not, or cannot be written."""
    if (prompt is None) == (messages is None):
        raise DatasetError("a preference needs a prompt or the messages before the answers (one of them)")
    record: dict[str, Any] = (
        {"prompt": prompt} if prompt is not None else {"messages": [dict(m) for m in messages]}
    )
    record.update({"chosen": chosen, "rejected": rejected})
    for k, v in (extra or {}).items():
        record.setdefault(k, v)
    record.setdefault("time", datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"))
    sample, problems = parse_sample(record)
    if sample is None:
        raise DatasetError(
            f"the pair cannot be saved: {problems[0].message if problems else 'not a preference'}"
        )
    try:
        line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
        durable_append(path, line.encode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise DatasetError(f"the pair cannot be written as JSON: {exc}") from exc
    except OSError as exc:
        raise DatasetError(f"{path}: the choice cannot be saved ({exc.strerror or exc})") from exc
    return record


__all__ = [
    "append_preference",
    "blind_pair",
    "BlindPair",
    "CHOICES",
    "chosen_text",
    "encode_pairs",
    "EncodedPair",
    "KIND",
    "pair_rows",
    "PairBatch",
    "PairBatches",
    "PreparedPairs",
    "with_answers",
]
