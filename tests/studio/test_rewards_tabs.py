"""The Rewards page's A/B and Unattended tabs on the demo model: two answers of the adapter shown blind
and the choice saved as a preference pair; unattended rounds with a built-in check over the dataset's
arithmetic prompts (the table, the plot and the examples filled round by round, Pause then Resume,
Stop, every scored answer in the ratings file), a person's Python check with its error shown, and no
rounds without a check."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt

from engine import RoundReport, load_jsonl, parse_sample
from tests.studio.test_rewards_page import TIMEOUT_MS, page  # noqa: F401 - fixtures

SUMS = [(3, 4), (7, 8), (9, 6), (5, 5)]


def _hot(page) -> None:  # noqa: F811
    """Sampling under which the demo model's sums are right about seven times in ten."""
    s = page.reward_settings
    s.n_spin.setValue(4)
    s.temp_spin.setValue(2.0)
    s.top_k_spin.setValue(4)
    s.top_p_spin.setValue(1.0)
    s.min_p_spin.setValue(0.0)
    s.max_tokens_spin.setValue(10)
    s.lr_spin.setValue(1e-2)


def _sums_dataset(page) -> None:  # noqa: F811
    rows = [{"prompt": f"What is {a} plus {b}?", "response": f"{a} plus {b} is {a + b}."} for a, b in SUMS]
    page.set_dataset_samples([parse_sample(r)[0] for r in rows])


def test_a_blind_pair_of_the_adapters_answers_becomes_a_preference(qtbot, page):  # noqa: F811
    page.tabs.setCurrentWidget(page.ab)
    ab = page.ab
    ab.prompt_edit.setPlainText("Tell me a fact.")
    page.reward_settings.seed_spin.setValue(3)
    with qtbot.waitSignal(page.sig_busy_changed, timeout=TIMEOUT_MS, check_params_cb=lambda b: b == ""):
        qtbot.keyClick(ab.prompt_edit, Qt.Key_Return, Qt.ControlModifier)
    pair = ab.blind.pair
    assert pair is not None and page.session is not None and page.session.round == 0  # no rating round
    assert [ab.blind.columns[k].title.text() for k in "AB"] == ["<b>A</b>", "<b>B</b>"]
    assert pair.a != pair.b and ab.blind.buttons["A"].isEnabled()
    with qtbot.waitSignal(ab.sig_chosen) as chosen:
        qtbot.mouseClick(ab.blind.buttons["A"], Qt.LeftButton)
    assert chosen.args == ["A"]
    [row] = [json.loads(x) for x in open(ab.preferences.path(), encoding="utf-8")]
    assert (row["chosen"], row["rejected"]) == (pair.a, pair.b) and row["source"] == "rewards A/B"
    assert row["messages"] == [{"role": "user", "content": "Tell me a fact."}] and row["seed"] == 3
    assert "seed 3" in ab.blind.columns["A"].title.text() or "answer 2" in ab.blind.columns["A"].title.text()
    assert page.reward_settings.seed_spin.value() == 4  # the next pair samples new answers
    with qtbot.waitSignal(page.sig_train_choices) as train:
        qtbot.mouseClick(ab.train_button, Qt.LeftButton)
    assert train.args == [ab.preferences.path()]


