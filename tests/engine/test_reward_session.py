"""Reward sessions on the demo model: both reward modes' math, ratings on disk before any step,
checkpoints, a short fine-tune that changes the demo model's answer, and `tune-engine reward`."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from engine import (
    GREEDY,
    EncodeOptions,
    LoraAdapter,
    Model,
    encode_samples,
    generate,
    load_jsonl,
    parse_sample,
)
from engine.io.gguf_file import GGUFFile
from engine.train.ratings import RewardError, load_ratings, parse_rating, rating_from_stars
from engine.train.reward_session import RewardConfig, RewardSession
from engine.train.rewards import group_advantages, reward_weights
from engine.train.trainer import TrainConfig, Trainer

DEMO = Path(__file__).parents[2] / "resources/demo/demo.gguf"
ROOT = Path(__file__).parents[2]
OPEN = "Tell me something."  # the demo model answers this in varied ways
NAME = "What is your name?"  # ... and this one always alike


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load(DEMO)


def make(model, tmp_path, **config) -> RewardSession:
    return RewardSession(model, config=RewardConfig(**config), ratings_path=str(tmp_path / "rated.jsonl"))


def varied_round(session: RewardSession, n_distinct: int = 3) -> list:
    """generate() with the first seed whose answers hold at least `n_distinct` different texts."""
    for seed in range(20):
        answers = session.generate(OPEN, seed=seed)
        if len({a.text for a in answers}) >= n_distinct:
            return answers
    raise AssertionError("the demo model gave too few different answers")


def rate_distinct(session: RewardSession, answers, values) -> dict[str, float]:
    """Rate each distinct text with the next value (equal texts equally); returns text -> reward."""
    by_text: dict[str, float] = {}
    for a in answers:
        if a.text not in by_text and len(by_text) < len(values):
            by_text[a.text] = values[len(by_text)]
        if a.text in by_text:
            session.rate(a.index, by_text[a.text])
    return by_text


def answer_ce(session: RewardSession, text: str, prompt: str = OPEN) -> np.ndarray:
    """Per-token cross-entropy (float64) of `text` as the answer to `prompt`, with the current adapter."""
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]
    sample, _ = parse_sample({"messages": messages})
    (enc,), _ = encode_samples([sample], session.tokenizer, session.template, EncodeOptions(256))
    logits = session.model.forward(enc.tokens.astype(np.int64), lora=session.trainable.terms())
    z = logits.astype(np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    t = np.flatnonzero(enc.trained[1:])  # position t predicts trained token t + 1
    return -logp[t, enc.tokens[t + 1]]


def greedy(session: RewardSession, prompt: str) -> str:
    ids = session._prompt_ids(session._messages(prompt, None))
    out = generate(session.model, ids, sampling=GREEDY, stop_ids=session.tokenizer.eot_ids,
                   lora=session.trainable.terms())  # fmt: skip
    return session.tokenizer.decode(list(out[0].tokens))


def lines(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]


# --- ratings typed by people --------------------------------------------------------------------


def test_rating_from_stars_maps_one_to_five_onto_minus_one_to_one():
    assert [rating_from_stars(s) for s in range(1, 6)] == [-1.0, -0.5, 0.0, 0.5, 1.0]
    for bad in (0, 6, -1, True, 2.5, "3"):
        with pytest.raises(ValueError, match="1 to 5"):
            rating_from_stars(bad)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", -1.0), ("2", -0.5), ("3", 0.0), ("4", 0.5), ("5", 1.0), (" 5\n", 1.0),  # stars
        ("+1", 1.0), ("1.0", 1.0), ("-1", -1.0), ("0", 0.0), ("-0", 0.0), ("0.25", 0.25), ("-.5", -0.5),
        ("", None), ("  ", None), ("s", None), ("S", None), ("skip", None), ("Skip", None),
    ],
)  # fmt: skip
def test_parse_rating_accepts_stars_rewards_and_skips(text, value):
    got = parse_rating(text)
    assert got == value
    if value is not None:
        assert isinstance(got, float) and math.copysign(1.0, got) == math.copysign(1.0, value)


@pytest.mark.parametrize("text", ["6", "0.5.1", "1.5", "-2", "2.0", "nan", "inf", "good", "q", "+6", "1 2"])
def test_parse_rating_rejects_the_rest_saying_what_is_accepted(text):
    with pytest.raises(ValueError, match="accepted: 1-5 stars") as info:
        parse_rating(text)
    assert repr(text.strip()) in str(info.value)


def test_config_is_checked():
    with pytest.raises(RewardError, match="'ppo' is not one of weighted, group"):
        RewardConfig(mode="ppo")
    with pytest.raises(RewardError, match=r"n_samples must be in 1\.\.1024, got 0"):
        RewardConfig(n_samples=0)
    with pytest.raises(RewardError, match=r"kl_coef must be in \[0, 1000\], got -0.1"):
        RewardConfig(kl_coef=-0.1)
    with pytest.raises(RewardError, match="lr must be a finite number"):
        RewardConfig(lr=float("nan"))


# --- the two modes' math ------------------------------------------------------------------------


def test_weighted_mode_weights_are_min_max_scaled_and_the_loss_is_their_token_weighted_ce(model, tmp_path):
    s = make(model, tmp_path, mode="weighted", lr=1e-2)
    answers = varied_round(s)
    rewards = rate_distinct(s, answers, [1.0, -1.0, 0.5])
    skipped = next((a.index for a in answers if a.text not in rewards), None)
    p = s.preview()
    expected = reward_weights([s.ratings[a.index] for a in answers if s.ratings[a.index] is not None])
    got = [w for w in p.weights if w is not None]
    np.testing.assert_allclose(got, expected)
    assert not p.no_signal and p.n_rated == sum(r is not None for r in s.ratings)
    worst = next(a for a in answers if rewards.get(a.text) == -1.0)
    assert p.weights[worst.index] == 0.0  # ignored, never pushed down
    if skipped is not None:
        assert p.weights[skipped] is None
    # loss = sum_i w_i * sum_t ce_it / (answer tokens of all rated answers), before the step
    ce = {a.index: answer_ce(s, a.text) for a in answers if s.ratings[a.index] is not None}
    n_tokens = sum(len(c) for c in ce.values())
    want = sum(p.weights[i] * c.sum() for i, c in ce.items()) / n_tokens
    result = s.apply()
    assert result.applied and result.step == 1 == s.step
    assert result.loss == pytest.approx(want, rel=1e-4)
    assert result.mean_reward == pytest.approx(np.mean([s.ratings[i] for i in ce]))
    # the best answer gained, the worst (weight 0) got no push down of its own
    best = next(a for a in answers if rewards.get(a.text) == 1.0)
    assert answer_ce(s, best.text).mean() < ce[best.index].mean()


def test_group_mode_advantages_push_the_best_up_and_the_worst_down(model, tmp_path):
    s = make(model, tmp_path, mode="group", lr=1e-2)
    answers = varied_round(s)
    rewards = rate_distinct(s, answers, [1.0, -1.0, 0.0])
    p = s.preview()
    rated = [a.index for a in answers if s.ratings[a.index] is not None]
    r = np.array([s.ratings[i] for i in rated])
    want_adv = (r - r.mean()) / (r.std() + 1e-6)
    np.testing.assert_allclose([p.weights[i] for i in rated], want_adv, rtol=1e-12)
    np.testing.assert_allclose([p.weights[i] for i in rated], group_advantages(r, [0] * len(r)))
    assert sum(p.weights[i] for i in rated) == pytest.approx(0.0, abs=1e-9)
    assert p.mean == pytest.approx(r.mean()) and p.std == pytest.approx(r.std())
    # loss = sum_i A_i * mean_t ce_it / n_rated
    ce = {i: answer_ce(s, answers[i].text) for i in rated}
    want = sum(p.weights[i] * ce[i].mean() for i in rated) / len(rated)
    best = next(a.text for a in answers if rewards.get(a.text) == 1.0)
    worst = next(a.text for a in answers if rewards.get(a.text) == -1.0)
    before = answer_ce(s, best).mean(), answer_ce(s, worst).mean()
    result = s.apply()
    assert result.applied and result.loss == pytest.approx(want, rel=1e-4, abs=1e-6)
    after = answer_ce(s, best).mean(), answer_ce(s, worst).mean()
    assert after[0] < before[0], "the top-rated answer's log-likelihood should rise"
    assert after[1] > before[1], "the lowest-rated answer's log-likelihood should fall"


@pytest.mark.parametrize("mode", ["weighted", "group"])
def test_equal_ratings_carry_no_signal_and_take_no_step(model, tmp_path, mode):
    s = make(model, tmp_path, mode=mode)
    answers = s.generate(OPEN, seed=0)
    with pytest.raises(RewardError, match="no answer is rated"):
        s.apply()
    assert s.preview().no_signal and "No answer is rated" in s.preview().message
    s.rate(0, 0.5)
    assert s.preview().no_signal and "Only one answer" in s.preview().message
    for a in answers[1:]:
        s.rate(a.index, 0.5)
    p = s.preview()
    assert p.no_signal and p.message == "All ratings are equal: no signal; rate answers differently."
    before = {k: v.copy() for k, v in s.trainable.params().items()}
    result = s.apply()
    assert not result.applied and result.step == 0 == s.step and math.isnan(result.loss)
    assert result.mean_reward == 0.5 and s.history == [result]
    for k, v in s.trainable.params().items():
        np.testing.assert_array_equal(v, before[k])
    s.rate(1, -0.5)  # a different rating gives a signal: the round can still be applied
    s.config = dataclasses.replace(s.config, lr=2e-3)  # settings changed between rounds apply
    assert not s.preview().no_signal and s.apply().applied and s.step == 1
    assert s.optimizer.cfg.lr == 2e-3
    with pytest.raises(RewardError, match="applied already; generate new answers"):
        s.apply()


def test_kl_term_adds_to_the_loss_once_the_adapter_differs_from_the_base(model, tmp_path):
    first = RewardSession(model, config=RewardConfig(lr=1e-2), ratings_path=str(tmp_path / "a.jsonl"),
                          checkpoint_dir=str(tmp_path / "ckpt"))  # fmt: skip
    rate_distinct(first, varied_round(first), [1.0, -1.0])
    assert first.apply().applied
    ckpt = tmp_path / "ckpt" / "ckpt-000001"
    assert ckpt.is_dir() and (ckpt / "adapter.gguf").is_file()
    losses, updates, answers = {}, {}, {}
    for kl in (0.0, 2.0):
        s = RewardSession(model, adapter=str(ckpt), config=RewardConfig(lr=1e-2, kl_coef=kl),
                          ratings_path=str(tmp_path / f"kl{kl}.jsonl"))  # fmt: skip
        assert (s.step, s.round) == (1, first.round)  # counters come back with the checkpoint
        before = {k: v.copy() for k, v in s.trainable.params().items()}
        answers[kl] = varied_round(s, 2)
        rate_distinct(s, answers[kl], [1.0, -1.0])
        losses[kl] = s.apply().loss
        updates[kl] = sum(float(np.sum((v - before[k]) ** 2)) for k, v in s.trainable.params().items())
    assert answers[0.0] == answers[2.0]  # the same adapter and seeds: the same round
    assert math.isfinite(losses[2.0]) and math.isfinite(losses[0.0])
    assert losses[2.0] > losses[0.0] + 1e-6  # KL(adapter || base) > 0 and enters with weight |A|
    assert updates[0.0] > 0 and updates[2.0] > 0


# --- ratings on disk --------------------------------------------------------------------------------


def test_every_rating_is_on_disk_before_apply_and_the_file_is_a_dataset(model, tmp_path):
    s = make(model, tmp_path, mode="group")
    path = tmp_path / "rated.jsonl"
    answers = s.generate(OPEN, seed=1, system="Be brief.")
    s.rate(0, 1.0)
    (line,) = lines(path)  # on disk at once: no apply, no close
    assert line["reward"] == 1.0 and line["prompt"] == OPEN and line["answer"] == 0
    assert line["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": OPEN},
        {"role": "assistant", "content": answers[0].text},
    ]
    assert (line["mode"], line["round"], line["step"], line["adapter"]) == ("group", 1, 0, None)
    assert line["session"] == s.session_id and line["stop_reason"] == answers[0].stop_reason
    s.rate(1, -1.0)
    s.rate(1, -0.5)  # re-rated: a new line, the later one wins
    s.rate(2, None)  # a skip is not a rating: nothing written
    s.correct(3, "A fish swims in the sea.")
    rows = lines(path)
    assert [r["reward"] for r in rows] == [1.0, -1.0, -0.5, 1.0]
    assert rows[-1]["corrected"] is True and rows[-1]["original"] == answers[3].text
    assert rows[-1]["messages"][-1]["content"] == "A fish swims in the sea."
    with pytest.raises(RewardError, match=r"in \[-1, 1\]"):
        s.rate(0, 3)
    assert len(lines(path)) == 4  # a refused rating writes nothing
    samples, problems = load_jsonl(path)
    assert problems == [] and len(samples) == 4 and len({x.group for x in samples}) == 1
    kept, problems = load_ratings(path)
    assert problems == [] and [x.reward for x in kept] == [1.0, -0.5, 1.0]
    done = Trainer(model, str(path), TrainConfig(reward_mode="group", steps=2, rank=4, n_ctx=128)).run()
    assert type(done).__name__ == "Finished" and done.step == 2 and math.isfinite(done.final_loss)


def test_a_session_killed_mid_round_loses_no_rating(tmp_path):
    path = tmp_path / "rated.jsonl"
    script = textwrap.dedent(f"""
        import os, signal
        from engine.train.reward_session import RewardSession
        s = RewardSession({str(DEMO)!r}, ratings_path={str(path)!r})
        s.generate({OPEN!r}, seed=0)
        s.rate(0, 1.0)
        s.rate(1, -0.5)
        s.correct(2, "Fish can swim.")
        os.kill(os.getpid(), signal.SIGKILL)  # no apply, no clean exit
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    rows = lines(path)
    assert [(r["answer"], r["reward"], r.get("corrected", False)) for r in rows] == [
        (0, 1.0, False), (1, -0.5, False), (2, 1.0, True),
    ]  # fmt: skip
    for r in rows:
        assert {"messages", "reward", "mode", "step", "round", "adapter", "prompt"} <= set(r)
    assert load_jsonl(path)[1] == []


