"""The Rewards page's decisions and state, in plain Python without Qt.

`RewardsController` holds the rating session the page works with and what it was made from: the model,
the adapter it continued (`session_start`), the adapter the next session continues
(`start_adapter`) and a ratings file the person chose. It says where ratings and checkpoints go,
what a change of the adapter to continue means (`start_change`), whether a ratings file can be
written, what the adapter box says, and it makes the engine jobs that open the session when there is
none yet (`session_job`).

The functions say what the page's controls offer while a job runs (`controls`), what a failure, a
generated round or an applied step says, why Apply cannot run yet (`apply_problem`), and how a
round's answers are shown again (`round_cards`, `same_answers`).

The page (studio.pages.rewards.page) lays the widgets out and wires them to these.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from engine import EngineError, RoundResult, check_outputs

from ...paths import same_file, writable_problem
from ..generation import describe

RATINGS_FILE = "ratings.jsonl"
NEW_ADAPTER = "new"  # the adapter list's "A new adapter" entry
NEW_ADAPTER_TEXT = "A new adapter"
CHECKPOINT_FOLDER = "reward-checkpoints"
BUSY_TEXT = {
    "loading": "Loading the model…",
    "generating": "Generating…",
    "applying": "Applying the step…",
    "comparing": "Comparing…",
    "saving": "Saving the adapter…",
    "rounds": "Running unattended rounds…",
    "scoring": "Scoring the answers with checks…",
}
STREAMING = ("loading", "generating")  # the jobs Stop ends and whose tokens stream into the cards
# a failed job: (what could not be done, what to do next)
FAILED = {
    "loading": ("load the model", "Check the model on the Model page (and the adapter you chose to start "
                "from), then press Generate again."),
    "generating": ("generate answers", "Check the prompt and the sampling settings, then press Generate "
                   "again."),
    "applying": ("apply the step", "Rate the answers (or write a better one) and press Apply again; if the "
                 "loss is not finite, lower the learning rate."),
    "comparing": ("compare the answers", "Check the prompt, then press Compare again."),
    "saving": ("save the adapter", "Choose another file name or folder with Save adapter…."),
}  # fmt: skip


def short(path: str) -> str:
    """A start adapter as people read it: the file, or "folder/adapter.gguf" for a checkpoint's."""
    path = os.path.normpath(path)
    name = os.path.basename(path)
    return f"{os.path.basename(os.path.dirname(path))}/{name}" if name == "adapter.gguf" else name


def busy_text(kind: str) -> str:
    return BUSY_TEXT.get(kind, kind)


def job_name(kind: str) -> str:
    """The engine job's name for a task ("generating", ...)."""
    return busy_text(kind).rstrip("…").lower()


def failure_text(kind: str, message: str) -> str:
    """The banner of a job of `kind` that failed with `message`, with what to do next."""
    verb, what_next = FAILED.get(kind, (kind, ""))
    return f"Could not {verb}: {message}. {what_next}"


@dataclass(frozen=True)
class Controls:
    """What the page's controls offer while the page is `busy` ("" when idle)."""

    idle: bool  # Generate, From dataset…, the settings, Compare, the cards, the adapter list
    stop: bool  # Stop: a generation (or the load before it) is running
    session: bool  # Save adapter… and New adapter: a session is going on
    apply: bool  # Apply step: an unapplied round with answers


def controls(busy: str, has_session: bool, pending: bool) -> Controls:
    """`pending`: the shown round has answers and was not applied (see `round_pending`)."""
    idle = not busy
    return Controls(idle, busy in STREAMING, idle and has_session, idle and has_session and pending)


def round_pending(n_cards: int, locked: Sequence[bool]) -> bool:
    """The shown round can still be applied: it has answers and none is locked."""
    return n_cards > 0 and not any(locked)


@dataclass(frozen=True)
class Problem:
    """Why a click cannot do what it asks: the banner's text and level, and whether the focus goes to
    the first answer card (to rate it)."""

    text: str
    level: str = "error"
    focus_cards: bool = False


def apply_problem(
    has_session: bool, states: Sequence[str], corrected: Sequence[bool], locked: Sequence[bool], scored: bool
) -> Problem | None:
    """Why Apply cannot take a step on the shown round; None when it can. states: each card's
    "rated", "unrated" or "skipped"; corrected: each card has a better answer; scored: the checks
    scored an answer."""
    if not has_session or not states:
        return Problem(
            "There are no answers to train on: generate answers to a prompt, rate them, then press Apply."
        )
    if any(locked):
        return Problem("This round was applied already: press Generate for new answers.", "info")
    if not scored and not any(s == "rated" or c for s, c in zip(states, corrected, strict=False)):
        return Problem(
            "Nothing is rated yet, so there is nothing to learn from. Rate the answers first: focus a card "
            "and press 1–5 (or use the thumbs or the slider), or write a better answer with Edit…; then "
            "press Apply.",
            focus_cards=True,
        )
    return None


