"""Unattended group-relative rounds with an exact-match check on arithmetic prompts: the reward per
round, as `tune-engine reward --reward-fn exact --rounds N` prints it, and a DPO run's held-out
figures before and after (the two learning curves issue 35 asks for, on a model people can open).

    python bench/grpo_rounds.py                                  # the bundled demo model
    python bench/grpo_rounds.py --model SmolLM2-135M-Instruct.Q4_1.gguf --prompts 12 --samples 8

The demo model knows sums of small numbers ("What is 3 plus 4?" -> "3 plus 4 is 7."); sampled hot
and narrow (temperature 3, top-k 4) about seven answers in ten are exact, so the rounds have
something to sharpen. For another model the reference is the number alone and the check is
`number` unless `--check` says otherwise. Figures, not verdicts: a benchmark never passes or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import (  # noqa: E402
    AutoRounds,
    EngineSession,
    PreferenceEval,
    PromptItem,
    RewardConfig,
    RoundsConfig,
    Scorer,
    TargetSpec,
    TrainConfig,
    round_table,
)

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "resources/demo/demo.gguf")


def arithmetic(n: int, seed: int, demo: bool) -> list[PromptItem]:
    rng = np.random.default_rng(seed)
    pairs = set()
    while len(pairs) < n:
        a, b = (int(x) for x in rng.integers(1, 10, 2))
        pairs.add((a, b))
    items = []
    for a, b in sorted(pairs):
        ref = f"{a} plus {b} is {a + b}." if demo else str(a + b)
        prompt = f"What is {a} plus {b}?" if demo else f"What is {a} plus {b}? Answer with the number only."
        items.append(PromptItem(prompt, None, {"reference": ref}, 0))
    return items


def grpo(args) -> None:
    demo = os.path.abspath(args.model) == os.path.abspath(DEMO)
    check = args.check or ("exact" if demo else "number")
    session = EngineSession(args.model)
    config = RewardConfig(mode="group", lr=args.lr, n_samples=args.samples, temperature=args.temp,
                          top_k=args.top_k, top_p=1.0, min_p=0.0, max_new_tokens=args.tokens,
                          n_ctx=args.ctx)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        rs = session.open_rewards(targets=TargetSpec(preset="all"), rank=8, alpha=16, config=config,
                                  ratings_path=os.path.join(tmp, "scored.jsonl"), seed=args.seed)  # fmt: skip
        items = arithmetic(args.prompts, args.seed, demo)
        rounds = AutoRounds(rs, items, Scorer([check]), RoundsConfig(rounds=args.rounds, seed=args.seed))
        print(f"{os.path.basename(args.model)}: {len(items)} arithmetic prompts, {args.samples} answers "
              f"each, check {check}, temperature {args.temp:g}, top-k {args.top_k}, "
              f"lr {args.lr:g}")  # fmt: skip
        t0 = time.perf_counter()
        rounds.run()
        print(round_table(rounds.reports))
        print(f"({time.perf_counter() - t0:.0f} s)")
        last = rounds.reports[-1]
        for ex in last.examples:
            print(f"  round {last.round}: {ex.reward:+.2f}  {ex.prompt!r} -> {ex.answer!r}")


def dpo(args) -> None:
    """30 DPO steps on pairs made from the demo's own arithmetic: the right sum chosen, a wrong one
    rejected; the held-out pairs' accuracy and margin before and after."""
    rng = np.random.default_rng(args.seed)
    rows = []
    for a in range(1, 10):
        for b in range(1, 10):
            wrong = a + b + int(rng.choice([-2, -1, 1, 2]))
            rows.append({"prompt": f"What is {a} plus {b}?", "chosen": f"{a} plus {b} is {a + b}.",
                         "rejected": f"{a} plus {b} is {wrong}."})  # fmt: skip
    session = EngineSession(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "pairs.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        cfg = TrainConfig(targets=TargetSpec(preset="all"), rank=8, alpha=16, lr=5e-3, steps=30, batch_size=8,
                          n_ctx=64, val_split=0.2, eval_every=10, objective="dpo", dpo_beta=0.1,
                          schedule="constant")  # fmt: skip
        trainer = session.new_run(data, cfg)
        trainer.start()
        start = trainer.evaluate()
        got: list = []
        session.train(got.append)
        print(f"DPO on {len(rows)} pairs ({trainer.n_val} held out), beta 0.1, 30 steps:")
        print("step  held-out accuracy  margin   chosen log p  rejected log p")
        for e in [start, *[e for e in got if isinstance(e, PreferenceEval)]]:
            print(f"{e.step:>4}  {e.accuracy:>17.3f}  {e.margin:>+7.3f}  {e.chosen_logp:>12.3f}  "
                  f"{e.rejected_logp:>14.3f}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEMO)
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--temp", type=float, default=3.0)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--tokens", type=int, default=12)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--check", help="exact, number, ... (default: exact on the demo, number otherwise)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-dpo", action="store_true")
    args = p.parse_args()
    grpo(args)
    if not args.skip_dpo:
        print()
        dpo(args)


if __name__ == "__main__":
    main()
