"""A person's ratings of answers: stars and rewards as typed, the ratings file read back and appended.

A rating is a reward in [-1, 1] (`parse_rating` reads what a person types, `rating_from_stars` maps
1-5 stars). A reward session (engine.train.reward_session) appends one JSON line per rating to its
ratings file (`append_ratings`, flushed to disk); `load_ratings` reads the file back as a dataset,
re-ratings resolved (the later line wins).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EngineError
from ..io.files import durable_append
from .data import Problem, Sample, load_jsonl

_STARS = re.compile(r"[1-5]")


class RewardError(EngineError):
    """A reward session cannot do what was asked: nothing rated, a bad rating or setting, a file."""


def rating_from_stars(stars: int) -> float:
    """1..5 stars -> -1, -0.5, 0, 0.5, 1."""
    if isinstance(stars, bool) or not isinstance(stars, (int, np.integer)) or not 1 <= stars <= 5:
        raise ValueError(f"stars must be an integer from 1 to 5, got {stars!r}")
    return (int(stars) - 3) / 2.0


_ACCEPTED = (
    "accepted: 1-5 stars (1 = worst, 5 = best), a reward from -1 to 1 such as -0.5, 0.25 or +1, "
    "or s / skip / an empty line to skip"
)


def parse_rating(text: str) -> float | None:
    """A rating typed by a person: a reward in [-1, 1], or None for a skip.

    "s", "skip" or an empty line skip. A bare integer 1..5 is a number of stars (`rating_from_stars`):
    note that a bare "1" therefore means one star, -1.0; write "1.0" or "+1" for the top reward.
    Anything else is read as a reward and must lie in [-1, 1] ("0", "-1", "0.5", "+1", "-0.25").
    ValueError, with what is accepted, for anything else.
    """
    s = text.strip()
    if s.lower() in ("", "s", "skip"):
        return None
    if _STARS.fullmatch(s):
        return rating_from_stars(int(s))
    try:
        value = float(s)
    except ValueError:
        raise ValueError(f"{s!r} is not a rating; {_ACCEPTED}") from None
    if not math.isfinite(value) or not -1.0 <= value <= 1.0:
        raise ValueError(f"{s!r} is outside [-1, 1]; {_ACCEPTED}")
    return value + 0.0  # -0.0 -> 0.0


def load_ratings(path: str | os.PathLike[str]) -> tuple[list[Sample], list[Problem]]:
    """A ratings file as a dataset, with re-ratings resolved: the later line wins.

    Lines written by a reward session carry "session", "round" and "answer"; of several lines with
    the same three (and the same "corrected"), only the last is kept. Other lines are kept as they
    are. Problems are `load_jsonl`'s.
    """
    samples, problems = load_jsonl(path)
    lines = Path(path).read_text(encoding="utf-8-sig").split("\n")
    keys: list[tuple | None] = []
    for s in samples:
        obj = json.loads(lines[s.line - 1])
        if all(k in obj for k in ("session", "round", "answer")):
            keys.append((obj["session"], obj["round"], obj["answer"], bool(obj.get("corrected"))))
        else:
            keys.append(None)
    last = {k: i for i, k in enumerate(keys) if k is not None}
    kept = [s for i, (s, k) in enumerate(zip(samples, keys, strict=True)) if k is None or last[k] == i]
    return kept, problems


def append_ratings(path: str, record: dict[str, Any] | list[dict[str, Any]]) -> None:
    """Append one JSON line (or several, with one flush) and flush it to disk (as
    `engine.data.append_jsonl`, with extra keys)."""
    try:
        records = record if isinstance(record, list) else [record]
        line = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records)
    except (TypeError, ValueError) as exc:
        raise RewardError(f"the rating cannot be written as JSON: {exc}") from exc
    try:
        durable_append(path, line.encode("utf-8"))
    except OSError as exc:
        raise RewardError(f"{path}: the rating cannot be saved ({exc.strerror or exc})") from exc


__all__ = ["RewardError", "append_ratings", "load_ratings", "parse_rating", "rating_from_stars"]