def generated_status(round_: int, n: int, seed: int) -> str:
    return f"Round {round_}: {n} answers (seed {seed}). Rate them, then Apply."


def applied_status(result: RoundResult) -> tuple[str, str | None]:
    """The status line of an applied round, and the warning to show (None: none)."""
    if result.applied:
        loss = f"{result.loss:.4f}" if math.isfinite(result.loss) else "–"
        return (f"Round {result.round} applied: step {result.step}, loss {loss}. Generate again for the next "
                "round.", None)  # fmt: skip
    return (
        f"Round {result.round}: the ratings carried no signal, no step was taken.",
        "No step was taken: all ratings were equal, so there was nothing to learn. Next time rate better "
        "answers higher than worse ones.",
    )


@dataclass(frozen=True)
class CardState:
    """How an answer of the session's own round is shown again (after a failed Generate)."""

    rating: float | None
    corrected: str | None
    locked: bool  # the round was applied


def round_cards(answers: Sequence, session) -> list[CardState] | None:
    """The ratings, better answers and lock of `answers` when they are the session's round (shown
    again after a failed Generate); None for new answers."""
    if session is None or not answers or list(answers) != list(session.answers):
        return None
    corrections = getattr(session, "corrections", {})
    applied = bool(session.history) and session.history[-1].round == session.round
    return [
        CardState(r, corrections.get(a.index), applied)
        for a, r in zip(answers, session.ratings, strict=False)
    ]


def same_answers(answers: Sequence[tuple[int, str]]) -> list[list[int]]:
    """(index, text) of each answer, grouped by the text (stripped): the indexes of each text."""
    groups: dict[str, list[int]] = {}
    for index, text in answers:
        groups.setdefault(text.strip(), []).append(index)
    return list(groups.values())


def start_path(data: object, run) -> str | None:
    """The adapter an entry of the list continues (`run`: the entry's run, None for a file): a
    reward-tuned run goes on from its last checkpoint folder (its exact state), other runs and files
    from their adapter file; None for a new adapter."""
    if data in (None, NEW_ADAPTER):
        return None
    if (
        run is not None
        and run.kind == "rewards"
        and run.last_checkpoint
        and os.path.isdir(run.last_checkpoint)
    ):
        return run.last_checkpoint
    return str(data)


def start_entry(path: str | None, runs: Sequence) -> str:
    """The list entry of a start adapter (a reward checkpoint folder is listed as its run)."""
    if path is None:
        return NEW_ADAPTER
    for r in runs:
        if r.last_checkpoint and same_file(r.last_checkpoint, path):
            return r.adapter
    return path


class StartChange(Enum):
    """What choosing another adapter to continue means (`RewardsController.start_change`)."""

    SAME = "same"  # it is the one already: show the paths again
    KEEP = "keep"  # the session keeps its adapter: show it in the list again
    ASK = "ask"  # the session took steps: ask before forgetting them
    DROP = "drop"  # continue the new one: the session going on ends
    SET = "set"  # no session: the next one continues the new one


