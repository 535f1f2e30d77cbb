"""Packing encoded samples into windows and laying the windows out as batches.

`pack` puts whole samples into windows of `n_ctx` tokens (first-fit decreasing, a run of equal
lengths at a time; `pack_ref` one sample at a time, the specification) and `make_batches` lays the
windows out as (B, T) arrays with positions restarting at 0 for each sample and a segment number
per sample, so that attention can be kept inside each sample. `BatchesOnDemand` builds each batch
when it is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from .data import Problem, Sample
from .encode import Encoded, EncodeOptions, encode_samples

if TYPE_CHECKING:
    from ..text.chat_template import ChatTemplate
    from ..text.tokenizer import Tokenizer


# -- packing and batches ------------------------------------------------------------------------


def _first_fit_ref(lengths: Sequence[int], capacity: int) -> list[int]:
    """First-fit bin index per item, in the order given, with a max segment tree over free space:
    the specification of `_first_fit`."""
    n = len(lengths)
    size = 1
    while size < max(n, 1):
        size *= 2
    free = np.full(2 * size, capacity, dtype=np.int64)  # free[1] root; leaves size..2*size-1 are bins
    bins = []
    for length in lengths:
        node = 1
        while node < size:
            node = 2 * node if free[2 * node] >= length else 2 * node + 1
        bins.append(node - size)
        free[node] -= length
        node //= 2
        while node:
            free[node] = max(free[2 * node], free[2 * node + 1])
            node //= 2
    return bins


def _first_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """`_first_fit_ref`, a run of equal lengths at a time (lengths sorted, as packing gives them,
    make few runs). In a run of length L, each item goes to the first bin with L free: the open
    bins with room, in order, each take as many as fit (free // L), then new bins take
    capacity // L each."""
    n = len(lengths)
    bins = np.empty(n, dtype=np.int64)
    free = np.empty(0, dtype=np.int64)  # the open bins' free space
    if n == 0:
        return bins
    cuts = np.flatnonzero(np.diff(lengths)) + 1
    for a, b in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [n])).tolist(), strict=True):
        length, m = int(lengths[a]), b - a
        if length > capacity:
            raise ValueError(f"an item of {length} does not fit in bins of {capacity}")
        if length <= 0:  # fits anywhere: the first bin
            bins[a:b] = 0
            if not len(free):
                free = np.array([capacity], dtype=np.int64)
            continue
        room = np.flatnonzero(free >= length)
        cum = np.cumsum(free[room] // length)
        placed = min(m, int(cum[-1])) if len(cum) else 0
        if placed:
            which = np.searchsorted(cum, np.arange(placed), side="right")
            bins[a : a + placed] = room[which]
            free[room] -= np.bincount(which, minlength=len(room)) * length
        rest = m - placed
        if rest:
            per = capacity // length
            k = np.arange(rest) // per
            bins[a + placed : b] = len(free) + k
            free = np.concatenate((free, capacity - np.bincount(k) * length))
    return bins


def count_windows(lengths: Sequence[int], n_ctx: int) -> int:
    """How many windows `pack` fills with items of these lengths (first-fit decreasing; the count does
    not depend on the order of equal lengths, so not on the shuffle)."""
    lengths = np.sort(np.asarray(lengths, dtype=np.int64))[::-1]
    return int(_first_fit(lengths, n_ctx).max()) + 1 if len(lengths) else 0


def pack_order(
    lengths: np.ndarray, n_ctx: int, *, shuffle_seed: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`pack` of items with these lengths, as arrays: (item indices, window starts), window w
    holding items[starts[w]:starts[w + 1]] in the order they were placed."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    rng = np.random.default_rng(shuffle_seed) if shuffle_seed is not None else None
    order = np.arange(n) if rng is None else rng.permutation(n)
    order = order[np.argsort(-lengths[order], kind="stable")]  # stable: ties keep the (shuffled) order
    bins = _first_fit(lengths[order], n_ctx)
    n_windows = int(bins.max()) + 1 if n else 0
    items = order[np.argsort(bins, kind="stable")]
    counts = np.bincount(bins, minlength=n_windows)
    starts = np.concatenate(([0], np.cumsum(counts)))
    if rng is not None:
        perm = rng.permutation(n_windows)
        counts = counts[perm]
        moved = np.concatenate(([0], np.cumsum(counts)))
        items = items[np.repeat(starts[:-1][perm] - moved[:-1], counts) + np.arange(n)]
        starts = moved
    return items, starts


def pack(encoded: Sequence[Encoded], n_ctx: int, *, shuffle_seed: int | None = None) -> list[list[Encoded]]:
    """Whole samples in windows of at most `n_ctx` tokens, by first-fit decreasing.

    Samples are taken longest first (ties in list order, or in an order shuffled by
    `shuffle_seed`) and each goes into the first window with room for it; a sample is never
    split. Windows come in the order they were opened (longest samples first), or shuffled by
    `shuffle_seed`. Every sample must already fit (`encode_samples` truncates to n_ctx).
    """
    for e in encoded:
        if len(e.tokens) > n_ctx:
            raise ValueError(f"sample {e.index} has {len(e.tokens)} tokens, more than n_ctx={n_ctx}")
    lengths = np.fromiter((len(e.tokens) for e in encoded), dtype=np.int64, count=len(encoded))
    items, starts = pack_order(lengths, n_ctx, shuffle_seed=shuffle_seed)
    return [
        [encoded[i] for i in items[a:b].tolist()]
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)
    ]


def pack_ref(
    encoded: Sequence[Encoded], n_ctx: int, *, shuffle_seed: int | None = None
) -> list[list[Encoded]]:
    """`pack` one sample at a time with `_first_fit_ref`: the specification it is tested against."""
    for e in encoded:
        if len(e.tokens) > n_ctx:
            raise ValueError(f"sample {e.index} has {len(e.tokens)} tokens, more than n_ctx={n_ctx}")
    rng = np.random.default_rng(shuffle_seed) if shuffle_seed is not None else None
    order = list(range(len(encoded))) if rng is None else rng.permutation(len(encoded)).tolist()
    order.sort(key=lambda i: -len(encoded[i].tokens))  # stable: ties keep the (shuffled) order
    bins = _first_fit_ref([len(encoded[i].tokens) for i in order], n_ctx)
    windows: list[list[Encoded]] = [[] for _ in range(max(bins, default=-1) + 1)]
    for i, b in zip(order, bins, strict=True):
        windows[b].append(encoded[i])
    if rng is not None:
        windows = [windows[i] for i in rng.permutation(len(windows))]
    return windows


@dataclass(frozen=True)
class Batch:
    """Packed windows as (B, T) arrays; the loss is sum(weights * cross_entropy(logits, targets))."""

    tokens: np.ndarray  # (B, T) int64 input ids (padding 0)
    targets: np.ndarray  # (B, T) int64: token t+1 of the same sample when it is trained, else -1
    weights: np.ndarray  # (B, T) float32 loss weight per target, 0 where targets == -1
    positions: np.ndarray  # (B, T) int64, restarting at 0 for each packed sample (padding 0)
    segments: np.ndarray  # (B, T) int64 packed-sample number within the row; -1 for padding
    sample_ids: np.ndarray  # (B, T) int64 index of the sample each position belongs to; -1 for padding
    n_label_tokens: int  # count of targets >= 0

    @property
    def n_tokens(self) -> int:
        """Positions holding a sample token (not padding)."""
        return int(np.count_nonzero(self.segments >= 0))


class BatchesOnDemand(Sequence[Batch]):
    """A sequence of batches, each made when asked for (`_make(i)`, the subclass's), the last one
    kept: a step asks for the batch it trains more than once (its shape, then the batch)."""

    _last: tuple[int, Batch] | None = None

    def __getitem__(self, i: int) -> Batch:  # type: ignore[override]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"batch {i} of {n}")
        if self._last is None or self._last[0] != i:
            self._last = (i, self._make(i))
        return self._last[1]

    def _make(self, i: int) -> Batch:
        raise NotImplementedError


def make_batches(
    windows: Sequence[Sequence[Encoded]], batch_size: int, n_ctx: int, *, normalize: str = "tokens"
) -> list[Batch]:
    """Batches of `batch_size` windows (the last may have fewer), each row n_ctx long.

    normalize="tokens": weights = sample weight / n_label_tokens of the batch, so with unit
    weights the loss is the mean cross-entropy over the batch's label tokens.
    normalize="samples": weights = sample weight / (the sample's label tokens * samples in the
    batch): the mean over samples of each sample's mean, for group-relative training where the
    weight is an advantage and may be negative.
    """
    if normalize not in ("tokens", "samples"):
        raise ValueError(f"normalize must be 'tokens' or 'samples', got {normalize!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batches = []
    for first in range(0, len(windows), batch_size):
        rows = windows[first : first + batch_size]
        B, T = len(rows), n_ctx
        tokens = np.zeros((B, T), dtype=np.int64)
        targets = np.full((B, T), -1, dtype=np.int64)
        weights = np.zeros((B, T), dtype=np.float64)
        positions = np.zeros((B, T), dtype=np.int64)
        segments = np.full((B, T), -1, dtype=np.int64)
        sample_ids = np.full((B, T), -1, dtype=np.int64)
        placed = []  # (row, start, sample)
        for b, row in enumerate(rows):
            t = 0
            for k, e in enumerate(row):
                n = len(e.tokens)
                if t + n > T:
                    raise ValueError(f"window {first + b} holds {t + n} tokens, more than n_ctx={n_ctx}")
                tokens[b, t : t + n] = e.tokens
                targets[b, t : t + n - 1] = np.where(e.trained[1:], e.tokens[1:], -1)
                positions[b, t : t + n] = np.arange(n)
                segments[b, t : t + n] = k
                sample_ids[b, t : t + n] = e.index
                placed.append((b, t, e))
                t += n
        n_label = int(np.count_nonzero(targets >= 0))
        n_samples = sum(1 for _, _, e in placed if e.n_targets > 0)
        for b, t, e in placed:
            sl = slice(t, t + len(e.tokens) - 1)
            if normalize == "tokens":
                denom = n_label
            else:
                denom = e.n_targets * n_samples
            if denom:
                weights[b, sl] = np.where(targets[b, sl] >= 0, e.weight / denom, 0.0)
        batches.append(
            Batch(tokens, targets, weights.astype(np.float32), positions, segments, sample_ids, n_label)
        )
    return batches


def batch_encoded(
    encoded: Sequence[Encoded],
    n_ctx: int,
    batch_size: int,
    *,
    weights: Sequence[float] | np.ndarray | None = None,
    shuffle_seed: int | None = None,
    normalize: str = "tokens",
) -> list[Batch]:
    """`pack` then `make_batches`, with `weights[e.index]` as each sample's weight when given.

    `weights` is indexed like the sample list that `encode_samples` was given.
    """
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or not np.all(np.isfinite(w)):
            raise ValueError("weights must be a 1-D sequence of finite numbers")
        if encoded and max(e.index for e in encoded) >= len(w):
            raise ValueError(f"{len(w)} weights for samples indexed up to {max(e.index for e in encoded)}")
        encoded = [replace(e, weight=float(w[e.index])) for e in encoded]
    return make_batches(
        pack(encoded, n_ctx, shuffle_seed=shuffle_seed), batch_size, n_ctx, normalize=normalize
    )


def build_batches(
    samples: Sequence[Sample],
    tokenizer: Tokenizer,
    template: ChatTemplate | None,
    options: EncodeOptions,
    batch_size: int,
    *,
    weights: Sequence[float] | np.ndarray | None = None,
    shuffle_seed: int | None = None,
    normalize: str = "tokens",
) -> tuple[list[Batch], list[Problem]]:
    """One epoch's batches of `samples` and the encoding problems: `encode_samples` then `batch_encoded`.

    `weights` (one per sample, e.g. `engine.rewards.reward_weights`) scale each sample's loss.
    A trainer that runs several epochs can call `encode_samples` once and `batch_encoded` per epoch.
    """
    if weights is not None and len(weights) != len(samples):
        raise ValueError(f"{len(weights)} weights for {len(samples)} samples")
    encoded, problems = encode_samples(samples, tokenizer, template, options)
    batches = batch_encoded(
        encoded, options.n_ctx, batch_size, weights=weights, shuffle_seed=shuffle_seed, normalize=normalize
    )
    return batches, problems
