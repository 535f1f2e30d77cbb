"""Unattended rounds of group-relative training, with rewards from checks (engine.train.reward_fns).

A round takes the next `prompts_per_round` prompts of a prompts dataset (all of them when 0; the
order shuffled by the seed, again after each pass), samples K answers to each with the adapter's
current weights (`RewardSession.sample`), scores every answer with the `Scorer`, and takes one
group-relative step on all of them (`RewardSession.apply_groups`: per prompt,
A = (r - mean) / (std + eps), so answers above their prompt's mean are pushed up and the others
down; every scored answer is appended to the ratings file first). After each round a `RoundReport`
says the mean and spread of the reward, the share of groups with no signal (all their answers scored
alike: nothing to learn from them), the loss, and a few example answers with their scores and
errors. `AutoRounds.run(on_event, should_stop, should_pause)` checks both between prompts and
rounds: a stop ends the rounds (the last finished round's step is kept), a pause returns and the
next `run` goes on with the next round.

Prompts datasets (`load_prompts`): a text file, one prompt per line; or JSON Lines with "prompt"
(a string) and what the checks need ("reference", "answer", ... and any other field, handed to a
user's function as **sample); or "messages" ending with a user turn (a system turn kept), or with an
assistant turn, which is then the reference; or prompt/response lines (the response is the
reference). Problems are by line.

What this module is not: it neither judges answers (reward_fns) nor trains (reward_session).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DatasetError
from .data import ERROR, WARNING, Problem, json_values
from .reward_fns import Scorer, reference_of
from .reward_session import RewardSession, ScoredGroup

_FLAT = 1e-6  # rewards within this of each other carry no signal (engine.train.rewards' rule)


@dataclass(frozen=True)
class PromptItem:
    """One prompt of a prompts dataset."""

    prompt: str  # the user message
    system: str | None  # a system message before it, or None
    sample: dict[str, Any]  # its line (the reference answer and other fields the checks may use)
    line: int  # 1-based line in the file (0 when made in memory)

    @property
    def reference(self) -> str | None:
        return reference_of(self.sample)


def prompt_from_json(obj: Any, line: int = 0) -> tuple[PromptItem | None, list[Problem]]:
    """A `PromptItem` of one decoded line, or None and why."""
    if not isinstance(obj, dict):
        return None, [Problem(line, 'expected a JSON object with a "prompt" (or "messages")', ERROR)]
    sample = dict(obj)
    if isinstance(obj.get("prompt"), str):
        prompt, system = obj["prompt"], obj.get("system") if isinstance(obj.get("system"), str) else None
    elif isinstance(obj.get("messages"), list) and obj["messages"]:
        msgs = obj["messages"]
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
            return None, [Problem(line, '"messages" must be a list of {"role", "content"} objects', ERROR)]
        if msgs[-1].get("role") == "assistant":
            sample.setdefault("reference", msgs[-1]["content"])
            msgs = msgs[:-1]
        users = [m for m in msgs if m.get("role") == "user"]
        if not users or msgs[-1].get("role") != "user":
            return None, [Problem(line, '"messages" must end with a user turn (or a user turn and its '
                                        "reference answer)", ERROR)]  # fmt: skip
        prompt = msgs[-1]["content"]
        system = next((m["content"] for m in msgs if m.get("role") == "system"), None)
    else:
        return None, [Problem(line, 'no prompt: a line needs "prompt" (a string) or "messages" ending with '
                                    "a user turn", ERROR)]  # fmt: skip
    if not prompt.strip():
        return None, [Problem(line, "the prompt is empty", ERROR)]
    return PromptItem(prompt, system, sample, line), []


def load_prompts(path: str) -> tuple[list[PromptItem], list[Problem]]:
    """The prompts of a text or JSON Lines file and the problems found (DatasetError when it cannot
    be read at all). A file whose first non-blank line starts with "{" is JSON Lines."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: the prompts file cannot be read ({exc})") from exc
    lines = text.split("\n")
    first = next((s.strip() for s in lines if s.strip()), "")
    items: list[PromptItem] = []
    problems: list[Problem] = []
    json_lines = first.startswith("{") or str(path).endswith((".jsonl", ".json"))
    if not json_lines:
        items = [PromptItem(s.strip(), None, {}, number) for number, s in enumerate(lines, 1) if s.strip()]
    else:
        for number, obj in json_values(lines, problems):
            item, found = prompt_from_json(obj, number)
            problems.extend(found)
            if item is not None:
                items.append(item)
    if not items:
        why = f"; the first problem: {problems[0]}" if problems else ""
        raise DatasetError(f"{path}: no prompt in the file{why}")
    return items, problems


