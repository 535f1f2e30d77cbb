"""A reward session: sample N answers to a prompt, take a person's ratings, take one optimizer step.

`RewardSession` holds a model, a LoRA adapter being trained (fresh, or continued from a file or a
checkpoint) and an AdamW optimizer with a constant learning rate. A round goes:

1. `generate(prompt)`: N answers with the adapter's current weights, as one batch sharing the
   prompt's KV cache, with the session's sampling settings (`engine.model.generate`);
2. `rate(i, reward)` per answer (a reward in [-1, 1]; `rating_from_stars` maps 1-5 stars), and
   optionally `correct(i, text)` to turn an answer into a better one;
3. `preview()`: what a step would do with the ratings so far; `apply()`: one optimizer step.

Two ways to turn ratings into a step (DESIGN.md §2.7, `engine.train.rewards`):

- "weighted" (reward-weighted SFT, as llama.cpp's QLoRA example): the round's rewards are clipped
  to [-1, 1] and min-max scaled to [0, 1]; each answer's cross-entropy is weighted by its weight
  and the sum divided by the round's answer tokens. The worst answer gets weight 0: it is ignored,
  never pushed down.
- "group" (group-relative, GRPO-style): advantage A_i = (r_i - mean) / (std + eps) over the round;
  loss = sum_i A_i * mean_t CE(y_i,t) / n, so answers below the mean are pushed down, above it up;
  plus `kl_coef` x KL(adapter || base model) per answer token, weighted by |A_i|.

Checks beside ratings: `score_answers(scorer)` scores the round's answers with checks
(engine.train.reward_fns); an answer's reward is then the checks' weighted sum plus
`scorer.rating_weight` x the person's rating (the rating is one more source), and a rating line
carries the answer's "checks". `sample()` and `apply_groups()` serve unattended rounds
(engine.train.rounds): answers outside the rating round, and one group-relative step on the scored
answers of several prompts.

A correction is a target the person wrote: it takes part with reward 1.0 and gets the round's
highest weight (1.0 in weighted mode; max(1, highest advantage) in group mode). When every rated
answer has the same rating (one rated answer included) and there is no correction, the ratings
carry no signal and `apply()` takes no step.

The ratings file. Every rating and correction is appended to `ratings_path` as one JSON line the
moment it is given, flushed to disk before `rate()` returns, so that a crash loses none::

    {"messages": [{"role": "user", ...}, {"role": "assistant", ...}], "reward": 0.5,
     "prompt": "...", "answer": 2, "mode": "group", "round": 3, "step": 2,
     "adapter": "ckpt/ckpt-000002" | null, "session": "9f1c...", "time": "2025-...Z",
     "stop_reason": "eos"}

(`"corrected": true` and `"original"` on corrections). "step" counts the optimizer steps taken
before the answer was generated; "adapter" is the checkpoint (or adapter file) holding exactly
those weights, or null when there is none. The file is an ordinary dataset: `engine.data.load_jsonl`
reads it, answers to one prompt share a group, and `Trainer` can train on it in either reward mode.
Re-rating an answer appends a new line; the later line wins: `load_ratings` keeps only the last
line per (session, round, answer) (corrections separately), while `load_jsonl` reads every line.
A skip (`rate(i, None)`) is not a rating and writes nothing; a rating given before it stays in the
file, though the step of the round no longer uses it.

What this module is not: it does not decide what a good answer is, keep a replay buffer, or
take several steps per round; the UI (studio Rewards page) and the CLI (`tune-engine reward`) sit
on top of it. It never prints.
"""

from __future__ import annotations

import logging
import math
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np

from ..backend import to_host
from ..errors import ConfigError
from ..io.files import check_outputs
from ..model.generate import SamplingConfig
from ..model.generate import generate as generate_tokens
from ..model.lora import LoraAdapter
from ..model.model import Model
from ..model.targets import TargetSpec, select_targets
from ..ranges import check_number
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import Tokenizer
from .batches import batch_encoded
from .checkpoint import ADAPTER_FILE, PREFIX, CheckpointError, read_checkpoint, write_checkpoint
from .data import parse_sample
from .encode import EncodeOptions, encode_samples
from .optim import AdamW, OptimConfig
from .ratings import RewardError, append_ratings
from .reward_fns import Score, Scorer
from .rewards import group_advantages, reward_weights
from .runs import RunRecord
from .train_model import Trainable, loss_and_grads

log = logging.getLogger(__name__)

