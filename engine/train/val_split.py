"""The validation split: whole prompt groups held out, deterministic for a seed.

Samples that answer one prompt (one `Sample.group`) land on the same side, so validation never
scores an answer to a prompt that training saw; text samples are groups of their own.
`split_validation` returns the two sample lists, `validation_indices` their positions (what a plan
counts without copying samples) and `split_groups` the same from an array of group numbers (what
training splits its prepared table with). `validation_indices_ref` is the specification, group by
group in Python, that the vectorised `split_groups` is tested against.

Not here: reading samples (engine.train.data), packing them into batches (engine.train.batches).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from .data import Sample

log = logging.getLogger(__name__)


def validation_indices(samples: Sequence[Sample], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices of `split_validation`'s (train, validation) lists, in order (what a plan counts
    without copying samples)."""
    ids: dict[str, int] = {}
    groups = np.fromiter(
        (ids.setdefault(s.group, len(ids)) if s.group else -1 for s in samples),
        dtype=np.int64,
        count=len(samples),
    )
    train, val = split_groups(groups, fraction, seed)
    return train.tolist(), val.tolist()


def split_groups(groups: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`validation_indices` of samples by group number (equal numbers: one group; -1: a group of
    its own), as int64 index arrays."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction!r}")
    groups = np.asarray(groups, dtype=np.int64)
    n = len(groups)
    if fraction == 0.0 or n < 2:
        return np.arange(n), np.arange(0)
    own = groups < 0
    keys = np.where(own, (groups.max(initial=0) + 1) + np.arange(n), groups)
    _, first, which = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")[which.ravel()]  # by first sample
    n_groups = len(first)
    by_group = np.argsort(rank, kind="stable")  # sample indices, grouped, in order within each group
    sizes = np.bincount(rank, minlength=n_groups)
    starts = np.concatenate(([0], np.cumsum(sizes)))
    target = min(max(1, round(fraction * n)), n - 1)
    shuffled = np.random.default_rng(seed).permutation(n_groups)
    held: list[int] = []  # groups held out
    count = 0
    for g, size in zip(shuffled.tolist(), sizes[shuffled].tolist(), strict=True):
        if count + size <= target:
            held.append(g)
            count += size
            if count == target:
                break
    if not held:  # every group is larger than the target: hold out the smallest that leaves some training
        smaller = sizes[shuffled] < n
        if smaller.any():
            s = sizes[shuffled]
            held = [int(shuffled[np.flatnonzero(smaller & (s == s[smaller].min()))[0]])]
        else:
            log.warning("all %d samples answer the same prompt: no validation split", n)
    is_val = np.zeros(n, dtype=bool)
    for g in held:
        is_val[by_group[starts[g] : starts[g + 1]]] = True
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def validation_indices_ref(
    samples: Sequence[Sample], fraction: float, seed: int
) -> tuple[list[int], list[int]]:
    """`validation_indices` group by group in Python: the specification it is tested against."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction!r}")
    n = len(samples)
    if fraction == 0.0 or n < 2:
        return list(range(n)), []
    groups: dict[Any, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.group if s.group else ("#", i), []).append(i)
    members = list(groups.values())
    target = min(max(1, round(fraction * n)), n - 1)
    shuffled = [members[g] for g in np.random.default_rng(seed).permutation(len(members))]
    held: list[int] = []
    for group in shuffled:
        if len(held) + len(group) <= target:
            held.extend(group)
    if not held:  # every group is larger than the target: hold out the smallest that leaves some training
        smaller = [group for group in shuffled if len(group) < n]
        if smaller:
            held = min(smaller, key=len)
        else:
            log.warning("all %d samples answer the same prompt: no validation split", n)
    chosen = set(held)
    return [i for i in range(n) if i not in chosen], [i for i in range(n) if i in chosen]


def split_validation(
    samples: Sequence[Sample], fraction: float, seed: int
) -> tuple[list[Sample], list[Sample]]:
    """(train, validation): about `fraction` of the samples held out, whole groups at a time.

    Deterministic for a seed; both lists keep the original order. Samples sharing a `group`
    (answers to one prompt) land on the same side; text samples are groups of their own.
    fraction 0 holds out nothing; otherwise at least one sample is held out when there are two
    or more, and at least one stays for training. When every sample is in one group nothing
    can be held out without splitting it, and the validation list is empty.
    """
    train, val = validation_indices(samples, fraction, seed)
    return [samples[i] for i in train], [samples[i] for i in val]