def test_unattended_rounds_with_an_exact_match_run_pause_resume_and_stop(qtbot, page):  # noqa: F811
    _hot(page)
    auto = page.auto
    page.tabs.setCurrentWidget(auto)
    assert auto.source_label.text() == "71 prompts in the dataset"  # the demo dataset's file
    page.tabs.setCurrentIndex(0)
    _sums_dataset(page)  # counted when the tab is shown, not on every change of the dataset
    assert auto.source_label.text() == "71 prompts in the dataset"
    page.tabs.setCurrentWidget(auto)
    assert auto.source_label.text() == "4 prompts in the dataset"  # the samples the rounds will take
    auto.rounds_spin.setValue(4)
    auto.per_round_spin.setValue(0)  # all four prompts each round
    assert auto.checks.specs()[0].name == "exact"  # the default check
    reports: list[RoundReport] = []
    auto.sig_round.connect(reports.append)
    # Pause after the first round ...
    auto.sig_round.connect(lambda r: auto.pause() if r.round == 1 else None)
    with qtbot.waitSignal(
        auto.sig_state_changed, timeout=TIMEOUT_MS, check_params_cb=lambda s: s == "paused"
    ):
        assert auto.start()
        assert page.busy == "rounds" and not page.generate_button.isEnabled()
    paused_at = len(reports)  # the pause takes effect after the round being sampled when it was asked
    assert 1 <= paused_at < 4 and auto.start_button.text() == "Resume"
    assert page.busy == "" and page.session is not None and len(page.session.history) == paused_at
    # ... and go on with the next rounds
    with qtbot.waitSignal(
        auto.sig_state_changed, timeout=TIMEOUT_MS, check_params_cb=lambda s: s == "finished"
    ):
        assert auto.start()
    assert [r.round for r in reports] == [1, 2, 3, 4]
    assert auto.table.rowCount() == 4 and auto.table.item(3, 0).text() == "4"
    assert all(r.n_answers == 16 and r.n_groups == 4 for r in reports)
    x, y = auto.mean_curve.getData()
    assert list(x) == [1, 2, 3, 4] and list(y) == [r.mean for r in reports]
    assert "Done after 4 rounds" in auto.status.text()
    auto.table.selectRow(1)
    text = auto.examples.toPlainText()
    assert text.startswith("Round 2: mean reward") and "prompt: What is" in text and "exact 1" in text
    # every scored answer is in the ratings file, with its check, and the page's history has the rounds
    rows = [json.loads(x) for x in open(page.ratings_path(), encoding="utf-8")]
    assert len(rows) == 4 * 16 and {r["source"] for r in rows} == {"checks"}
    assert rows[0]["checks"]["exact"] in (0.0, 1.0)
    assert len(page.session.history) == 4
    samples, problems = load_jsonl(page.ratings_path())
    assert len(samples) == 64 and not problems
    # Stop while running ends the rounds after what was sampled
    auto.rounds_spin.setValue(50)
    auto.sig_round.connect(lambda r: auto.stop())
    with qtbot.waitSignal(
        auto.sig_state_changed, timeout=TIMEOUT_MS, check_params_cb=lambda s: s == "finished"
    ):
        assert auto.start()
    assert auto.rounds.stopped and auto.table.rowCount() == 1 and "Stopped" in auto.status.text()


def test_a_persons_check_runs_when_started_and_its_errors_are_shown(qtbot, page, tmp_path):  # noqa: F811
    _hot(page)
    _sums_dataset(page)
    auto = page.auto
    auto.rounds_spin.setValue(1)
    auto.per_round_spin.setValue(0)
    marker = tmp_path / "ran"
    check = tmp_path / "my_check.py"
    check.write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('yes')\n"
        "def reward(prompt, answer, **sample):\n"
        "    if prompt == 'What is 3 plus 4?':\n"
        "        raise ValueError('not this one')\n"
        "    return float(answer == sample['reference'])\n",
        encoding="utf-8",
    )
    auto.checks.set_check("exact", False)
    auto.checks.set_python_file(str(check))
    assert not marker.exists()  # picking the file runs nothing
    with qtbot.waitSignal(
        auto.sig_state_changed, timeout=TIMEOUT_MS, check_params_cb=lambda s: s == "finished"
    ):
        assert auto.start()
    assert marker.read_text() == "yes"
    [report] = auto.reports
    assert report.n_answers == 16 and report.n_errors == 4  # the four answers to one prompt
    assert (
        "left out: my_check.py: ValueError: not this one (my_check.py line 5)" in auto.examples.toPlainText()
    )
    assert "my_check.py line 5" in auto.table.item(0, 5).toolTip()
    # nothing ticked: no rounds, and the page says why
    auto.checks.python_box.setChecked(False)
    assert not auto.start() and "Tick at least one check" in page.banner_text()
    # a bad option is named when the rounds start
    auto.checks.set_check("regex", True, "(")
    with qtbot.waitSignal(
        auto.sig_state_changed, timeout=TIMEOUT_MS, check_params_cb=lambda s: s == "failed"
    ):
        assert auto.start()
    assert "regex:(: not a valid pattern" in page.banner_text()


def test_rated_rounds_can_be_scored_by_checks_beside_the_rating(qtbot, page):  # noqa: F811
    _hot(page)
    _sums_dataset(page)  # the prompt's reference comes from the dataset
    page.auto.checks.rating_weight.setValue(0.5)
    page.checks_box.setChecked(True)
    page.prompt_edit.setPlainText("What is 3 plus 4?")
    with qtbot.waitSignal(
        page.sig_busy_changed, timeout=TIMEOUT_MS, check_params_cb=lambda b: b == "scoring"
    ):
        assert page.generate()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    s = page.session
    assert all(sc is not None for sc in s.check_scores) and s.scorer.rating_weight == 0.5
    assert all("checks" in card.meta.text() for card in page.cards)
    exact = [sc.total for sc in s.check_scores]
    assert exact == [float(a.text.strip() == "3 plus 4 is 7.") for a in s.answers]
    # no rating at all: the checks alone can take the step, and a rating moves its answer
    page.rate(0, -1.0)
    assert s.rewards()[0] == exact[0] - 0.5
    with qtbot.waitSignal(page.sig_round_applied, timeout=TIMEOUT_MS) as applied:
        assert page.apply()
    assert applied.args[0].applied and applied.args[0].n_rated == 4
