"""Rewards computed by checks instead of a person: built-in checks and a user's own Python function.

A check scores one answer to one prompt; the prompt's line of the prompts dataset (`sample`) holds
what a check may need, such as the reference answer ("reference", else "answer", "solution",
"ground_truth" or "response"). Built-in checks (`CheckSpec.parse` reads them as text, with an
optional weight after "@"):

    exact[:i]            1 when the answer equals the reference (whitespace collapsed; ":i" ignores case)
    contains[:i]         1 when the reference occurs in the answer
    regex:PATTERN        1 when PATTERN (Python `re` syntax) is found in the answer
    number[:TOL]         1 when the last number in the answer is within TOL (default 1e-6; "1%" relative)
                         of the last number in the reference
    json                 1 when the answer is valid JSON (a fenced ```json block counts)
    length:MIN-MAX       1 when the answer has MIN to MAX characters (either bound may be left out)
    PATH.py              the file's `def reward(prompt, answer, **sample) -> float`, where sample is
                         the prompt's line without "prompt" and "answer", and `reference` its reference

e.g. "exact@2", "regex:^[0-9]+$@0.5", "my_checks.py". A user's file is run (imported) only when a
`Scorer` is built with it, that is when the person picks it; it runs with the person's rights, like
any script they start. An exception in a check, or a value that is not a finite number, is an
error of that answer (`Score.errors`, one line each, shown to the person), and the answer is left out of
its group: it gets no advantage, rather than a reward it did not earn.

`Scorer(specs, rating_weight)` combines the checks: the reward of an answer is sum_k w_k check_k,
plus `rating_weight` x the person's rating when there is one (`Scorer.combine`): a person rating
answers on the Rewards page stays one more source beside the checks.

What this module is not: it samples and trains nothing (engine.train.rounds, reward_session).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import re
import sys
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import EngineError

REFERENCE_KEYS = ("reference", "answer", "solution", "ground_truth", "response")
BUILTINS = ("exact", "contains", "regex", "number", "json", "length")
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n\s*```", re.S)
_WEIGHT = re.compile(r"@([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)$")


class CheckError(EngineError):
    """A check cannot be built: an unknown name, a bad pattern or bound, a file without `reward`."""


@dataclass(frozen=True)
class CheckSpec:
    """One check and its weight (see the module docstring for the names)."""

    name: str  # one of BUILTINS, or "python"
    arg: str = ""  # the pattern, tolerance, bounds, ":i", or the Python file's path
    weight: float = 1.0  # its share of the reward

    @classmethod
    def parse(cls, text: str) -> CheckSpec:
        """ "exact", "regex:PATTERN@0.5", "number:0.01", "length:10-200", "checks.py@2", ..."""
        s = text.strip()
        weight = 1.0
        m = _WEIGHT.search(s)  # the last "@NUMBER" (a pattern ending in one needs a weight after it)
        if m:
            weight, s = float(m.group(1)), s[: m.start()]
        if s.lower().endswith(".py"):
            return cls("python", s, weight)
        name, _, arg = s.partition(":")
        name = name.strip().lower()
        if name not in BUILTINS:
            raise CheckError(
                f"unknown check {text!r}: use one of {', '.join(BUILTINS)} (e.g. exact, regex:PATTERN, "
                "number:0.01, length:10-200) or the path of a Python file with def reward(prompt, answer, "
                "**sample), each optionally followed by @WEIGHT"
            )
        return cls(name, arg, weight)

    @property
    def label(self) -> str:
        """How the check is named in tables: "exact", "regex:^\\d+$", "checks.py"."""
        if self.name == "python":
            return os.path.basename(self.arg)
        return f"{self.name}:{self.arg}" if self.arg else self.name

    def to_text(self) -> str:
        """What `parse` reads back."""
        base = self.arg if self.name == "python" else self.label
        return base if self.weight == 1.0 else f"{base}@{self.weight:g}"


def reference_of(sample: Mapping[str, Any]) -> str | None:
    """The reference answer a prompt's line gives, or None."""
    for key in REFERENCE_KEYS:
        value = sample.get(key)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    return None


def _need_reference(sample: Mapping[str, Any]) -> str:
    ref = reference_of(sample)
    if ref is None:
        keys = ", ".join(f'"{k}"' for k in REFERENCE_KEYS)
        raise ValueError(f"this prompt has no reference answer (a {keys} field of its line)")
    return ref