def missing_references(items: Sequence[PromptItem], scorer: Scorer) -> list[Problem]:
    """A warning per prompt that has no reference while a check needs one (its answers will fail)."""
    if not scorer.needs_reference:
        return []
    return [Problem(it.line, "no reference answer, which a chosen check needs: its answers are left out",
                    WARNING) for it in items if it.reference is None]  # fmt: skip


@dataclass(frozen=True)
class RoundsConfig:
    """How unattended rounds go (sampling and the step are the session's RewardConfig)."""

    rounds: int = 10  # rounds to run
    prompts_per_round: int = 8  # prompts a round samples answers for; 0 = all of them
    seed: int = 0  # the order of the prompts, and the sampling seeds
    examples: int = 4  # example answers a report keeps

    def __post_init__(self) -> None:
        for name, low in (("rounds", 1), ("prompts_per_round", 0), ("examples", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise DatasetError(f"{name} must be a whole number >= {low}, got {value!r}")


@dataclass(frozen=True)
class Example:
    """One answer of a round, as the report shows it."""

    prompt: str
    answer: str
    reward: float | None  # None: a check failed
    parts: dict[str, float | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundProgress:
    """A round is sampling: prompt `index` (1-based) of `n_prompts`."""

    round: int
    rounds: int
    index: int
    n_prompts: int


@dataclass(frozen=True)
class RoundReport:
    """What one unattended round did."""

    round: int  # 1-based, over all runs of these rounds
    rounds: int  # rounds planned
    step: int  # the session's optimizer steps after this round
    mean: float  # mean reward of the scored answers (nan when none scored)
    std: float  # their spread (population std)
    no_signal: float  # share of the prompts whose answers all scored alike (or fewer than two scored)
    n_groups: int  # prompts sampled
    n_answers: int  # answers sampled
    n_errors: int  # answers left out: a check failed
    loss: float  # the objective before the step; nan when no step was taken
    applied: bool  # a step was taken
    examples: tuple[Example, ...]  # a few answers, the best and the worst first
    seconds: float  # time the round took
    error_examples: tuple[Example, ...] = ()  # answers whose checks failed (at most `examples`)


class AutoRounds:
    """N rounds of sample, score, step on a reward session (see the module docstring)."""

    def __init__(
        self, session: RewardSession, prompts: Sequence[PromptItem], scorer: Scorer, config: RoundsConfig
    ):
        if not prompts:
            raise DatasetError("unattended rounds need at least one prompt")
        self.session = session
        self.prompts = list(prompts)
        self.scorer = scorer
        self.config = config
        self.done = 0  # rounds finished
        self.reports: list[RoundReport] = []
        self.stopped = False
        self._rng = np.random.default_rng(config.seed)
        self._order: list[int] = []

    @property
    def finished(self) -> bool:
        return self.stopped or self.done >= self.config.rounds

    def _next_prompts(self) -> list[PromptItem]:
        k = self.config.prompts_per_round or len(self.prompts)
        out = []
        while len(out) < min(k, len(self.prompts)):
            if not self._order:
                self._order = self._rng.permutation(len(self.prompts)).tolist()
            out.append(self.prompts[self._order.pop(0)])
        return out

    def run(
        self,
        on_event: Callable[[object], None] = lambda e: None,
        should_stop: Callable[[], bool] = lambda: False,
        should_pause: Callable[[], bool] = lambda: False,
    ) -> list[RoundReport]:
        """Run the rounds left (or until a stop or a pause); the reports of this call."""
        made = []
        while not self.finished:
            if should_stop():
                self.stopped = True
                break
            if should_pause():
                break
            report = self.round(on_event, should_stop)
            if report is None:  # stopped while sampling: that round takes no step
                self.stopped = True
                break
            made.append(report)
            on_event(report)
        return made

    def round(self, on_event=lambda e: None, should_stop=lambda: False) -> RoundReport | None:
        """One round; None when `should_stop` ended it before its step."""
        t0 = time.perf_counter()
        cfg, s = self.config, self.session
        number = self.done + 1
        items = self._next_prompts()
        groups: list[ScoredGroup] = []
        scored: list[list[tuple[str, Any]]] = []
        for i, item in enumerate(items, start=1):
            on_event(RoundProgress(number, cfg.rounds, i, len(items)))
            seed = int(self._rng.integers(2**31))
            answers = s.sample(item.prompt, system=item.system, seed=seed, should_stop=should_stop)
            if should_stop():
                return None
            results = [(a.text, self.scorer.score(item.prompt, a.text, item.sample)) for a in answers]
            scored.append([(item.prompt, r) for r in results])
            groups.append(ScoredGroup(item.prompt, item.system,
                                      tuple((text, sc.total, sc.parts) for text, sc in results)))  # fmt: skip
        result = s.apply_groups(groups)
        report = self._report(number, result, groups, scored, time.perf_counter() - t0)
        self.done = number
        self.reports.append(report)
        return report

    def _report(self, number, result, groups, scored, seconds) -> RoundReport:
        rewards = [r for g in groups for _, r, _ in g.answers if r is not None]
        flat = 0
        for g in groups:
            rs = [r for _, r, _ in g.answers if r is not None]
            if len(rs) < 2 or max(rs) - min(rs) <= _FLAT:
                flat += 1
        examples = [
            Example(prompt, text, sc.total, dict(sc.parts), dict(sc.errors))
            for group in scored
            for prompt, (text, sc) in group
        ]
        ok = sorted((e for e in examples if e.reward is not None), key=lambda e: -e.reward)
        k = self.config.examples
        shown = ok[: (k + 1) // 2] + ok[len(ok) - k // 2 :] if len(ok) > k else ok
        failed = [e for e in examples if e.reward is None]
        return RoundReport(
            number, self.config.rounds, result.step,
            float(np.mean(rewards)) if rewards else math.nan, float(np.std(rewards)) if rewards else math.nan,
            flat / len(groups), len(groups), len(examples), len(failed), result.loss, result.applied,
            tuple(shown), seconds, tuple(failed[:k]),
        )  # fmt: skip


def round_table(reports: Sequence[RoundReport]) -> str:
    """The reports as a plain text table (the CLI prints it; bench scripts too)."""
    rows = ["round  mean reward  spread  no signal  answers  errors  loss     step"]
    for r in reports:
        loss = f"{r.loss:.4f}" if math.isfinite(r.loss) else "no step"
        rows.append(f"{r.round:>5}  {r.mean:>11.3f}  {r.std:>6.3f}  {r.no_signal:>9.0%}  {r.n_answers:>7}  "
                    f"{r.n_errors:>6}  {loss:<7}  {r.step:>4}")  # fmt: skip
    return "\n".join(rows)


__all__ = [
    "AutoRounds", "Example", "load_prompts", "missing_references", "prompt_from_json", "PromptItem",
    "round_table", "RoundProgress", "RoundReport", "RoundsConfig",
]  # fmt: skip