def test_misuse_is_refused_with_what_to_do(model, tmp_path):
    s = make(model, tmp_path)
    with pytest.raises(RewardError, match="generate answers first"):
        s.rate(0, 1.0)
    with pytest.raises(RewardError, match="generate answers"):
        s.apply()
    with pytest.raises(RewardError, match="prompt must be non-empty"):
        s.generate("  ")
    s.generate(OPEN, n=2, seed=0)
    with pytest.raises(RewardError, match=r"outside 0\.\.1"):
        s.rate(2, 1.0)
    with pytest.raises(RewardError, match="non-empty"):
        s.correct(0, "")
    s.rate(0, 1.0)
    s.rate(0, None)  # withdrawn from the round's step
    assert s.ratings == [None, None] and s.preview().n_rated == 0
    with pytest.raises(RewardError, match="ratings file cannot be written"):
        RewardSession(model, ratings_path=str(tmp_path / "missing" / "rated.jsonl"))


# --- fine-tuning the demo model -----------------------------------------------------------------------


def test_corrections_teach_the_demo_model_a_new_answer(model, tmp_path):
    config = RewardConfig(mode="group", lr=5e-3)
    s = RewardSession(model, config=config, ratings_path=str(tmp_path / "r.jsonl"),
                      checkpoint_dir=str(tmp_path / "ckpt"))  # fmt: skip
    assert greedy(s, NAME) == "I am the Tune Studio demo model."
    assert s.base_answer(OPEN, seed=5) == s.adapter_answer(OPEN, seed=5)  # B = 0 at the start
    for _ in range(30):
        answers = s.generate(NAME)
        s.correct(0, "My name is Tuna.")
        for a in answers[1:]:
            s.rate(a.index, -1.0)
        assert s.apply().applied
        if greedy(s, NAME) == "My name is Tuna.":
            break
    assert "My name is Tuna." in greedy(s, NAME)
    assert greedy(s, "What color is the sky?") == "The sky is blue."  # the rest is kept
    assert s.base_answer(NAME, seed=0).text == "I am the Tune Studio demo model."
    assert s.adapter_answer(NAME, seed=0).text != s.base_answer(NAME, seed=0).text
    # each round's lines name the checkpoint that generated its answers
    rows = lines(tmp_path / "r.jsonl")
    assert rows[0]["adapter"] is None and rows[0]["step"] == 0
    assert rows[-1]["adapter"] == str(tmp_path / "ckpt" / f"ckpt-{s.step - 1:06d}")
    # the saved adapter gives the same answer and says how it was made
    out = s.save_adapter(str(tmp_path / "tuna.gguf"))
    adapter = LoraAdapter.load(out, model)
    ids = s._prompt_ids(s._messages(NAME, None))
    g = generate(model, ids, sampling=GREEDY, stop_ids=s.tokenizer.eot_ids, lora=adapter.terms())
    assert s.tokenizer.decode(list(g[0].tokens)) == greedy(s, NAME)
    md = GGUFFile(out).metadata
    assert md["training.reward_mode"] == "group" and md["training.steps"] == s.step
    assert md["training.rounds"] == s.round and md["training.ratings_file"] == "r.jsonl"