def _norm(text: str, fold: bool) -> str:
    text = " ".join(str(text).split())
    return text.casefold() if fold else text


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    for raw in reversed(found):
        try:
            return float(raw.replace(",", ""))
        except ValueError:
            continue
    return None


def _flag(arg: str, name: str) -> bool:
    if arg.strip().lower() in ("", "i"):
        return arg.strip().lower() == "i"
    raise CheckError(f'{name}: the only option is ":i" (ignore case), got {arg!r}')


def _builtin(spec: CheckSpec) -> Callable[[str, str, Mapping[str, Any]], float]:
    """The function of a built-in check (CheckError when its argument is not valid)."""
    name, arg = spec.name, spec.arg
    if name == "exact":
        fold = _flag(arg, name)
        return lambda prompt, answer, sample: float(
            _norm(answer, fold) == _norm(_need_reference(sample), fold)
        )
    if name == "contains":
        fold = _flag(arg, name)
        return lambda prompt, answer, sample: float(
            _norm(_need_reference(sample), fold) in _norm(answer, fold)
        )
    if name == "regex":
        if not arg:
            raise CheckError("regex needs a pattern: regex:PATTERN")
        try:
            pattern = re.compile(arg)
        except re.error as exc:
            raise CheckError(f"regex:{arg}: not a valid pattern ({exc})") from exc
        return lambda prompt, answer, sample: float(pattern.search(answer) is not None)
    if name == "number":
        text = arg.strip() or "1e-6"
        relative = text.endswith("%")
        try:
            tol = float(text[:-1] if relative else text) / (100.0 if relative else 1.0)
        except ValueError:
            raise CheckError(f"number:{arg}: the tolerance must be a number such as 0.01 or 1%") from None
        if not (math.isfinite(tol) and tol >= 0):
            raise CheckError(f"number:{arg}: the tolerance must be a finite number >= 0")

        def number(prompt: str, answer: str, sample: Mapping[str, Any]) -> float:
            want = _last_number(_need_reference(sample))
            if want is None:
                raise ValueError(f"the reference {reference_of(sample)!r} holds no number")
            got = _last_number(answer)
            bound = tol * abs(want) if relative else tol
            return float(got is not None and abs(got - want) <= bound)

        return number
    if name == "json":
        if arg:
            raise CheckError(f"json takes no option, got {arg!r}")

        def valid_json(prompt: str, answer: str, sample: Mapping[str, Any]) -> float:
            fenced = _FENCE.search(answer)
            for text in (answer, fenced.group(1) if fenced else None):
                if text is None:
                    continue
                try:
                    json.loads(text)
                    return 1.0
                except ValueError:
                    continue
            return 0.0

        return valid_json
    # length
    lo_text, sep, hi_text = arg.partition("-")
    try:
        lo = int(lo_text) if lo_text.strip() else 0
        hi = int(hi_text) if hi_text.strip() else None
    except ValueError:
        lo = hi = -1
    if not sep or lo < 0 or (hi is not None and hi < lo):
        raise CheckError(
            f"length:{arg}: give the bounds in characters as MIN-MAX, MIN- or -MAX (e.g. 10-200)"
        )
    return lambda prompt, answer, sample: float(
        len(answer.strip()) >= lo and (hi is None or len(answer.strip()) <= hi)
    )


def load_reward_file(path: str) -> Callable[..., Any]:
    """The `reward` function of a Python file, run now (CheckError, with the line, when it cannot be)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckError(f"{path}: no such Python file")
    name = f"tune_studio_reward_{uuid.uuid4().hex[:8]}"
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise CheckError(f"{path}: cannot be loaded as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(name, None)
    except CheckError:
        raise
    except BaseException as exc:  # noqa: BLE001 - a user's file may raise anything, SystemExit included
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise CheckError(f"{path}: the file fails when it is loaded: {_one_line(exc, path)}") from exc
    fn = getattr(module, "reward", None)
    if not callable(fn):
        raise CheckError(f"{path}: defines no function reward(prompt, answer, **sample) -> float")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_rest = any(p.kind == p.VAR_POSITIONAL for p in params)
    if len(positional) < 2 and not takes_rest:
        raise CheckError(
            f"{path}: reward must take (prompt, answer, **sample), it takes {len(positional)} arguments"
        )
    return fn


def _one_line(exc: BaseException, path: str | None = None) -> str:
    """ "ZeroDivisionError: division by zero (checks.py line 5)": the exception and, for a user's file,
    the innermost line of that file."""
    where = ""
    if path is not None:
        frames = [
            f
            for f in traceback.extract_tb(exc.__traceback__)
            if os.path.abspath(f.filename) == os.path.abspath(path)
        ]
        if frames:
            where = f" ({os.path.basename(path)} line {frames[-1].lineno})"
        elif isinstance(exc, SyntaxError) and exc.lineno:
            where = f" ({os.path.basename(path)} line {exc.lineno})"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}{': ' + text if text else ''}{where}"


@dataclass(frozen=True)
class Score:
    """One answer's reward from the checks."""

    total: float | None  # sum of weight x value; None when a check failed (the answer is left out)
    parts: dict[str, float | None] = field(default_factory=dict)  # check label -> its value (None: error)
    errors: dict[str, str] = field(default_factory=dict)  # check label -> what went wrong, one line

    @property
    def ok(self) -> bool:
        return self.total is not None