MODES = ("weighted", "group")
CORRECTION_REWARD = 1.0  # the reward a correction carries: the top of the scale
SESSION_FILE = "session.json"  # the facts file of a reward session's checkpoints (engine.train.checkpoint)
_FLAT = 1e-6  # ratings whose range is at or below this carry no signal (engine.train.rewards' rule)
_GROUP_EPS = 1e-6  # eps of (r - mean) / (std + eps)


_CONFIG_NUMBERS = ("kl_coef", "lr", "max_grad_norm", "temperature", "top_p", "min_p", "n_samples", "top_k",
                   "max_new_tokens", "n_ctx")  # fmt: skip


@dataclass(frozen=True)
class RewardConfig:
    """How a reward session samples answers and turns ratings into a step."""

    mode: str = "group"  # "weighted" (reward-weighted SFT) | "group" (group-relative)
    kl_coef: float = 0.0  # group mode: KL(adapter || base) weight per answer token; ignored when weighted
    lr: float = 1e-3  # learning rate of each apply() step (AdamW, constant)
    max_grad_norm: float = 1.0  # global gradient-norm clipping; 0 = off
    n_samples: int = 4  # answers per prompt
    temperature: float = 0.9  # sampling temperature; 0 is greedy (all answers alike)
    top_k: int = 40  # keep the k most likely tokens; 0 = off
    top_p: float = 0.95  # nucleus sampling; 1 = off
    min_p: float = 0.05  # drop tokens below min_p x the most likely; 0 = off
    max_new_tokens: int = 64  # token budget per answer
    n_ctx: int = 256  # window (tokens) of the training step; longer prompt + answer is truncated

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise RewardError(f"reward mode {self.mode!r} is not one of {', '.join(MODES)}")
        for name in _CONFIG_NUMBERS:  # their ranges: engine.ranges, shared with the CLI
            check_number(name, getattr(self, name), error=RewardError)


@dataclass(frozen=True)
class Answer:
    """One generated answer of a round."""

    index: int  # position in the round, 0-based
    text: str  # the decoded answer (without the end-of-turn token)
    tokens: tuple[int, ...]  # its token ids as generated
    stop_reason: str  # "eos", "length" (token budget), "context", "stopped"


@dataclass(frozen=True)
class ScoredGroup:
    """A prompt's answers and their rewards from checks, for `RewardSession.apply_groups`."""

    prompt: str  # the user message
    system: str | None  # its system message, if any
    answers: tuple[tuple[str, float | None, dict | None], ...]  # (text, reward or None, each check's value)


@dataclass(frozen=True)
class Preview:
    """What apply() would do with the ratings so far, for the UI before applying.

    mean and std are over the rated answers; the weights are computed with this round's
    corrections taking part (reward 1.0), as apply() computes them.
    """

    n_rated: int  # answers with a rating (skips not counted)
    mean: float | None  # mean rating of the rated answers; None when none is rated
    std: float | None  # population std of the ratings; None when none is rated
    weights: tuple[float | None, ...]  # per answer: weight (weighted) or advantage (group); None = unrated
    no_signal: bool  # all rated answers equal (one rated included) and no correction: no step
    message: str  # a sentence for people


@dataclass(frozen=True)
class RoundResult:
    """What apply() did."""

    round: int  # the round (1-based: the number of generate() calls so far)
    step: int  # optimizer steps taken, after this one
    prompt: str  # the round's user prompt
    mean_reward: float  # mean rating of the rated answers; nan when only corrections were given
    loss: float  # the objective before the step (weighted CE, + KL); nan when no step was taken
    n_rated: int  # rated answers (corrections not counted)
    weights: tuple[float | None, ...]  # as Preview.weights
    applied: bool  # False when the ratings carried no signal and no step was taken


