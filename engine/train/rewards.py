"""Rewards as a training signal: per-sample loss weights (DESIGN.md §2.7).

Two ways, both computed over the samples of one dataset (or one rated group):

- `reward_weights`: reward-weighted SFT as llama.cpp's QLoRA example does it. There
  (ggml-org/llama.cpp PR #22705, `examples/qlora_training/finetune_qlora.cpp`, `build_dataset`,
  and its README: "Rewards are normalized per epoch: clipped to [-1, 1], then min-max scaled to
  [0, 1]. Reward 0 = sample ignored; reward 1 = full gradient"), each line's "reward" (else
  "score", else 1.0) is averaged over the tokens of each training window, the window rewards
  are clipped to [-1, 1] and min-max scaled across *all windows of the dataset* (not per batch);
  when max - min <= 1e-6 every weight is 1.0. The weight replaces the 1.0 of the target token in
  the cross-entropy labels, so the loss of a window is scaled by it.

  Here samples are packed whole, so the unit is the sample rather than the window: rewards are
  clipped and min-max scaled across the samples given, with the same 1e-6 rule. One deliberate
  difference: a sample without a reward gets weight 1.0 and takes no part in the scaling
  (llama.cpp counts it as a reward of 1.0, which would shift everyone else's weights).
- `group_advantages`: group-relative (GRPO-style). For the answers to one prompt,
  A = (r - mean) / (std + eps) with the population std; the trainer weights each answer's mean
  token log-likelihood by A (`make_batches(..., normalize="samples")`), so bad answers are
  pushed down, not only good ones up.

What this module is not: it does not read files or train; it turns numbers into numbers.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

_FLAT = 1e-6  # llama.cpp: a reward range at or below this means "no signal", all weights 1.0


def _rewards_array(rewards: Sequence[float | None]) -> np.ndarray:
    """float64 array with NaN for None; ValueError for anything else that is not a finite number."""
    out = np.empty(len(rewards), dtype=np.float64)
    for i, r in enumerate(rewards):
        if r is None:
            out[i] = np.nan
            continue
        if (
            isinstance(r, bool)
            or not isinstance(r, (int, float, np.integer, np.floating))
            or not math.isfinite(r)
        ):
            raise ValueError(f"reward {i} must be a finite number or None, got {r!r}")
        out[i] = float(r)
    return out


def reward_weights(rewards: Sequence[float | None]) -> np.ndarray:
    """Per-sample loss weights in [0, 1] (float64): rewards clipped to [-1, 1], min-max scaled.

    The lowest clipped reward gets 0 (the sample is ignored), the highest 1. When all rewards are
    equal (within 1e-6), or only one sample has one, every weight is 1.0. Samples whose reward
    is None get 1.0 and do not take part in the scaling.
    """
    r = _rewards_array(rewards)
    weights = np.ones(len(r), dtype=np.float64)
    rated = ~np.isnan(r)
    if not rated.any():
        return weights
    clipped = np.clip(r[rated], -1.0, 1.0)
    lo, hi = clipped.min(), clipped.max()
    if hi - lo > _FLAT:
        weights[rated] = (clipped - lo) / (hi - lo)
    return weights


def group_advantages(
    rewards: Sequence[float | None], groups: Sequence[Hashable], eps: float = 1e-6
) -> np.ndarray:
    """Per-sample advantage (float64): within each group, (r - mean) / (std + eps), population std.

    A group of one, or whose rewards are all equal, gives 0 to each member: no signal. A sample
    whose reward is None gets 0 and is left out of its group's mean and std.
    """
    if len(groups) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} groups")
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    r = _rewards_array(rewards)
    advantages = np.zeros(len(r), dtype=np.float64)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        if not np.isnan(r[i]):
            members.setdefault(g, []).append(i)
    for idx in members.values():
        x = r[idx]
        std = x.std()  # population std (ddof=0)
        if len(x) < 2 or std == 0.0:
            continue
        advantages[idx] = (x - x.mean()) / (std + eps)
    return advantages
