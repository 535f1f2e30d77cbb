"""Preference pairs: a prompt with a better ("chosen") and a worse ("rejected") answer.

Preference lines of a JSON Lines dataset ({"prompt" or "messages", "chosen", "rejected"}, and the
shapes other tools write) are read by `engine.train.data.parse_sample` into samples of kind
"preference": their messages are the prompt and the chosen answer (so one also trains as an
ordinary conversation, on its chosen answer), their `rejected` the other answer; problems are by
line, like every dataset's.

For training (engine.train.preferences): `encode_pairs` turns preference samples into pairs of
token sequences (the same prompt, each answer trained: its tokens are the ones whose
log-probability counts), and `pair_batches` packs `batch_size` pairs per batch (`PairBatch`, whose
`sample_ids` number the sequences: 2j the chosen and 2j + 1 the rejected answer of pair j).

For collecting pairs: `BlindPair` holds two answers shown as A and B in a random order, sources
hidden until a choice is made; `append_preference` appends the chosen pair to a preferences file and
flushes it to disk before returning (a choice is never lost).

What this module is not: it computes no loss (engine.train.preferences) and decides nothing.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DatasetError
from ..io.files import durable_append
from .data import (
    PREFERENCE,
    WARNING,
    Batch,
    Encoded,
    EncodeOptions,
    Problem,
    Sample,
    encode_samples,
    make_batches,
    pack,
    parse_sample,
)

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

    index: int  # index of the sample in the list given to encode_pairs
    chosen: Encoded  # the prompt and the chosen answer (its tokens trained)
    rejected: Encoded  # the prompt and the rejected answer


def encode_pairs(
    samples: Sequence[Sample], tokenizer: Tokenizer, template: ChatTemplate | None, n_ctx: int
) -> tuple[list[EncodedPair], list[Problem]]:
    """Token sequences of the preference samples (other samples are a warning each: DPO and ORPO
    learn from pairs only), and the problems met. The answers' tokens (and end-of-turn) are the
    trained ones; a sequence longer than n_ctx keeps its first n_ctx tokens (a warning)."""
    problems: list[Problem] = []
    wanted = []
    for i, s in enumerate(samples):
        if s.kind == KIND and s.rejected is not None:
            wanted.append(i)
        else:
            where = "" if s.line else f"sample {i}: "
            problems.append(
                Problem(
                    s.line,
                    f'{where}not a preference pair (no "chosen" and "rejected"): '
                    "left out of preference training",
                    WARNING,
                )
            )
    options = EncodeOptions(n_ctx)
    sequences = []
    for i in wanted:
        sequences.append(samples[i])
        sequences.append(with_answers(samples[i], chosen=samples[i].rejected))
    encoded, found = encode_samples(sequences, tokenizer, template, options)
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
    (`sample_ids`); `pair_ids[j]` is pair j's index in the list given to `pair_batches`."""

    pair_ids: np.ndarray | None = None  # (P,) int64

    @property
    def n_pairs(self) -> int:
        return 0 if self.pair_ids is None else int(self.pair_ids.size)


def pair_batches(
    pairs: Sequence[EncodedPair], n_ctx: int, batch_size: int, *, shuffle_seed: int | None = None
) -> list[PairBatch]:
    """`batch_size` pairs per batch (pairs shuffled by `shuffle_seed`), their 2 x batch_size
    sequences packed whole into windows of n_ctx tokens (as many windows as they need)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = list(range(len(pairs)))
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(len(pairs)).tolist()
    out = []
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        seqs = []
        for j, k in enumerate(chunk):
            seqs.append(replace(pairs[k].chosen, index=2 * j, weight=1.0))
            seqs.append(replace(pairs[k].rejected, index=2 * j + 1, weight=1.0))
        windows = pack(seqs, n_ctx)
        (batch,) = make_batches(windows, len(windows), n_ctx)
        values = {f.name: getattr(batch, f.name) for f in fields(Batch)}
        out.append(PairBatch(**values, pair_ids=np.asarray(chunk, dtype=np.int64)))
    return out


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
    "pair_batches",
    "PairBatch",
    "with_answers",
]