# --- tune-engine reward ------------------------------------------------------------------------------


def run_cli(monkeypatch, capsys, argv: list[str], stdin: str) -> tuple[int, str, str]:
    from engine.cli.reward import add_command

    parser = argparse.ArgumentParser(prog="tune-engine")
    add_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = args.func(args)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_rates_from_stdin_and_writes_ratings_and_adapter(model, tmp_path, monkeypatch, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{OPEN}\n\n{NAME}\n", encoding="utf-8")
    ratings, out = tmp_path / "rated.jsonl", tmp_path / "out.gguf"
    argv = ["reward", str(DEMO), "--prompts", str(prompts), "--samples", "3", "--ratings", str(ratings),
            "--mode", "weighted", "--lr", "1e-2", "--out", str(out), "-n", "24"]  # fmt: skip
    rc, stdout, stderr = run_cli(monkeypatch, capsys, argv, "5\n+1\nnope\n1\n\n-0.5\n")
    assert rc == 0
    assert "=== prompt 1/2: Tell me something." in stdout and "=== prompt 2/2: What is your name?" in stdout
    assert "--- answer 3 (" in stdout
    assert "ratings: +1.00, +1.00, skip" in stdout and "ratings: -1.00, skip, -0.50" in stdout
    assert "warning: answer 3: 'nope' is not a rating; accepted: 1-5 stars" in stderr
    assert "All ratings are equal: no signal" in stdout and "no step" in stdout
    assert "round 2: mean reward -0.750, loss " in stdout and "step 1" in stdout
    rows = lines(ratings)
    assert [r["reward"] for r in rows] == [1.0, 1.0, -1.0, -0.5]
    assert [r["round"] for r in rows] == [1, 1, 2, 2] and rows[2]["prompt"] == NAME
    assert f"adapter: {out} (1 steps in 2 rounds)" in stdout
    adapter = LoraAdapter.load(out, model)
    assert adapter.rank(next(iter(adapter.pairs))) == 8
    assert any(np.any(B != 0) for _, B in adapter.pairs.values())
    assert GGUFFile(out).metadata["training.steps"] == 1


def test_cli_end_of_input_writes_what_was_applied(model, tmp_path, monkeypatch, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{OPEN}\n{NAME}\n", encoding="utf-8")
    out = tmp_path / "out.gguf"
    argv = ["reward", str(DEMO), "--prompts", str(prompts), "--samples", "2",
            "--ratings", str(tmp_path / "r.jsonl"), "--out", str(out), "-n", "16"]  # fmt: skip
    rc, stdout, stderr = run_cli(monkeypatch, capsys, argv, "1.0\n")  # ends after one rating
    assert rc == 0 and "end of input" in stderr
    assert out.is_file() and "(0 steps in 1 rounds)" in stdout
    assert [r["reward"] for r in lines(tmp_path / "r.jsonl")] == [1.0]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(RewardError, match="no prompt in the file"):
        run_cli(monkeypatch, capsys, [*argv[:2], "--prompts", str(empty), *argv[4:]], "")


def test_cli_options_and_defaults():
    # engine/cli.py belongs to the CLI; this only checks that add_command builds a working parser
    from engine.cli.reward import add_command

    parser = argparse.ArgumentParser()
    add_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["reward", "m.gguf", "--prompts", "p", "--ratings", "r", "--out", "o"])
    assert (args.mode, args.samples, args.lr, args.targets, args.rank, args.temp, args.n) == (
        "group", 4, 1e-3, "all", 8, 0.9, 64,
    )  # fmt: skip
    assert os.path.basename(args.model) == "m.gguf"


def test_cli_ctrl_c_writes_the_adapter_then_stops(model, tmp_path, monkeypatch, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{OPEN}\n", encoding="utf-8")
    out = tmp_path / "out.gguf"

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(RewardSession, "apply", interrupted)
    argv = ["reward", str(DEMO), "--prompts", str(prompts), "--samples", "2",
            "--ratings", str(tmp_path / "r.jsonl"), "--out", str(out), "-n", "16"]  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        run_cli(monkeypatch, capsys, argv, "5\n1\n")
    assert out.is_file() and GGUFFile(out).metadata["training.steps"] == 0
    assert [r["reward"] for r in lines(tmp_path / "r.jsonl")] == [1.0, -1.0]
    assert "interrupted: writing what was applied so far" in capsys.readouterr().err


def test_applied_rounds_leave_a_record_in_the_run_history(model, tmp_path):
    from engine import find_runs, latest_finished

    s = RewardSession(model, config=RewardConfig(lr=1e-2), ratings_path=str(tmp_path / "r.jsonl"),
                      checkpoint_dir=str(tmp_path / "reward-checkpoints"))  # fmt: skip
    for _ in range(2):
        answers = varied_round(s)
        rate_distinct(s, answers, [1.0, -1.0, 0.5])
        s.apply()
    [rec] = find_runs([str(tmp_path)])
    assert rec.kind == "rewards" and rec.steps_done == 2 and len(rec.losses) == 2
    assert rec.adapter.endswith("ckpt-000002/adapter.gguf") and os.path.exists(rec.adapter)
    assert latest_finished([rec]) is rec and "rating rounds" in rec.label