class Scorer:
    """Checks with weights, and the weight of a person's rating beside them (module docstring)."""

    def __init__(self, specs: Sequence[CheckSpec | str], rating_weight: float = 0.0):
        self.specs = tuple(CheckSpec.parse(s) if isinstance(s, str) else s for s in specs)
        if not self.specs:
            raise CheckError(
                "no check chosen: pick at least one (exact, contains, regex, number, json, length, or your "
                "own Python file)"
            )
        for s in self.specs:
            if not (isinstance(s.weight, (int, float)) and math.isfinite(s.weight)):
                raise CheckError(f"{s.label}: the weight must be a finite number, got {s.weight!r}")
        if not math.isfinite(rating_weight) or rating_weight < 0:
            raise CheckError(f"the rating's weight must be a finite number >= 0, got {rating_weight!r}")
        self.rating_weight = float(rating_weight)
        self._fns = []
        labels = []
        for s in self.specs:
            fn = load_reward_file(s.arg) if s.name == "python" else _builtin(s)
            self._fns.append((s, fn))
            label = s.label
            while label in labels:  # two checks with the same name stay apart in tables
                label += "'"
            labels.append(label)
        self.labels = tuple(labels)

    @property
    def needs_reference(self) -> bool:
        return any(s.name in ("exact", "contains", "number") for s in self.specs)

    def describe(self) -> str:
        parts = [s.label if s.weight == 1.0 else f"{s.weight:g} x {s.label}" for s in self.specs]
        return " + ".join(parts)

    def score(self, prompt: str, answer: str, sample: Mapping[str, Any] | None = None) -> Score:
        """The answer's reward and each check's value; a failing check is an error, never a crash."""
        sample = dict(sample or {})
        parts: dict[str, float | None] = {}
        errors: dict[str, str] = {}
        total = 0.0
        for label, (spec, fn) in zip(self.labels, self._fns, strict=True):
            try:
                if spec.name == "python":
                    extra = {k: v for k, v in sample.items() if k not in ("prompt", "answer")}
                    extra.setdefault("reference", reference_of(sample))
                    value = fn(prompt, answer, **extra)
                else:
                    value = fn(prompt, answer, sample)
                if isinstance(value, bool):
                    value = float(value)
                if not isinstance(value, (int, float)) or not math.isfinite(float(value)):
                    raise ValueError(f"returned {value!r}, not a finite number")
                parts[label] = float(value)
                total += spec.weight * float(value)
            except Exception as exc:  # noqa: BLE001 - a check's failure is shown with its answer
                parts[label] = None
                if spec.name == "python":
                    errors[label] = _one_line(exc, spec.arg)
                else:  # a built-in's own words
                    errors[label] = str(exc) if isinstance(exc, ValueError) else _one_line(exc)
        return Score(None if errors else total, parts, errors)

    def combine(self, score: Score | None, rating: float | None) -> float | None:
        """The reward of an answer from its checks and the person's rating (None: left out)."""
        if score is None:
            return rating
        if score.total is None:
            return None
        if rating is None or not self.rating_weight:
            return score.total
        return score.total + self.rating_weight * rating


def parse_checks(texts: Sequence[str]) -> list[CheckSpec]:
    """CheckSpecs of several texts (CheckError naming the first that is not understood)."""
    return [CheckSpec.parse(t) for t in texts]


__all__ = [
    "BUILTINS", "CheckError", "CheckSpec", "load_reward_file", "parse_checks", "REFERENCE_KEYS",
    "reference_of", "Score", "Scorer",
]  # fmt: skip
