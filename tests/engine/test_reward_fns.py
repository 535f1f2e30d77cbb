"""Rewards from checks and unattended rounds: every built-in check, a user's Python function loaded
only when picked and its errors per answer, weights and the person's rating as one more source,
prompts datasets with problems by line, group-relative rounds on arithmetic prompts that raise the
mean reward (the demo model), pause and stop, and `tune-engine reward --reward-fn ... --rounds N`."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from engine.errors import DatasetError
from engine.model.model import Model
from engine.model.targets import TargetSpec
from engine.train.reward_fns import CheckError, CheckSpec, Scorer
from engine.train.reward_session import RewardConfig, RewardSession, ScoredGroup
from engine.train.rounds import (
    AutoRounds,
    PromptItem,
    RoundProgress,
    RoundReport,
    RoundsConfig,
    load_prompts,
    missing_references,
    round_table,
)

DEMO = Path(__file__).parents[2] / "resources/demo/demo.gguf"
ARITHMETIC = [(3, 4), (7, 8), (9, 6), (5, 5)]  # the demo model knows sums of small numbers


def test_built_in_checks():
    ref = {"reference": "21"}
    cases = [
        ("exact", "  21 ", 1.0), ("exact", "21.", 0.0),
        ("contains", "the sum is 21!", 1.0), ("contains", "2 1", 0.0),
        ("regex:^[0-9]+$", "123", 1.0), ("regex:^[0-9]+$", "12a", 0.0),
        ("number", "so it is 21.0", 1.0), ("number", "it is 1,021", 0.0), ("number:1", "20.2", 1.0),
        ("number:10%", "23", 1.0), ("number:10%", "24", 0.0), ("number", "no digits", 0.0),
        ("json", '{"a": [1, 2]}', 1.0), ("json", 'here:\n```json\n{"a": 1}\n```', 1.0),
        ("json", "{a: 1}", 0.0),
        ("length:2-4", "abc", 1.0), ("length:2-4", "abcde", 0.0), ("length:3-", "abcdefgh", 1.0),
        ("length:-2", "abc", 0.0),
    ]  # fmt: skip
    for spec, answer, want in cases:
        score = Scorer([spec]).score("q", answer, ref)
        assert score.total == want, (spec, answer, score)
    assert Scorer(["exact:i"]).score("q", " Paris ", {"answer": "paris"}).total == 1.0
    assert Scorer(["contains:i"]).score("q", "It is PARIS.", {"response": "paris"}).total == 1.0
    # weights, and a reference taken from the line's "answer"/"solution"/... when there is no "reference"
    s = Scorer(["exact@2", "length:1-10@0.5"])
    assert s.score("q", "42", {"solution": 42}).total == 2.5
    assert s.labels == ("exact", "length:1-10") and s.describe() == "2 x exact + 0.5 x length:1-10"
    # a check that needs a reference the line does not give: an error of that answer, not a crash
    missing = s.score("q", "42", {})
    assert missing.total is None and "no reference answer" in missing.errors["exact"]
    assert missing.parts == {"exact": None, "length:1-10": 1.0}


@pytest.mark.parametrize(
    "text,why",
    [("regex:(", "not a valid pattern"), ("number:x", "tolerance"), ("length:9-2", "bounds"),
     ("length:5", "bounds"), ("exact:z", ":i"), ("json:x", "no option"), ("ppo", "unknown check")],
)  # fmt: skip
def test_a_check_that_cannot_be_built_is_named(text, why):
    with pytest.raises(CheckError, match=why):
        Scorer([text])


def test_check_texts_read_back():
    for text in ("exact", "regex:^a@b$@0.5", "number:1%@2", "length:10-200", "my_checks.py@3", "json"):
        spec = CheckSpec.parse(text)
        assert CheckSpec.parse(spec.to_text()) == spec
    assert CheckSpec.parse("regex:^a@b$@0.5") == CheckSpec("regex", "^a@b$", 0.5)
    assert CheckSpec.parse("C:/x/checks.py@2") == CheckSpec("python", "C:/x/checks.py", 2.0)


def test_a_users_function_runs_only_when_picked_and_its_errors_are_per_answer(tmp_path):
    marker = tmp_path / "loaded"
    path = tmp_path / "checks.py"
    path.write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('yes')\n"
        "def reward(prompt, answer, **sample):\n"
        "    if answer == 'boom':\n"
        "        return 1 / 0\n"
        "    if answer == 'text':\n"
        "        return 'good'\n"
        "    return float(answer == sample['reference']) + 0.1 * sample.get('bonus', 0)\n",
        encoding="utf-8",
    )
    spec = CheckSpec.parse(f"{path}@2")
    assert spec.name == "python" and not marker.exists()  # naming the file runs nothing
    scorer = Scorer([spec])
    assert marker.read_text() == "yes"  # picked: loaded once
    line = {"prompt": "q", "answer": "7", "bonus": 1}  # "answer" is the line's reference: passed as reference
    assert scorer.score("q", "7", line).total == pytest.approx(2.2)
    boom = scorer.score("q", "boom", line)
    assert boom.total is None and boom.errors == {
        "checks.py": "ZeroDivisionError: division by zero (checks.py line 5)"
    }
    text = scorer.score("q", "text", line)
    assert text.total is None and "returned 'good', not a finite number" in text.errors["checks.py"]
    # files that cannot serve as a check say why before any answer is scored
    bad = tmp_path / "bad.py"
    bad.write_text("def reward(prompt, answer:\n    return 1\n", encoding="utf-8")
    with pytest.raises(CheckError, match=r"SyntaxError.*bad.py line 1"):
        Scorer([str(bad)])
    nofn = tmp_path / "nofn.py"
    nofn.write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(CheckError, match="defines no function reward"):
        Scorer([str(nofn)])
    raises = tmp_path / "raises.py"
    raises.write_text("raise SystemExit(3)\n", encoding="utf-8")
    with pytest.raises(CheckError, match="fails when it is loaded: SystemExit"):
        Scorer([str(raises)])


def test_the_persons_rating_is_one_more_source():
    s = Scorer(["exact"], rating_weight=0.5)
    score = s.score("q", "a", {"reference": "a"})
    assert s.combine(score, None) == 1.0 and s.combine(score, -1.0) == 0.5
    assert s.combine(None, 0.25) == 0.25  # no checks this round: the rating alone
    failed = Scorer(["exact"]).score("q", "a", {})
    assert s.combine(failed, 1.0) is None  # a failed check leaves the answer out, rating or not


def test_prompts_files_load_with_problems_by_line(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("What is 2 plus 2?\n\n  Say hi.  \n", encoding="utf-8")
    items, problems = load_prompts(str(text))
    assert [i.prompt for i in items] == ["What is 2 plus 2?", "Say hi."] and not problems
    rows = [
        {"prompt": "a", "reference": "1"},
        {"messages": [{"role": "system", "content": "brief"}, {"role": "user", "content": "b"},
                      {"role": "assistant", "content": "2"}]},
        {"prompt": "c", "response": "3"},
        "{bad json",
        {"messages": [{"role": "assistant", "content": "x"}]},
        {"text": "no prompt"},
        {"prompt": "e"},
    ]  # fmt: skip
    path = tmp_path / "p.jsonl"
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    items, problems = load_prompts(str(path))
    assert [(i.prompt, i.system, i.reference, i.line) for i in items] == [
        ("a", None, "1", 1), ("b", "brief", "2", 2), ("c", None, "3", 3), ("e", None, None, 7),
    ]  # fmt: skip
    assert [p.line for p in problems] == [4, 5, 6]
    warned = missing_references(items, Scorer(["exact"]))
    assert [p.line for p in warned] == [7] and warned[0].severity == "warning"
    assert missing_references(items, Scorer(["json"])) == []
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": "x"}\n', encoding="utf-8")
    with pytest.raises(DatasetError, match="no prompt in the file"):
        load_prompts(str(empty))


@pytest.fixture(scope="module")
def demo() -> Model:
    return Model.load(DEMO)


def _arith_items() -> list[PromptItem]:
    return [PromptItem(f"What is {a} plus {b}?", None, {"reference": f"{a} plus {b} is {a + b}."}, 0)
            for a, b in ARITHMETIC]  # fmt: skip


def _session(demo, tmp_path, **config) -> RewardSession:
    # a hot, narrow sampler: the demo model's answers to these sums are right about 70% of the time
    base = dict(mode="group", lr=1e-2, n_samples=6, temperature=3.0, top_k=4, top_p=1.0, min_p=0.0,
                max_new_tokens=10, n_ctx=40)  # fmt: skip
    base.update(config)
    return RewardSession(demo, targets=TargetSpec(preset="all"), rank=4, alpha=8, config=RewardConfig(**base),
                         ratings_path=str(tmp_path / "scored.jsonl"), seed=0)  # fmt: skip


def test_group_relative_rounds_with_an_exact_match_raise_the_mean_reward(demo, tmp_path):
    session = _session(demo, tmp_path)
    rounds = AutoRounds(
        session, _arith_items(), Scorer(["exact"]), RoundsConfig(rounds=5, prompts_per_round=0)
    )
    events: list = []
    reports = rounds.run(events.append)
    assert [r.round for r in reports] == [1, 2, 3, 4, 5] and all(r.applied for r in reports)
    means = [r.mean for r in reports]
    print(round_table(reports))
    assert sum(means[-2:]) / 2 > means[0] + 0.1, means  # the mean reward rises over the rounds
    assert all(0.0 <= r.no_signal <= 1.0 and r.n_groups == 4 and r.n_answers == 24 for r in reports)
    assert session.step == 5 and rounds.finished
    progress = [e for e in events if isinstance(e, RoundProgress)]
    assert len(progress) == 20 and progress[0] == RoundProgress(1, 5, 1, 4)
    first = reports[0]
    assert first.examples and first.examples[0].reward >= first.examples[-1].reward  # best first, worst last
    # every scored answer is in the ratings file before its step, with its checks
    rows = [json.loads(x) for x in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert len(rows) == 5 * 24 and {r["source"] for r in rows} == {"checks"}
    assert rows[0]["checks"] == {"exact": rows[0]["reward"]} and rows[-1]["round"] == 5


def test_rounds_pause_and_go_on_and_a_stop_takes_no_half_step(demo, tmp_path):
    session = _session(demo, tmp_path, n_samples=2, max_new_tokens=4)
    rounds = AutoRounds(
        session, _arith_items(), Scorer(["exact"]), RoundsConfig(rounds=3, prompts_per_round=2)
    )
    done: list = []
    first = rounds.run(
        done.append, should_pause=lambda: len([e for e in done if isinstance(e, RoundReport)]) >= 1
    )
    assert [r.round for r in first] == [1] and not rounds.finished
    second = rounds.run()  # Resume: the next round, with the next prompts
    assert [r.round for r in second] == [2, 3] and rounds.finished
    assert session.history[-1].prompt == "2 prompts" and len(session.history) == 3
    steps = session.step
    again = AutoRounds(session, _arith_items(), Scorer(["exact"]), RoundsConfig(rounds=3))
    seen: list = []
    assert again.run(seen.append, should_stop=lambda: any(isinstance(e, RoundProgress) for e in seen)) == []
    assert again.stopped and session.step == steps  # stopped while sampling: no step from that round


def test_answers_whose_check_failed_are_left_out_and_flat_groups_take_no_step(demo, tmp_path):
    session = _session(demo, tmp_path)
    flat = ScoredGroup("What is 3 plus 4?", None, (("a", 1.0, {}), ("b", 1.0, {}), ("c", None, {})))
    result = session.apply_groups([flat])
    assert not result.applied and math.isnan(result.loss) and session.step == 0
    assert result.n_rated == 2  # the failed answer is not counted, nor written
    rows = [json.loads(x) for x in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert [r["messages"][-1]["content"] for r in rows] == ["a", "b"]
    varied = ScoredGroup(
        "What is 3 plus 4?", None, (("3 plus 4 is 7.", 1.0, {}), ("3 plus 4 is 9.", 0.0, {}))
    )
    assert session.apply_groups([flat, varied]).applied and session.step == 1


def run_cli(monkeypatch, capsys, argv):
    from engine.cli.main import main

    monkeypatch.setattr(sys, "stdin", None)  # unattended: nothing is read
    rc = main(argv)
    return rc, *capsys.readouterr()


def test_cli_runs_unattended_rounds_with_checks(tmp_path, monkeypatch, capsys):
    prompts = tmp_path / "sums.jsonl"
    rows = [
        {"prompt": f"What is {a} plus {b}?", "reference": f"{a} plus {b} is {a + b}."} for a, b in ARITHMETIC
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]) + "oops\n")
    out, scored = tmp_path / "a.gguf", tmp_path / "scored.jsonl"
    files = ["--ratings", str(scored), "--out", str(out)]
    argv = ["reward", str(DEMO), "--prompts", str(prompts), "--reward-fn", "exact", "--reward-fn",
            "length:1-60@0.1", "--rounds", "2", "--samples", "3", "-n", "8", "--temp", "3", "--top-k", "4",
            "--min-p", "0", *files]  # fmt: skip
    rc, stdout, stderr = run_cli(monkeypatch, capsys, argv)
    assert rc == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("round  mean reward  spread  no signal")
    assert [line.split()[0] for line in lines[1:3]] == ["1", "2"]
    assert "line 3: error: invalid JSON" in stderr and "checks: exact + 0.1 x length:1-60" in stderr
    assert out.is_file() and f"adapter: {out} (" in stdout and " in 2 rounds)" in stdout
    assert len(scored.read_text().splitlines()) == 2 * 2 * 3
    rc, _, stderr = run_cli(monkeypatch, capsys, [*argv[:4], "--rounds", "2", *files])
    assert rc == 2 and "give --reward-fn" in stderr
    rc, _, stderr = run_cli(monkeypatch, capsys, [*argv[:4], "--reward-fn", "regex:(", *files])
    assert rc == 2 and "regex:(: not a valid pattern" in stderr
    missing = str(tmp_path / "none.jsonl")
    rc, _, stderr = run_cli(monkeypatch, capsys, [*argv[:2], "--prompts", missing, *argv[4:]])
    assert rc == 2 and "the prompts file cannot be read" in stderr


def test_checks_and_the_persons_rating_combine_in_a_rated_round(demo, tmp_path):
    session = _session(demo, tmp_path, n_samples=4, temperature=3.0)
    answers = session.generate("What is 3 plus 4?", seed=1)
    assert session.rewards() == [None] * 4  # nothing rated, nothing scored
    scorer = Scorer(["exact"], rating_weight=0.5)
    scores = session.score_answers(scorer, {"reference": "3 plus 4 is 7."})
    exact = [float(a.text.strip() == "3 plus 4 is 7.") for a in answers]
    assert [sc.total for sc in scores] == exact
    session.rate(0, -1.0)  # the person disagrees with the check on answer 0
    rewards = session.rewards()
    assert rewards[0] == exact[0] - 0.5 and rewards[1:] == exact[1:]
    row = [json.loads(x) for x in (tmp_path / "scored.jsonl").read_text().splitlines()][-1]
    assert row["reward"] == -1.0 and row["checks"] == {"exact": exact[0]} and row["check_reward"] == exact[0]
    preview = session.preview()
    assert preview.n_rated == 4  # every scored answer takes part, rated or not
    assert not preview.no_signal and session.apply().applied  # the rating sets answer 0 apart
    # a new round: the checks are not carried over to answers they did not score
    session.generate("What is 3 plus 4?", seed=2)
    assert session.rewards() == [None] * 4
