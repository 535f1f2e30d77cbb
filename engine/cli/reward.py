"""`tune-engine reward`: rate sampled answers in the terminal and train on the ratings.

    tune-engine reward MODEL.gguf [--adapter A.gguf] --prompts PROMPTS.txt --samples N
        --ratings RATED.jsonl [--mode weighted|group] --out ADAPTER.gguf

For each prompt of PROMPTS.txt (one per line, blank lines skipped) the command generates N
answers with the current adapter, prints them numbered, reads one rating per answer (one line
each: 1-5 stars, a reward from -1 to 1, or `s` to skip), applies one step
(`engine.reward_session.RewardSession`) and prints what it did. Every rating is appended to
RATED.jsonl the moment it is read. The adapter is written to --out at the end, and also when the
input ends early or on Ctrl-C (with whatever was applied so far).

On a terminal a rating that cannot be read is explained and asked again; from a pipe it is
skipped with a warning on stderr.

Unattended rounds, with rewards from checks instead of a person (engine.train.rounds):

    tune-engine reward MODEL.gguf --prompts PROMPTS.jsonl --reward-fn exact [--reward-fn CHECK ...]
        --rounds N --samples K [--prompts-per-round M] --ratings SCORED.jsonl --out ADAPTER.gguf

Each round samples K answers to each of M prompts (all by default), scores them with the checks
(engine.train.reward_fns: exact, contains, regex:PATTERN, number:TOL, json, length:MIN-MAX, or a
Python file with def reward(prompt, answer, **sample); "@WEIGHT" after one weighs it) and takes one
group-relative step; a line per round gives the mean and spread of the reward, the share of
prompts with no signal and the loss. The prompts file is text (one prompt per line) or JSON Lines
with "prompt" and the reference answer the checks compare with ("reference", or "answer", ...).
`add_command(subparsers)` registers the subcommand (engine/cli.py
calls it); `EngineError`s propagate to the CLI's main, which prints one line and exits with 2.
"""

from __future__ import annotations

import argparse
import math
import sys

from ..model.targets import PRESETS, TargetSpec
from ..train.ratings import RewardError, parse_rating
from ..train.reward_fns import Scorer
from ..train.reward_session import MODES, RewardConfig
from ..train.rounds import AutoRounds, RoundProgress, RoundReport, RoundsConfig, load_prompts, round_table
from .common import add_runtime_options, open_session