class RewardSession:
    """Generate answers, take ratings, apply one step per round; see the module docstring."""

    def __init__(
        self,
        model: Model | str,
        *,
        adapter: str | LoraAdapter | None = None,
        targets: TargetSpec = TargetSpec(preset="all"),  # noqa: B008 - frozen dataclass
        rank: int = 8,
        alpha: float = 16.0,
        config: RewardConfig = RewardConfig(),  # noqa: B008 - frozen dataclass
        ratings_path: str,
        checkpoint_dir: str | None = None,
        template: ChatTemplate | None = None,
        seed: int = 0,
        tokenizer: Tokenizer | None = None,
    ):
        """`adapter`: an adapter GGUF, a loaded `LoraAdapter` or a checkpoint folder written by
        `checkpoint()` (which also restores the optimizer moments and the step and round counts;
        of a Trainer checkpoint folder only the adapter is taken);
        then `targets`, `rank` and `alpha` are the adapter's and the arguments are not used.
        `ratings_path` is created if missing and appended to, never rewritten.

        `config` and `ratings_path` may be replaced between calls: each call reads them afresh (the
        next apply() steps with the new lr). `corrections` maps answer index -> corrected text for
        the current round; `session_id` tags this session's lines in the ratings file."""
        self.config = config
        self.model = model if isinstance(model, Model) else Model.load(model)
        md = self.model.metadata
        # the session's tokenizer when given: a 150k vocabulary is a 0.1 s build holding the GIL
        self.tokenizer = tokenizer if tokenizer is not None else Tokenizer.from_metadata(md, self.model.path)
        self.template = template if template is not None else ChatTemplate.from_metadata(md)
        self.checkpoint_dir = checkpoint_dir
        start = adapter.path if isinstance(adapter, LoraAdapter) else adapter
        # every file the session reads: no output of it (ratings, checkpoints, saved adapters) may be one
        self.inputs: dict[str, str | None] = {
            "model": self.model.path, "adapter to continue": os.fspath(start) if start else None,
        }  # fmt: skip
        self._check_outputs({}, ratings_path)
        self._ratings_path = os.fspath(ratings_path)
        self.seed = seed
        self.session_id = uuid.uuid4().hex[:12]
        self._rng = np.random.default_rng(seed)
        self.step = 0  # optimizer steps taken
        self.round = 0  # rounds started (generate calls)
        self.history: list[RoundResult] = []
        self.prompt: str | None = None
        self.system: str | None = None
        self.answers: list[Answer] = []
        self.ratings: list[float | None] = []
        self.corrections: dict[int, str] = {}  # answer index -> corrected text, this round
        self.check_scores: list[Score | None] = []  # this round's answers scored by checks (score_answers)
        self.scorer: Scorer | None = None  # the checks, and the weight of a rating beside them
        self._round_step = 0  # steps taken when this round's answers were generated
        self._round_adapter: str | None = None  # checkpoint holding those weights
        self._round_applied = False
        self._checkpoint: tuple[str, int] | None = None  # (path, step) of the last checkpoint
        self.record: RunRecord | None = None  # the run history's record, from the first applied round

        state = None
        if isinstance(adapter, LoraAdapter):
            self.trainable = Trainable.from_adapter(adapter, self.model)
            if adapter.path:
                self._checkpoint = (adapter.path, 0)
        elif adapter is not None and os.path.isfile(os.path.join(adapter, SESSION_FILE)):
            state = self._read_checkpoint(adapter)
            self.trainable = Trainable.from_adapter(
                LoraAdapter.load(os.path.join(adapter, ADAPTER_FILE), self.model), self.model
            )
        elif adapter is not None:
            if os.path.isdir(adapter):  # another folder holding an adapter.gguf (a Trainer checkpoint)
                adapter = os.path.join(adapter, ADAPTER_FILE)
            self.trainable = Trainable.from_adapter(LoraAdapter.load(adapter, self.model), self.model)
            self._checkpoint = (os.fspath(adapter), 0)
        else:
            names = select_targets(self.model.tensors, targets, self.model.config.L)
            self.trainable = Trainable.init(self.model, names, rank, alpha, seed=seed)
        backend = self.model.backend
        self.trainable = self.trainable.to(backend)  # on the model's device (a GPU run)
        self.optimizer = AdamW(
            self.trainable.params(),
            OptimConfig(lr=config.lr, schedule="constant", max_grad_norm=config.max_grad_norm),
            runtime=backend.runtime,
        )
        if state is not None:
            self._restore(adapter, state)
        try:
            with open(self.ratings_path, "ab"):
                pass
        except OSError as exc:
            raise RewardError(
                f"{self.ratings_path}: the ratings file cannot be written ({exc.strerror or exc})"
            ) from exc

    @property
    def ratings_path(self) -> str:
        """The JSONL file every rating is appended to; a new one is checked like every output."""
        return self._ratings_path

    @ratings_path.setter
    def ratings_path(self, path: str | os.PathLike[str]) -> None:
        self._check_outputs({}, path)
        self._ratings_path = os.fspath(path)

    def _check_outputs(self, more: dict[str, str | None], ratings: str | os.PathLike[str] | None) -> None:
        """RewardError when an output of the session (the ratings file, the checkpoint folder, and
        `more`) is one of its inputs or another output (engine.io.files.check_outputs)."""
        try:
            check_outputs(
                {"ratings file": os.fspath(ratings) if ratings else None,
                 "checkpoint folder": self.checkpoint_dir, **more},
                self.inputs, folders={"checkpoint folder": PREFIX}, continues="adapter to continue",
                kinds={"ratings file": "jsonl", "adapter": "adapter"},
            )  # fmt: skip
        except ConfigError as exc:
            raise RewardError(str(exc)) from exc

    def set_config(self, config: RewardConfig) -> None:
        """New settings for the next calls: sampling, mode and KL at once, and the learning rate of
        the next apply() (the optimizer keeps its moments)."""
        if not isinstance(config, RewardConfig):
            raise RewardError(f"expected a RewardConfig, got {type(config).__name__}")
        if config.lr != self.optimizer.cfg.lr or config.max_grad_norm != self.optimizer.cfg.max_grad_norm:
            self.optimizer.cfg = replace(self.optimizer.cfg, lr=config.lr, max_grad_norm=config.max_grad_norm)
        self.config = config

    # --- sampling -------------------------------------------------------------------------------
    def _messages(self, prompt: str, system: str | None) -> list[dict[str, str]]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise RewardError(f"the prompt must be non-empty text, got {prompt!r}")
        return ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]

    def _prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        tok = self.tokenizer
        text = self.template.render(messages, add_generation_prompt=True)
        ids = tok.encode(text, add_special=False, parse_special=True)  # the template writes its own BOS
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id, *ids]
        return ids

    def _sampling(self, seed: int | None) -> SamplingConfig:
        c = self.config
        if seed is None:
            seed = int(self._rng.integers(2**31))
        return SamplingConfig(c.temperature, c.top_k, c.top_p, c.min_p, seed, c.max_new_tokens)

    def _answers(self, messages, n, seed, lora, on_token=None, should_stop=None) -> list[Answer]:
        results = generate_tokens(
            self.model,
            self._prompt_ids(messages),
            n_samples=n,
            sampling=self._sampling(seed),
            stop_ids=self.tokenizer.eot_ids,
            lora=lora,
            on_token=on_token,
            should_stop=should_stop,
        )
        return [
            Answer(i, self.tokenizer.decode(list(g.tokens)), tuple(int(t) for t in g.tokens), g.stop_reason)
            for i, g in enumerate(results)
        ]

    def generate(
        self,
        prompt: str,
        *,
        system: str | None = None,
        n: int | None = None,
        seed: int | None = None,
        on_token: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Answer]:
        """Start a new round: `n` (default config.n_samples) answers with the adapter's current weights.

        One batch sharing the prompt's KV cache. `seed` None draws one from the session's seed.
        `on_token(answer, token)` streams tokens; `should_stop()` ends every answer early. The
        previous round's ratings and corrections are cleared (they are in the ratings file).
        """
        messages = self._messages(prompt, system)
        n = self.config.n_samples if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise RewardError(f"n must be an integer >= 1, got {n!r}")
        answers = self._answers(messages, n, seed, self.trainable.terms(), on_token, should_stop)
        self.round += 1
        self.prompt, self.system = prompt, system
        self.answers = answers
        self.ratings = [None] * len(answers)
        self.check_scores = [None] * len(answers)
        self.corrections = {}
        self._round_step = self.step
        self._round_applied = False
        ckpt = self._checkpoint
        self._round_adapter = ckpt[0] if ckpt is not None and ckpt[1] == self.step else None
        return answers

    def base_answer(self, prompt: str, *, seed: int, system: str | None = None) -> Answer:
        """One answer of the base model (adapter off), with the session's sampling and `seed`."""
        return self._answers(self._messages(prompt, system), 1, seed, None)[0]

    def adapter_answer(self, prompt: str, *, seed: int, system: str | None = None) -> Answer:
        """One answer with the adapter's current weights, with the session's sampling and `seed`."""
        return self._answers(self._messages(prompt, system), 1, seed, self.trainable.terms())[0]

    # --- checks beside the ratings ----------------------------------------------------------------
    def score_answers(self, scorer: Scorer, sample: dict | None = None) -> list[Score]:
        """Score this round's answers with checks (engine.train.reward_fns; `sample`: the prompt's line,
        the reference answer for instance). From now on an answer's reward in this round is
        `scorer.combine(its checks, its rating)`: the person's rating is one more source, weighted by
        `scorer.rating_weight`; an answer whose check failed is left out."""
        if not self.answers or self.prompt is None:
            raise RewardError("there are no answers to score: generate answers first")
        self.scorer = scorer
        self.check_scores = [scorer.score(self.prompt, a.text, sample or {}) for a in self.answers]
        return list(self.check_scores)

    def rewards(self) -> list[float | None]:
        """Each answer's reward this round: its rating, or with checks, their sum with the rating's share."""
        if self.scorer is None or not any(sc is not None for sc in self.check_scores):
            return list(self.ratings)
        return [self.scorer.combine(sc, r) for sc, r in zip(self.check_scores, self.ratings, strict=True)]

    # --- ratings --------------------------------------------------------------------------------
    def _check_index(self, index: int) -> None:
        if not self.answers:
            raise RewardError("there are no answers to rate: generate answers first")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise RewardError(f"answer index must be an integer, got {index!r}")
        if not 0 <= index < len(self.answers):
            raise RewardError(f"answer index {index} is outside 0..{len(self.answers) - 1}")

    def _record(self, index: int, text: str, reward: float) -> dict[str, Any]:
        assert self.prompt is not None
        messages = [*self._messages(self.prompt, self.system), {"role": "assistant", "content": text}]
        return {
            "messages": messages,
            "reward": reward,
            "prompt": self.prompt,
            "answer": int(index),
            "mode": self.config.mode,
            "round": self.round,
            "step": self._round_step,
            "adapter": self._round_adapter,
            "session": self.session_id,
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "stop_reason": self.answers[index].stop_reason,
            **self._checks_of(index),
        }

    def _checks_of(self, index: int) -> dict[str, Any]:
        sc = self.check_scores[index] if index < len(self.check_scores) else None
        return {} if sc is None else {"checks": dict(sc.parts), "check_reward": sc.total}

    def rate(self, index: int, reward: float | None) -> None:
        """Rate answer `index` with a reward in [-1, 1], or None to skip it.

        The rating is appended to the ratings file and flushed to disk before this returns; a
        rating that cannot be saved raises RewardError and is not taken. Re-rating appends a new
        line (the later wins, see `load_ratings`). A skip writes nothing and withdraws an earlier
        rating from this round's step.
        """
        self._check_index(index)
        if reward is None:
            self.ratings[index] = None
            return
        if (
            isinstance(reward, bool)
            or not isinstance(reward, (int, float, np.integer, np.floating))
            or not math.isfinite(reward)
            or not -1.0 <= reward <= 1.0
        ):
            raise RewardError(
                f"a reward must be a number in [-1, 1] (or None to skip), got {reward!r}; "
                "map 1-5 stars with rating_from_stars"
            )
        reward = float(reward)
        append_ratings(self.ratings_path, self._record(index, self.answers[index].text, reward))
        self.ratings[index] = reward

    def correct(self, index: int, text: str) -> None:
        """Answer `index` rewritten into a better one: saved at once (reward 1.0, "corrected": true)
        and trained in the next apply() as a target with the round's highest weight."""
        self._check_index(index)
        if not isinstance(text, str) or not text.strip():
            raise RewardError("a corrected answer must be non-empty text")
        record = self._record(index, text, CORRECTION_REWARD)
        record["corrected"] = True
        record["original"] = self.answers[index].text
        append_ratings(self.ratings_path, record)
        self.corrections[index] = text

    # --- the step -------------------------------------------------------------------------------
    def _plan(self) -> tuple[Preview, list[tuple[str, float]]]:
        """The preview, and the (answer text, weight) pairs a step would train on."""
        mode = self.config.mode
        rated = [(i, r) for i, r in enumerate(self.rewards()) if r is not None]  # ratings (and checks)
        fixes = sorted(self.corrections.items())
        rewards = [r for _, r in rated] + [CORRECTION_REWARD] * len(fixes)
        if mode == "weighted":
            w = reward_weights(rewards)
            fix_weight = [float(x) for x in w[len(rated) :]]
        else:
            w = group_advantages(rewards, [0] * len(rewards), eps=_GROUP_EPS)
            top = max(1.0, float(w.max())) if len(w) else 1.0
            fix_weight = [top] * len(fixes)
        weights: list[float | None] = [None] * len(self.answers)
        for (i, _), x in zip(rated, w[: len(rated)], strict=True):
            weights[i] = float(x)
        values = np.array([r for _, r in rated], dtype=np.float64)
        mean = float(values.mean()) if len(values) else None
        std = float(values.std()) if len(values) else None
        flat = len(values) < 2 or float(np.ptp(values)) <= _FLAT
        no_signal = flat and not fixes

        n = len(rated)
        if not n and not fixes:
            message = "No answer is rated yet: rate at least two answers differently, or correct one."
        elif no_signal and n == 1:
            message = "Only one answer is rated: no signal; rate another one differently, or correct one."
        elif no_signal:
            message = "All ratings are equal: no signal; rate answers differently."
        else:
            parts = []
            if n:
                parts.append(f"{n} rated answer{'s' if n != 1 else ''} (mean {mean:+.2f})")
            if fixes:
                parts.append(f"{len(fixes)} correction{'s' if len(fixes) != 1 else ''}")
            spread = len(rewards) >= 2 and float(np.ptp(rewards)) > _FLAT  # corrections included
            if mode == "weighted":
                how = "Reward-weighted step: " + (
                    "the best has weight 1, the worst 0 (ignored, not pushed down)"
                    if spread
                    else "every answer has weight 1"
                )
            elif not flat:
                how = "Group-relative step: answers above the mean are pushed up, those below it down"
            elif spread:
                how = "Group-relative step: answers rated below the correction are pushed down"
            else:
                how = "Group-relative step: only the correction is trained"
            if fixes and "only the correction" not in how:
                how += "; a correction counts as the best answer"
            if mode == "group" and self.config.kl_coef:
                how += f"; KL to the base model x{self.config.kl_coef:g}"
            message = f"{' and '.join(parts)}. {how}."
        preview = Preview(n, mean, std, tuple(weights), no_signal, message)
        train = [(self.answers[i].text, float(x)) for (i, _), x in zip(rated, w[: len(rated)], strict=True)]
        train += [(text, x) for (_, text), x in zip(fixes, fix_weight, strict=True)]
        return preview, train

    def preview(self) -> Preview:
        """What apply() would do with the ratings and corrections so far."""
        return self._plan()[0]

    def apply(self) -> RoundResult:
        """One optimizer step on this round's rated answers and corrections.

        RewardError when there is no round, nothing is rated or corrected, or the round was
        applied already. When the ratings carry no signal no step is taken (applied False, loss
        nan). With `checkpoint_dir` set, a checkpoint is written after the step.
        """
        if not self.answers or self.prompt is None:
            raise RewardError("there is nothing to apply: generate answers and rate them first")
        if self._round_applied:
            raise RewardError(
                f"round {self.round} was applied already; generate new answers for another step"
            )
        preview, train = self._plan()
        if not train:
            raise RewardError("no answer is rated or corrected: rate answers (or correct one), then apply")
        mean_reward = preview.mean if preview.mean is not None else float("nan")
        if preview.no_signal:
            result = RoundResult(
                self.round, self.step, self.prompt, mean_reward, float("nan"), preview.n_rated,
                preview.weights, False,
            )  # fmt: skip
            self.history.append(result)
            log.info("round %d: %s", self.round, preview.message)
            return result

        base = self._messages(self.prompt, self.system)
        loss = self._train_step([([*base, {"role": "assistant", "content": text}], x) for text, x in train])
        self._round_applied = True
        result = RoundResult(
            self.round, self.step, self.prompt, mean_reward, loss, preview.n_rated, preview.weights, True,
        )  # fmt: skip
        self.history.append(result)
        log.info("round %d: step %d, loss %.4f, mean reward %s", self.round, self.step, loss, mean_reward)
        if self.checkpoint_dir:
            self.checkpoint()
            self._note(result)
        return result

    def _train_step(self, items: list[tuple[list[dict], float]], mode: str | None = None) -> float:
        """One optimizer step on conversations ending in an answer, each with its weight (weighted
        mode) or advantage (group mode); returns the objective before the step."""
        cfg = self.config
        mode = mode or cfg.mode
        samples = []
        for messages, _ in items:
            sample, problems = parse_sample({"messages": messages})
            assert sample is not None, problems
            samples.append(sample)
        encoded, problems = encode_samples(samples, self.tokenizer, self.template, EncodeOptions(cfg.n_ctx))
        for p in problems:
            log.warning("round %d: %s", self.round, p)
        if not encoded:
            raise RewardError(
                f"no rated answer could be encoded for training: {problems[0] if problems else ''}; "
                "raise n_ctx or shorten the prompt"
            )
        normalize = "tokens" if mode == "weighted" else "samples"
        (batch,) = batch_encoded(
            encoded, cfg.n_ctx, len(encoded), weights=[x for _, x in items], normalize=normalize
        )
        kl = cfg.kl_coef if mode == "group" else 0.0
        res = loss_and_grads(self.model, self.trainable, batch, kl_coef=kl)
        if not math.isfinite(res.loss):
            raise RewardError(f"the loss is {res.loss}: no step taken; lower the learning rate")
        # `config` may have been replaced since the last step: its lr and clipping apply from now on
        opt = self.optimizer
        opt.cfg = replace(opt.cfg, lr=cfg.lr, max_grad_norm=cfg.max_grad_norm)
        stats = opt.step(res.grads)
        if not math.isfinite(stats.grad_norm):
            raise RewardError(f"the gradient norm is {stats.grad_norm}: no step taken; lower the lr")
        self.step += 1
        return float(res.loss)

    # --- unattended rounds (engine.train.rounds) ------------------------------------------------
    def sample(
        self,
        prompt: str,
        *,
        system: str | None = None,
        n: int | None = None,
        seed: int | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Answer]:
        """`n` answers with the adapter's current weights, outside the rating rounds: the round being
        rated (its answers, ratings and corrections) is left as it is."""
        n = self.config.n_samples if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise RewardError(f"n must be an integer >= 1, got {n!r}")
        messages = self._messages(prompt, system)
        return self._answers(messages, n, seed, self.trainable.terms(), None, should_stop)

    def apply_groups(self, groups: list[ScoredGroup]) -> RoundResult:
        """One group-relative step on the scored answers of several prompts (an unattended round):
        within each prompt's answers A = (r - mean) / (std + eps); an answer whose reward is None (a
        check failed) is left out. Every scored answer is appended to the ratings file first, with its
        checks ("source": "checks"). A round whose every group has equal rewards takes no step."""
        self.round += 1
        self._round_step = self.step
        ckpt = self._checkpoint
        adapter = ckpt[0] if ckpt is not None and ckpt[1] == self.step else None
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        rewards, keys, items, records = [], [], [], []
        for g, group in enumerate(groups):
            base = self._messages(group.prompt, group.system)
            for i, (text, reward, checks) in enumerate(group.answers):
                if reward is None:
                    continue
                records.append({
                    "messages": [*base, {"role": "assistant", "content": text}], "reward": float(reward),
                    "prompt": group.prompt, "answer": i, "mode": "group", "round": self.round,
                    "step": self.step, "adapter": adapter, "session": self.session_id, "time": stamp,
                    "source": "checks", "checks": dict(checks or {}),
                })  # fmt: skip
                rewards.append(float(reward))
                keys.append(g)
                items.append(([*base, {"role": "assistant", "content": text}], 0.0))
        if records:
            append_ratings(self.ratings_path, records)  # before the step: no score is ever lost
        adv = group_advantages(rewards, keys, eps=_GROUP_EPS) if rewards else np.zeros(0)
        train = [(m, float(a)) for (m, _), a in zip(items, adv, strict=True) if a != 0.0]
        mean = float(np.mean(rewards)) if rewards else float("nan")
        label = groups[0].prompt if len(groups) == 1 else f"{len(groups)} prompts"
        loss, applied = float("nan"), bool(train)
        if train:
            loss = self._train_step(train, mode="group")
        weights = tuple(float(a) for a in adv)
        result = RoundResult(self.round, self.step, label, mean, loss, len(rewards), weights, applied)
        self.history.append(result)
        if applied and self.checkpoint_dir:
            self.checkpoint()
            self._note(result)
        return result

    def _note(self, result: RoundResult) -> None:
        """The session's record for the run history (engine.train.runs), beside its checkpoints."""
        path = os.path.join(self.checkpoint_dir, f"rewards-{self.session_id}.run.json")
        rec = self.record
        if rec is None:
            kinds = sorted(
                {re.sub(r"^blk\.\d+\.", "", n).removesuffix(".weight") for n in self.trainable.pairs}
            )
            rec = self.record = RunRecord(
                name=f"rating rounds {datetime.now().strftime('%Y-%m-%d %H:%M')}",
                kind="rewards",
                model=self.model.path,
                dataset=self.ratings_path,
                targets=kinds,
                n_targets=len(self.trainable.pairs),
                rank=self.trainable.rank,
                alpha=self.trainable.alpha,
                checkpoints=self.checkpoint_dir,
                config=asdict(self.config),
            )
        rec.add_loss(self.step, result.loss)
        rec.status = "finished"  # every round leaves a whole adapter behind
        rec.steps_done = rec.steps_planned = self.step
        ckpt = self._checkpoint[0] if self._checkpoint else None
        rec.last_checkpoint = ckpt
        rec.adapter = os.path.join(ckpt, ADAPTER_FILE) if ckpt else None
        try:
            rec.write(path)
        except (OSError, ValueError) as exc:
            log.warning("the run record %s could not be written: %s", path, exc)

    # --- files ----------------------------------------------------------------------------------
    def _training_facts(self) -> dict[str, Any]:
        return {
            "training.rank": self.trainable.rank,
            "training.targets": sorted(self.trainable.pairs),
            "training.steps": self.step,
            "training.rounds": self.round,  # rounds of answers generated (a step is taken in some)
            "training.reward_mode": self.config.mode,
            "training.kl_coef": self.config.kl_coef if self.config.mode == "group" else 0.0,
            "training.lr": self.config.lr,
            "training.ratings_file": os.path.basename(self.ratings_path),
            "training.base_model": os.path.basename(self.model.path),
            "training.tool": "tune-studio",
        }

    def save_adapter(self, path: str, qtype: str = "F32") -> str:
        """Write the adapter as a llama.cpp LoRA GGUF with training.* facts; returns the path.
        RewardError, with nothing written, when `path` is the model, the adapter the session
        continues, the ratings file or inside the checkpoint folder's checkpoints."""
        from ..export.write import export_adapter

        self._check_outputs({"adapter": os.fspath(path)}, self.ratings_path)
        adapter = self.trainable.to_adapter(self.model.config.arch)
        return export_adapter(adapter, path, qtype=qtype, training=self._training_facts())

    def checkpoint(self) -> str | None:
        """With `checkpoint_dir`: write `checkpoint_dir/ckpt-<step>` (adapter, exact parameters and
        optimizer moments, counters) atomically and return its path, which later rating lines name
        as "adapter" until the next step; None without `checkpoint_dir`. Every checkpoint is kept,
        as rating lines refer to them."""
        if not self.checkpoint_dir:
            return None
        folder = self.checkpoint_dir
        meta = {
            "step": self.step,
            "round": self.round,
            "rounds_applied": sum(1 for r in self.history if r.applied),
            "config": asdict(self.config),
            "model": self.model.path,
            "rank": self.trainable.rank,
            "alpha": self.trainable.alpha,
            "lora_targets": sorted(self.trainable.pairs),
            "ratings": self.ratings_path,
            "session": self.session_id,
        }
        try:
            final = write_checkpoint(
                folder,
                self.step,
                params={k: to_host(v) for k, v in self.trainable.params().items()},
                optimizer=self.optimizer.state_dict(),
                meta=meta,
                meta_file=SESSION_FILE,
                write_adapter=self.save_adapter,
            )
        except OSError as exc:
            raise RewardError(f"{folder}: checkpoint cannot be written ({exc.strerror or exc})") from exc
        self._checkpoint = (final, self.step)
        return final

    @staticmethod
    def _read_checkpoint(path: str) -> tuple[dict, dict, dict]:
        try:
            meta, params, optim, _ = read_checkpoint(path, SESSION_FILE)
        except CheckpointError as exc:
            raise RewardError(
                f"{exc}; give an adapter GGUF or a folder written by RewardSession.checkpoint()"
            ) from exc
        return meta, params, optim

    def _restore(self, path: str, saved: tuple[dict, dict, dict]) -> None:
        meta, values, optim = saved
        params = self.trainable.params()
        if set(values) != set(params):
            raise RewardError(f"{path}: the checkpoint's parameters do not match its adapter")
        for k, v in values.items():
            params[k][...] = self.model.backend.asarray(v, params[k].dtype)
        try:
            self.optimizer.load_state_dict(optim)
        except ValueError as exc:
            raise RewardError(f"{path}: the optimizer state cannot be restored ({exc})") from exc
        self.step = int(meta.get("step", 0))
        self.round = int(meta.get("round", 0))
        self._checkpoint = (os.fspath(path), self.step)


__all__ = ["Answer", "MODES", "Preview", "RewardConfig", "RewardSession", "RoundResult", "ScoredGroup"]
