"""Every numeric setting of the engine in one table: what it accepts, checked in one place.

`RANGES` maps a setting's name to its `Range` (lowest and highest value, whether the lowest is
excluded, whole numbers or not, what special values mean). `check_number(name, value)` returns the
value or raises a `ConfigError` (or the error class a caller names) with one line that says what is
accepted: NaN, infinities, booleans, strings and numbers out of range are refused alike. The
training, sampling and reward configurations, the adapter scale of every forward pass, the CLI's
options and the app's settings (through those configurations) all go through it, so a value is
accepted or refused the same way wherever it is typed.

This module holds the table and the check only; it knows nothing of what the settings do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError


@dataclass(frozen=True)
class Range:
    """The values a numeric setting accepts."""

    lo: float  # lowest value
    hi: float  # highest value
    lo_open: bool = False  # the lowest value itself is refused
    integer: bool = False  # whole numbers only
    note: str = ""  # what special values mean, for messages: "0: off"

    def interval(self) -> str:
        if self.integer:
            return f"{int(self.lo)}..{int(self.hi)}"
        return f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"

    def describe(self) -> str:
        """What the setting accepts, for people: 'a finite number in (0, 10]'."""
        what = (
            f"a whole number in {self.interval()}"
            if self.integer
            else f"a finite number in {self.interval()}"
        )
        return what + (f" ({self.note})" if self.note else "")

    def accepts(self, value: object) -> bool:
        if isinstance(value, (bool, np.bool_)):
            return False
        if self.integer:
            if not isinstance(value, (int, np.integer)):
                return False
        elif not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(float(value)):
            return False
        v = value if self.integer else float(value)
        return (self.lo < v if self.lo_open else self.lo <= v) and v <= self.hi


RANGES: dict[str, Range] = {
    # the adapter (training and rewards)
    "rank": Range(1, 65536, integer=True),
    "alpha": Range(0.0, 1e6),
    # data
    "n_ctx": Range(2, 1 << 20, integer=True),  # a window holds a prompt token and one to learn
    "batch_size": Range(1, 1 << 16, integer=True),
    "grad_accum": Range(1, 1 << 16, integer=True),
    "epochs": Range(0.0, 1e6, lo_open=True),
    "steps": Range(0, 10**9, integer=True, note="0: from epochs"),
    "val_split": Range(0.0, 0.99),
    "seed": Range(0, 2**32 - 1, integer=True),
    # the optimizer
    "lr": Range(0.0, 10.0, lo_open=True),
    "warmup_steps": Range(0, 10**9, integer=True),
    "min_lr_ratio": Range(0.0, 1.0),
    "weight_decay": Range(0.0, 1e3),
    "gclip": Range(0.0, 1e9, note="0: off"),
    "max_grad_norm": Range(0.0, 1e9, note="0: off"),
    # rewards
    "kl_coef": Range(0.0, 1e3),
    # MoE: the load-balancing loss's weight
    "router_aux_coef": Range(0.0, 1e3, note="0: off"),
    # preference objectives
    "dpo_beta": Range(0.0, 1e3, lo_open=True),
    "orpo_lambda": Range(0.0, 1e3),
    "n_samples": Range(1, 1024, integer=True),
    # a run's rhythm
    "checkpoint_every": Range(0, 10**9, integer=True, note="0: at the end only"),
    "keep_checkpoints": Range(1, 10**6, integer=True),
    "sample_every": Range(0, 10**9, integer=True, note="0: off"),
    "sample_tokens": Range(1, 4096, integer=True),
    "sample_from_validation": Range(0, 1000, integer=True, note="0: none"),
    "eval_every": Range(0, 10**9, integer=True, note="0: at the end only"),
    "norms_every": Range(0, 10**9, integer=True),
    "rank_timeout_s": Range(0.0, 1e7, lo_open=True),  # a data-parallel rank's wait for the others
    # sampling
    "temperature": Range(0.0, 100.0, note="0: greedy"),
    "top_k": Range(0, 2**31 - 1, integer=True, note="0: off"),
    "top_p": Range(0.0, 1.0, lo_open=True, note="1: off"),
    "min_p": Range(0.0, 1.0, note="0: off"),
    "sampling_seed": Range(0, 2**63 - 1, integer=True),
    "max_new_tokens": Range(1, 1 << 20, integer=True),
    # an adapter's weight in a forward pass, a merge or the norms (llama.cpp's --lora-scaled)
    "adapter_scale": Range(-100.0, 100.0),
}


def check_number(name: str, value: object, *, label: str | None = None, error: type[Exception] = ConfigError):
    """`value` when RANGES[name] accepts it; else `error` saying, in one line, what `label` (the
    setting as the person typed it: "--lr", "learning rate"; default `name`) accepts."""
    rng = RANGES[name]
    if rng.accepts(value):
        return value
    label = label or name
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )
    if not number or (rng.integer and not isinstance(value, (int, np.integer))):
        raise error(f"{label} must be {rng.describe()}, got {value!r}")
    if not math.isfinite(float(value)):
        raise error(f"{label} must be {rng.describe()}, got {value!r}")
    note = f" ({rng.note})" if rng.note else ""
    raise error(f"{label} must be in {rng.interval()}{note}, got {value!r}")


__all__ = ["RANGES", "Range", "check_number"]