def read_prompts(path: str) -> list[str]:
    """The non-blank lines of a UTF-8 text file, stripped; RewardError if none or unreadable."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            prompts = [line.strip() for line in f.read().split("\n")]
    except (OSError, UnicodeDecodeError) as exc:
        raise RewardError(f"{path}: the prompts file cannot be read ({exc})") from exc
    prompts = [p for p in prompts if p]
    if not prompts:
        raise RewardError(f"{path}: no prompt in the file (one prompt per line; blank lines are skipped)")
    return prompts


def _read_line(question: str, tty: bool) -> str:
    """One line of standard input, without its newline; EOFError at the end of the input."""
    if tty:
        return input(question)
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\r\n")


def _read_rating(number: int, tty: bool) -> float | None:
    while True:
        line = _read_line(f"rating for answer {number} (1-5, -1..1, s = skip): ", tty)
        try:
            return parse_rating(line)
        except ValueError as exc:
            if tty:
                print(f"  {exc}")
                continue
            print(f"warning: answer {number}: {exc}; answer skipped", file=sys.stderr)
            return None


def _fmt(x: float | None) -> str:
    return "skip" if x is None else f"{x:+.2f}"


def cmd_reward(args: argparse.Namespace) -> int:
    if args.rounds is not None and not args.reward_fn:
        raise RewardError(
            "--rounds runs unattended rounds, which score answers with checks: give --reward-fn"
        )
    if args.reward_fn:
        scorer = Scorer(args.reward_fn)  # a user's file is loaded here, before the model: its errors first
        items, problems = load_prompts(args.prompts)
        for p in problems:
            print(f"warning: {args.prompts}: {p}", file=sys.stderr)
        return _unattended(args, scorer, items)
    prompts = read_prompts(args.prompts)
    session = _open(args)
    tty = sys.stdin.isatty()
    interrupted = False
    try:
        for k, prompt in enumerate(prompts, start=1):
            answers = session.generate(prompt, system=args.system)
            print(f"=== prompt {k}/{len(prompts)}: {prompt}")
            for a in answers:
                print(f"--- answer {a.index + 1} ({len(a.tokens)} tokens, stop: {a.stop_reason}) ---")
                print(a.text)
            for a in answers:
                session.rate(a.index, _read_rating(a.index + 1, tty))
            if not tty:
                print("ratings: " + ", ".join(_fmt(r) for r in session.ratings))
            preview = session.preview()
            print(preview.message)
            if preview.n_rated == 0 and not session.corrections:
                print(f"round {session.round}: nothing rated, no step")
                continue
            result = session.apply()
            if result.applied:
                print(
                    f"round {result.round}: mean reward {result.mean_reward:+.3f}, loss {result.loss:.4f}, "
                    f"step {result.step}"
                )
            else:
                mean = "" if math.isnan(result.mean_reward) else f"mean reward {result.mean_reward:+.3f}, "
                print(f"round {result.round}: {mean}no step")
    except EOFError:
        print("end of input: stopping", file=sys.stderr)
    except KeyboardInterrupt:
        interrupted = True
    return _finish(session, args, interrupted, session.round, "ratings")


def _finish(session, args: argparse.Namespace, interrupted: bool, rounds: int, what: str) -> int:
    """Write the adapter (also after Ctrl-C: what was applied so far), say where, and go on with the
    interrupt when there was one."""
    if interrupted:
        print("\ninterrupted: writing what was applied so far", file=sys.stderr)
    path = session.save_adapter(args.out)
    print(f"adapter: {path} ({session.step} steps in {rounds} rounds); {what}: {args.ratings}")
    if interrupted:
        raise KeyboardInterrupt
    return 0


def _open(args: argparse.Namespace):
    config = RewardConfig(
        mode=args.mode, kl_coef=args.kl, lr=args.lr, n_samples=args.samples, temperature=args.temp,
        top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, max_new_tokens=args.n,
    )  # fmt: skip
    return open_session(args).open_rewards(
        adapter=args.adapter,
        targets=TargetSpec(preset=args.targets),
        rank=args.rank,
        alpha=args.alpha if args.alpha is not None else 2.0 * args.rank,
        config=config,
        ratings_path=args.ratings,
        checkpoint_dir=args.checkpoint_dir,
        seed=args.seed,
    )


def _unattended(args: argparse.Namespace, scorer: Scorer, items) -> int:
    if args.mode != "group":
        raise RewardError("unattended rounds take group-relative steps: leave --mode at group")
    rounds = AutoRounds(
        _open(args), items, scorer,
        RoundsConfig(rounds=args.rounds or 1, prompts_per_round=args.prompts_per_round, seed=args.seed),
    )  # fmt: skip
    session = rounds.session
    tty = sys.stderr.isatty()
    print(f"{len(items)} prompts, {args.samples} answers each, checks: {scorer.describe()}", file=sys.stderr)
    header = round_table([]).splitlines()[0]
    print(header)

    def on_event(e) -> None:
        if isinstance(e, RoundProgress) and tty:
            print(f"\rround {e.round}/{e.rounds}: prompt {e.index}/{e.n_prompts}", end="", file=sys.stderr)
        elif isinstance(e, RoundReport):
            if tty:
                print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
            print(round_table([e]).splitlines()[1], flush=True)
            shown = list(e.examples)
            shown = shown[: (args.show_examples + 1) // 2] + shown[len(shown) - args.show_examples // 2 :]
            for ex in shown if len(e.examples) > args.show_examples else e.examples:
                mark = "" if ex.reward is None else f"{ex.reward:+.2f}"
                print(f"        {mark}  {ex.prompt!r} -> {ex.answer!r}", file=sys.stderr)
            for ex in e.error_examples[:1]:
                first = next(iter(ex.errors.items()))
                print(
                    f"        error  {ex.prompt!r} -> {ex.answer!r}: {first[0]}: {first[1]}", file=sys.stderr
                )

    interrupted = False
    try:
        rounds.run(on_event)
    except KeyboardInterrupt:
        interrupted = True
    return _finish(session, args, interrupted, rounds.done, "scored answers")


def add_command(subparsers) -> None:
    """Register `reward` on the `tune-engine` subparsers."""
    s = subparsers.add_parser(
        "reward",
        help="rate sampled answers in the terminal and train a LoRA adapter on the ratings",
        description=(
            "For each prompt, generate N answers, read one rating per answer from the terminal or "
            "standard input (1-5 stars; a reward from -1 to 1 such as -0.5 or +1; s or an empty line "
            "to skip; a bare 1 is one star, write 1.0 or +1 for the top reward), and take one step. "
            "Every rating is appended to --ratings at once; --out is written at the end, at the end of "
            "the input and on Ctrl-C."
        ),
    )
    s.add_argument("model", help="base model GGUF")
    s.add_argument("--adapter", help="adapter GGUF (or reward checkpoint folder) to continue training")
    s.add_argument(
        "--prompts",
        required=True,
        help="text file: one prompt per line, blank lines skipped; with --reward-fn also JSON Lines with "
        '"prompt" and the reference answer ("reference")',
    )
    s.add_argument(
        "--reward-fn",
        action="append",
        metavar="CHECK",
        help="score answers with a check instead of asking: exact, contains, regex:PATTERN, number:TOL, "
        "json, length:MIN-MAX, or FILE.py defining reward(prompt, answer, **sample); @WEIGHT weighs it; "
        "repeat to combine",
    )
    s.add_argument(
        "--rounds",
        type=int,
        help="with --reward-fn: unattended rounds to run (sample, score, step; default 1)",
    )
    s.add_argument(
        "--prompts-per-round", type=int, default=0, help="with --reward-fn: prompts a round samples (0 = all)"
    )
    s.add_argument(
        "--show-examples", type=int, default=2, help="example answers printed per round (default 2)"
    )
    s.add_argument("--samples", type=int, default=4, help="answers per prompt, one batch (default 4)")
    s.add_argument("--ratings", required=True, help="JSONL file every rating is appended to")
    s.add_argument(
        "--mode",
        choices=MODES,
        default="group",
        help="group: group-relative, bad answers pushed down; weighted: reward-weighted SFT (default group)",
    )
    s.add_argument(
        "--kl", type=float, default=0.0, help="group mode: KL penalty to the base model (default 0)"
    )
    s.add_argument("--lr", type=float, default=1e-3, help="learning rate of each step (default 1e-3)")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampling and the LoRA init (default 0)")
    s.add_argument("--temp", type=float, default=0.9, help="sampling temperature (default 0.9)")
    s.add_argument(
        "--top-k", type=int, default=40, help="sample among the k most likely tokens; 0 = off (40)"
    )
    s.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling; 1 = off (default 0.95)")
    s.add_argument("--min-p", type=float, default=0.05, help="min-p sampling; 0 = off (default 0.05)")
    s.add_argument("-n", type=int, default=64, help="maximum new tokens per answer (default 64)")
    s.add_argument("--system", help="system message for every prompt")
    s.add_argument(
        "--targets", choices=tuple(PRESETS), default="all", help="LoRA target preset (default all)"
    )
    s.add_argument("--rank", type=int, default=8, help="LoRA rank of a new adapter (default 8)")
    s.add_argument("--alpha", type=float, help="LoRA alpha of a new adapter (default 2 x rank)")
    s.add_argument("--checkpoint-dir", help="write a checkpoint after every step into this folder")
    s.add_argument("--out", required=True, help="adapter GGUF to write")
    add_runtime_options(s)
    s.set_defaults(func=cmd_reward)
