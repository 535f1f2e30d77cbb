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
skipped with a warning on stderr. `add_command(subparsers)` registers the subcommand (engine/cli.py
calls it); `EngineError`s propagate to the CLI's main, which prints one line and exits with 2.
"""

from __future__ import annotations

import argparse
import math
import sys

from ..model.targets import PRESETS, TargetSpec
from ..train.reward_session import MODES, RewardConfig, RewardError, parse_rating
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
    prompts = read_prompts(args.prompts)
    config = RewardConfig(
        mode=args.mode, kl_coef=args.kl, lr=args.lr, n_samples=args.samples, temperature=args.temp,
        max_new_tokens=args.n,
    )  # fmt: skip
    session = open_session(args).open_rewards(
        adapter=args.adapter,
        targets=TargetSpec(preset=args.targets),
        rank=args.rank,
        alpha=args.alpha if args.alpha is not None else 2.0 * args.rank,
        config=config,
        ratings_path=args.ratings,
        checkpoint_dir=args.checkpoint_dir,
        seed=args.seed,
    )
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
        print("\ninterrupted: writing what was applied so far", file=sys.stderr)
    path = session.save_adapter(args.out)
    print(f"adapter: {path} ({session.step} steps in {session.round} rounds); ratings: {args.ratings}")
    if interrupted:
        raise KeyboardInterrupt
    return 0


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
    s.add_argument("--prompts", required=True, help="text file: one prompt per line, blank lines skipped")
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