class RewardsController:
    """The rating session and what it was made from; see the module docstring."""

    def __init__(self) -> None:
        self.session = None  # engine RewardSession, made by the first task that needs it
        self.session_model: str | None = None  # model path the session was made with
        self.start_adapter: str | None = None  # adapter file or checkpoint folder to continue
        self.session_start: str | None = None  # the one the current session continued
        self.custom_ratings_path: str | None = None  # chosen with Ratings file…; None = default

    def ratings_path(self, output_folder: str) -> str:
        return self.custom_ratings_path or os.path.join(output_folder, RATINGS_FILE)

    def checkpoint_dir(self, output_folder: str) -> str:
        return os.path.join(
            os.path.dirname(os.path.abspath(self.ratings_path(output_folder))), CHECKPOINT_FOLDER
        )

    def adopt(self, session, model: str | None) -> bool:
        """The session a task made becomes the page's (unless it has one); True when it did."""
        if self.session is not None:
            return False
        self.session, self.session_model = session, model
        self.session_start = self.start_adapter
        return True

    def drop(self) -> None:
        self.session = self.session_model = self.session_start = None

    def start_change(self, path: str | None, chosen: bool, busy: bool) -> StartChange:
        """The person (`chosen`; else a refresh of the list) picked `path` to continue (None: new)."""
        if path == self.start_adapter:
            return StartChange.SAME
        if self.session is None:
            return StartChange.SET
        if not chosen or busy:  # a refresh: the session keeps its adapter
            return StartChange.KEEP
        return StartChange.ASK if self.session.step else StartChange.DROP

    def forget_question(self, other: str) -> str:
        """The question before the session's steps are forgotten for `other` (an adapter, in words)."""
        return (f"Forget the {self.session.step} step(s) trained on this page and continue {other} instead? "
                "(Save adapter… keeps them.)")  # fmt: skip

    def adapter_text(self, rank: int, alpha: float, targets: str) -> str:
        """What the adapter box says (HTML): the steps of the session, or what the next one continues."""
        s = self.session
        if s is not None:
            what = f"Optimizer steps taken on this page from your ratings: <b>{s.step}</b>"
            if self.session_start:
                return what + f" (continuing {html.escape(short(self.session_start))})"
            return what + " (a new adapter)"
        if self.start_adapter:
            return f"The next Generate continues <b>{html.escape(short(self.start_adapter))}</b>"
        return f"A new adapter (rank {rank}, alpha {alpha:g}, targets: {targets})"

    def new_session_problem(self, output_folder: str) -> str | None:
        """Why a session made now could not write its ratings file (the banner's text); None when it can
        or a session is going on already."""
        if self.session is not None:
            return None
        path = self.ratings_path(output_folder)
        why = writable_problem(os.path.dirname(os.path.abspath(path)))
        if why is None:
            return None
        return (f"The ratings file {path} cannot be written ({why}). Choose another with Ratings file…, or "
                "another output folder on the Train page.")  # fmt: skip

    def ratings_problem(self, path: str, inputs: dict[str, str | None]) -> str | None:
        """Why ratings cannot be appended to `path` (never one of the files the page reads: `inputs`,
        the session's, the adapter it continues); None when they can (the file is made if missing)."""
        inputs = {**inputs, "adapter to continue": self.start_adapter}
        try:
            if self.session is not None:
                inputs.update(self.session.inputs)
            check_outputs({"ratings file": path}, inputs)
            why = writable_problem(os.path.dirname(path))
        except EngineError as exc:
            why = str(exc)
        if why is None:
            try:
                with open(path, "ab"):
                    pass
            except (OSError, ValueError) as exc:
                why = getattr(exc, "strerror", None) or str(exc)
        return why

    def session_maker(self, project_config, config, output_folder: str, template) -> Callable:
        """A function for the engine worker that makes the rating session, with everything read now:
        the adapter to continue, the project's targets, rank, alpha and seed (`project_config`), the
        form's RewardConfig, the ratings file and checkpoint folder, the chat template (None: the
        model's)."""
        c = project_config
        kwargs = dict(
            adapter=self.start_adapter,
            targets=c.targets,
            rank=c.rank,
            alpha=c.alpha,
            config=config,
            ratings_path=self.ratings_path(output_folder),
            checkpoint_dir=self.checkpoint_dir(output_folder),
            template=template,
            seed=c.seed,
        )
        return lambda engine_session: engine_session.open_rewards(**kwargs)

    def opener(self, maker, configure: Callable) -> Callable:
        """A function for the engine worker: engine session -> the page's rating session, or one
        `maker(engine_session)` makes (its failure fails the job), given the form's settings by
        `configure(session)` (which may fail too)."""
        session = self.session

        def open_session(engine_session):
            s = session if session is not None else maker(engine_session)
            configure(s)
            return s

        return open_session

    def session_job(self, maker, configure: Callable, work: Callable) -> Callable:
        """A job for the engine worker: the session (see `opener`), then `work(session)`. The job
        returns (session, result, None), or (session, None, why) when configuring or the work failed,
        so that a session it made is kept."""
        session = self.session

        def job(engine_session):
            s = session if session is not None else maker(engine_session)
            try:
                configure(s)
                result = work(s)
            except Exception as exc:  # noqa: BLE001 - keep the loaded session; the page shows why
                return s, None, describe(exc)
            return s, result, None

        return job


__all__ = [
    "BUSY_TEXT",
    "CHECKPOINT_FOLDER",
    "NEW_ADAPTER",
    "NEW_ADAPTER_TEXT",
    "RATINGS_FILE",
    "CardState",
    "Controls",
    "Problem",
    "RewardsController",
    "StartChange",
    "applied_status",
    "apply_problem",
    "busy_text",
    "controls",
    "failure_text",
    "generated_status",
    "job_name",
    "round_cards",
    "same_answers",
    "short",
    "start_entry",
    "start_path",
]
