"""The Rewards page on the demo model: generate answers in the worker, rate them from the keyboard
(and with the mouse controls), the ratings file on disk before Apply, the diagnostics (weights,
no-signal warning), Apply into the history table and plots, a better answer saved as an SFT sample,
side by side, saving the adapter, errors in the page, and screenshots."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QApplication, QHBoxLayout, QListWidget, QMainWindow, QWidget

from engine import Preview, RoundResult, RunRecord, TargetSpec, load_jsonl, lora_shapes, write_adapter
from studio.pages.generation import StreamBuffer
from studio.pages.rewards.cards import AnswerCardWidget
from studio.pages.rewards.page import NEW_ADAPTER, RewardsPage
from studio.pages.rewards.panels import DiagnosticsWidget, PromptPickerDialog, dataset_prompts
from studio.pages.rewards.side_by_side import word_diff_html
from studio.project import Project
from studio.resources import DEMO_DATASET, DEMO_MODEL
from tests.studio.conftest import SMALL, open_page, show_active, submit_text

TIMEOUT_MS = 20_000
PROMPT = "Tell me a fact."  # the demo model answers it variously (the sky: always "The sky is blue.")
SAME_PROMPT = "What color is the sky?"


@pytest.fixture
def page(qtbot, engine, tmp_path, demo_info) -> RewardsPage:
    project = Project()
    project.update(
        model_path=str(DEMO_MODEL), dataset_path=str(DEMO_DATASET), output_dir=str(tmp_path / "out")
    )
    project.update_config(targets=TargetSpec(preset="all"), rank=8, alpha=16.0)
    page = open_page(qtbot, RewardsPage, project, engine, tmp_path, demo_info, (1280, 800))
    yield page
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)


def generate(qtbot, page: RewardsPage, prompt: str = PROMPT, keyboard: bool = False) -> list:
    """Type the prompt and Generate (Ctrl+Enter with keyboard=True); the round's answers."""
    [answers] = submit_text(
        qtbot, page, page.prompt_edit, prompt, page.sig_generated, page.generate, keyboard, TIMEOUT_MS
    )
    # the new cards are shown from Qt's event queue, then the first one takes the focus
    qtbot.waitUntil(lambda: not page.cards or page.cards[0].isVisible(), timeout=TIMEOUT_MS)
    qtbot.wait(1)
    return answers


def focused_card(page: RewardsPage) -> AnswerCardWidget:
    w = QApplication.focusWidget()
    assert isinstance(w, AnswerCardWidget), f"focus is on {w!r}, not on a card"
    return w


def rate_keys(qtbot, page: RewardsPage, keys: str) -> None:
    """Press each key on whichever card has the focus (rating moves the focus on by itself)."""
    for key in keys:
        qtbot.keyClick(focused_card(page), key)


def rating_lines(page: RewardsPage) -> list[dict]:
    with open(page.session.ratings_path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_keyboard_round_generate_rate_apply_into_history(qtbot, page):
    answers = generate(qtbot, page, keyboard=True)
    assert len(answers) == 4 and len(page.cards) == 4
    assert all(c.text == a.text for c, a in zip(page.cards, answers, strict=True))
    assert focused_card(page).index == 0  # ready to rate without touching the mouse

    rate_keys(qtbot, page, "513S")
    s = page.session
    assert s.ratings == [1.0, -1.0, 0.0, None]
    assert [c.state for c in page.cards] == ["rated", "rated", "rated", "skipped"]
    # every rating is on disk before Apply: one line per rating, the skip writes none
    lines = rating_lines(page)
    assert [(r["answer"], r["reward"]) for r in lines] == [(0, 1.0), (1, -1.0), (2, 0.0)]
    assert lines[0]["messages"][-1] == {"role": "assistant", "content": answers[0].text}
    assert s.ratings_path == str(Path(page.project.output_folder()) / "ratings.jsonl")
    assert s.ratings_path in page.ratings_label.toolTip()

    # the preview: group advantages on the cards and in the diagnostics bars
    preview = s.preview()
    assert preview.weights[0] > 0 > preview.weights[1] and preview.weights[3] is None
    assert page.cards[0].weight_label.text() == f"advantage +{preview.weights[0]:.2f}"
    assert page.cards[3].weight_label.text() == ""
    assert [row[0] for row in page.diagnostics.bars.rows] == list(preview.weights)
    assert "3</b> of 4 rated" in page.diagnostics.counts.text()
    assert page.diagnostics.warning.isHidden()

    with qtbot.waitSignal(page.sig_round_applied, timeout=TIMEOUT_MS) as applied:
        qtbot.keyClick(focused_card(page), Qt.Key_Return, Qt.ControlModifier | Qt.ShiftModifier)
    result = applied.args[0]
    assert isinstance(result, RoundResult) and result.applied and result.step == 1
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    assert page.history.model.rowCount() == 1
    assert page.history.model.index(0, 4).data() == "step 1"
    assert page.history.points() == (1, 1)  # one mean reward, one loss
    assert all(c.locked for c in page.cards) and not page.apply_button.isEnabled()
    # the next round starts from the keyboard again
    assert QApplication.focusWidget() is page.prompt_edit
    generate(qtbot, page, keyboard=True)
    assert page.session.round == 2 and not any(c.locked for c in page.cards)


def test_all_equal_ratings_warn_that_there_is_no_signal(qtbot, page):
    generate(qtbot, page)
    rate_keys(qtbot, page, "4")
    assert "one answer" in page.diagnostics.message.text().lower()
    rate_keys(qtbot, page, "444")
    assert page.session.ratings == [0.5] * 4
    assert page.session.preview().no_signal
    assert page.diagnostics.warning.isVisible()
    assert "No signal" in page.diagnostics.warning.text()
    rate_keys(qtbot, page, "")
    page.rate(3, -1.0)  # one different rating brings the signal back
    assert page.diagnostics.warning.isHidden()
    page.rate(3, 0.5)
    assert page.diagnostics.warning.isVisible()
    with qtbot.waitSignal(page.sig_round_applied, timeout=TIMEOUT_MS) as applied:
        assert page.apply()
    assert not applied.args[0].applied  # no step taken
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    assert page.history.model.index(0, 4).data() == "no"
    assert page.history.points() == (1, 0)
    assert "No step was taken" in page.banner_text()


def test_mouse_controls_thumbs_slider_and_skip(qtbot, page):
    generate(qtbot, page)
    c0, c1, c2, c3 = page.cards
    qtbot.mouseClick(c0.up_button, Qt.LeftButton)
    qtbot.mouseClick(c1.down_button, Qt.LeftButton)
    c2.slider.setValue(7)  # 0.35, recorded on release
    assert page.session.ratings[2] is None
    c2.slider.sliderReleased.emit()
    qtbot.mouseClick(c3.star_buttons[3], Qt.LeftButton)  # four stars
    assert page.session.ratings == [1.0, -1.0, 0.35, 0.5]
    assert c2.badge.text() == "+0.35" and c1.badge.text() == "−1.00"
    qtbot.mouseClick(c3.skip_button, Qt.LeftButton)
    assert page.session.ratings[3] is None and c3.state == "skipped" and c3.skip_button.isChecked()
    qtbot.mouseClick(c3.skip_button, Qt.LeftButton)  # press again: back to not rated
    assert c3.state == "unrated" and not c3.skip_button.isChecked()
    # [ and ] nudge the focused card's rating by 0.1 without moving on
    c2.setFocus()
    qtbot.keyClick(c2, Qt.Key_BracketRight)
    assert page.session.ratings[2] == pytest.approx(0.45) and focused_card(page) is c2
    # arrow keys move between the two columns and rows
    qtbot.keyClick(c2, Qt.Key_Right)
    assert focused_card(page) is c3
    qtbot.keyClick(c3, Qt.Key_Up)
    assert focused_card(page) is c1


def test_weighted_mode_shows_loss_weights(qtbot, page):
    generate(qtbot, page)
    rate_keys(qtbot, page, "52")
    page.reward_settings.mode_combo.setCurrentIndex(page.reward_settings.mode_combo.findData("weighted"))
    assert page.session.config.mode == "weighted"
    assert page.cards[0].weight_label.text() == "weight 1.00"
    assert page.cards[1].weight_label.text() == "weight 0.00"
    assert page.diagnostics.bars.kind == "weight"
    assert not page.reward_settings.kl_spin.isEnabled()


def test_edited_answer_is_saved_as_an_sft_sample(qtbot, page):
    generate(qtbot, page)
    card = focused_card(page)
    qtbot.keyClick(card, Qt.Key_E)
    assert card.editing and QApplication.focusWidget() is card.editor
    qtbot.keyClick(card.editor, Qt.Key_Escape)  # Escape closes the editor, nothing is saved
    assert not card.editing and card.corrected is None and focused_card(page) is card
    assert rating_lines(page) == []
    qtbot.keyClick(card, Qt.Key_F2)
    card.editor.clear()
    qtbot.keyClicks(card.editor, "The sky is blue on a clear day.")
    # Ctrl+Enter saves in the editor (it does not generate a new round)
    qtbot.keyClick(card.editor, Qt.Key_Return, Qt.ControlModifier)
    assert not card.editing and card.corrected == "The sky is blue on a clear day."
    assert page.session.corrections == {0: "The sky is blue on a clear day."}
    assert page.session.round == 1
    line = rating_lines(page)[-1]
    assert line["corrected"] is True and line["original"] == card.text
    assert line["messages"][-1] == {"role": "assistant", "content": "The sky is blue on a clear day."}
    samples, problems = load_jsonl(page.session.ratings_path)  # an ordinary dataset
    assert samples[-1].messages[-1]["content"] == "The sky is blue on a clear day." and not problems
    assert "1 better answer" in page.diagnostics.counts.text()
    # a correction alone is enough to apply
    with qtbot.waitSignal(page.sig_round_applied, timeout=TIMEOUT_MS) as applied:
        assert page.apply()
    assert applied.args[0].applied


def test_side_by_side_answers_with_the_same_seed(qtbot, page):
    page.tabs.setCurrentIndex(1)
    sbs = page.side_by_side
    sbs.prompt.setPlainText(PROMPT)
    sbs.seed.setValue(7)
    with qtbot.waitSignal(page.sig_compared, timeout=TIMEOUT_MS) as compared:
        qtbot.mouseClick(sbs.compare_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    base, adapted = compared.args
    assert sbs.base.text.toPlainText() == base.text and base.text
    assert sbs.adapted.text.toPlainText() == adapted.text and adapted.text
    # the same seed gives the same base answer again: the comparison is reproducible
    assert page.session.base_answer(PROMPT, seed=7) == base
    assert "after 0 steps" in sbs.adapted.title.text()


def test_apply_with_nothing_rated_shows_what_to_do(qtbot, page):
    assert not page.apply()
    assert "generate answers" in page.banner_text()
    generate(qtbot, page)
    with qtbot.assertNotEmitted(page.sig_round_applied):
        assert not page.apply()
    assert "Nothing is rated" in page.banner_text() and "press 1–5" in page.banner_text()
    assert page.history.model.rowCount() == 0


def test_unwritable_ratings_file_shows_the_error_and_keeps_the_card_unrated(qtbot, page, tmp_path):
    generate(qtbot, page)
    page.session.ratings_path = str(tmp_path / "gone" / "r.jsonl")  # its folder is missing: appending fails
    rate_keys(qtbot, page, "5")
    assert "The rating was not saved" in page.banner_text() and "Ratings file" in page.banner_text()
    assert page.cards[0].state == "unrated" and page.session.ratings[0] is None
    assert not page.set_ratings_path(str(tmp_path))  # a folder is refused with the reason
    assert "cannot be written" in page.banner_text()
    assert page.set_ratings_path(str(tmp_path / "elsewhere.jsonl"))
    page.rate(0, 1.0)
    assert rating_lines(page)[-1]["reward"] == 1.0 and page.banner_text() == ""


def test_no_model_and_no_prompt_show_errors(qtbot, engine, tmp_path):
    page = RewardsPage(Project(), engine)
    qtbot.addWidget(page)
    assert not page.generate()
    assert "Type a prompt" in page.banner_text()
    page.prompt_edit.setPlainText(PROMPT)
    assert not page.generate()
    assert "No model is open" in page.banner_text() and "Model page" in page.banner_text()


def test_generation_failure_is_shown_and_the_round_kept(qtbot, page):
    page.prompt_edit.setPlainText("x " * 400)  # longer than the demo model's context
    with qtbot.waitSignal(page.sig_error, timeout=TIMEOUT_MS) as error:
        assert page.generate()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    assert error.args[0].startswith("Could not generate answers") and "context" in error.args[0]
    assert "press Generate again" in page.banner_text()
    assert page.session is not None  # the model stays loaded for the next try
    assert page.generate_button.isEnabled() and page.cards == []

    generate(qtbot, page)
    rate_keys(qtbot, page, "52")
    page.prompt_edit.setPlainText("x " * 400)
    with qtbot.waitSignal(page.sig_error, timeout=TIMEOUT_MS):
        assert page.generate()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    # the round that was there comes back with its ratings, still ready to apply
    assert [c.state for c in page.cards] == ["rated", "rated", "unrated", "unrated"]
    assert page.cards[1].rating == -0.5 and page.apply_button.isEnabled()


def test_tokens_stream_into_the_cards_while_generating(qtbot, page, demo_info):
    page._show_placeholder_cards(2)
    ids = demo_info.tokenizer.encode("The sky is", add_special=False)
    page._stream = StreamBuffer(2)  # what the worker fills while a round generates
    for i in ids:
        page._stream.append(0, i)
    page.busy = "generating"
    page._show_stream()
    assert page.cards[0].text == "The sky is" and page.cards[1].text == "…"
    assert page.status_label.text() == f"Generating… {len(ids)} tokens"
    page.busy = ""


def test_another_model_ends_the_session(qtbot, page):
    generate(qtbot, page)
    page.set_model_info(None)
    assert page.session is None and page.cards == [] and page.history.model.rowCount() == 0
    page.project.update(model_path=None)
    assert not page.generate() and "No model is open" in page.banner_text()


def test_prompt_picker_and_word_diff():
    prompts = dataset_prompts(load_jsonl(DEMO_DATASET)[0])
    assert prompts[0] == ("What is your name?", None)
    assert ("What is the capital of Japan?", "You are Tuna, a friendly fish.") in prompts
    assert len(prompts) == len(set(prompts))
    dialog = PromptPickerDialog(prompts)
    dialog.filter.setText("capital japan")
    assert dialog.chosen() == ("What is the capital of Japan?", "You are Tuna, a friendly fish.")
    dialog.filter.setText("no such prompt")
    assert dialog.chosen() is None
    old, new = word_diff_html("The sky is blue.", "The sky is grey.")
    assert "The sky is <span" in old and 'line-through;">blue.</span>' in old
    assert "The sky is <span" in new and ">grey.</span>" in new and "line-through" not in new


def test_save_adapter_and_prompts_from_the_dataset(qtbot, page, tmp_path):
    prompts = page.dataset_prompt_list()
    assert ("What is your name?", None) in prompts
    page.set_prompt(*prompts[0])
    assert page.prompt_edit.toPlainText() == "What is your name?"
    generate(qtbot, page, prompt=prompts[0][0])
    rate_keys(qtbot, page, "51")
    with qtbot.waitSignal(page.sig_round_applied, timeout=TIMEOUT_MS):
        page.apply()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    with qtbot.waitSignal(page.sig_adapter_saved, timeout=TIMEOUT_MS) as saved:
        assert page.save_adapter(str(tmp_path / "rewards"))
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    assert saved.args[0].endswith("rewards.gguf") and os.path.isfile(saved.args[0])
    assert "Adapter saved" in page.banner_text()
    assert "from your ratings: <b>1</b>" in page.adapter_label.text()


def test_screenshots(qtbot, page, shots):
    """Rated cards with the diagnostics and a round in the history; the side-by-side view."""
    qtbot.wait(50)
    assert page.grab().save(str(shots / "rewards_empty.png"))
    page.reward_settings.temp_spin.setValue(
        1.5
    )  # the demo model is sure of its facts: sample widely for variety
    page.reward_settings.top_k_spin.setValue(0)
    page.reward_settings.top_p_spin.setValue(1.0)
    page.reward_settings.min_p_spin.setValue(0.0)
    generate(qtbot, page, prompt="Tell me a fact.")
    rate_keys(qtbot, page, "5134")
    with qtbot.waitSignal(page.sig_round_applied, timeout=TIMEOUT_MS):
        page.apply()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    generate(qtbot, page, prompt="Tell me a fact.")
    rate_keys(qtbot, page, "52")
    card = focused_card(page)
    qtbot.keyClick(card, Qt.Key_E)
    card.editor.clear()
    qtbot.keyClicks(card.editor, "A cow moos, and Tuna swims away.")
    qtbot.keyClick(card.editor, Qt.Key_Return, Qt.ControlModifier)
    qtbot.keyClick(card, Qt.Key_S)
    page.grid.focus_card(1)
    qtbot.wait(100)  # let the layouts settle
    assert page.grab().save(str(shots / "rewards_rate.png"))

    page.tabs.setCurrentIndex(1)
    page.side_by_side.seed.setValue(3)
    with qtbot.waitSignal(page.sig_compared, timeout=TIMEOUT_MS):
        page.side_by_side.compare_button.click()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    qtbot.wait(100)
    assert page.grab().save(str(shots / "rewards_side_by_side.png"))


# --- the keyboard loop --------------------------------------------------------------------------


def test_tab_and_arrows_move_card_to_card_in_order_and_wrap(qtbot, page):
    generate(qtbot, page)
    assert focused_card(page).index == 0
    for expected in (1, 2, 3, 0):  # Tab: the next card in order, round to the first
        qtbot.keyClick(focused_card(page), Qt.Key_Tab)
        assert focused_card(page).index == expected
    qtbot.keyClick(focused_card(page), Qt.Key_Backtab)
    assert focused_card(page).index == 3  # Shift+Tab wraps back to the last
    qtbot.keyClick(focused_card(page), Qt.Key_Left)
    assert focused_card(page).index == 2
    qtbot.keyClick(focused_card(page), Qt.Key_Right)
    assert focused_card(page).index == 3
    assert "next unrated answer by itself" in page.keys_label.text() and "Tab" in page.keys_label.text()


def test_rating_keys_never_reach_the_window(qtbot, page):
    """The window's page list takes a digit as a jump to its page ("4  Train"); a shortcut may be a
    plain key: neither may see a key pressed on the cards, not even while a round is generating."""
    window = QMainWindow()
    qtbot.addWidget(window)
    nav = QListWidget()
    nav.addItems([f"{i + 1}  {n}" for i, n in enumerate(("Model", "Dataset", "Targets", "Train", "Rewards"))])
    nav.setCurrentRow(4)
    fired = []
    for key in ("4", "S", "E", "]"):
        action = QAction(key, window)
        action.setShortcut(key)
        action.triggered.connect(lambda _=False, key=key: fired.append(key))
        window.addAction(action)
    central = QWidget()
    row = QHBoxLayout(central)
    row.addWidget(nav)
    row.addWidget(page, 1)
    window.setCentralWidget(central)
    show_active(qtbot, window, (1280, 800))
    generate(qtbot, page)
    rate_keys(qtbot, page, "4444")  # the last card rated: the focus stays on it
    assert nav.currentRow() == 4 and not fired and page.session.ratings == [0.5] * 4
    card = focused_card(page)
    for key in (Qt.Key_7, Qt.Key_S, Qt.Key_BracketRight, Qt.Key_Tab, Qt.Key_Tab):
        qtbot.keyClick(QApplication.focusWidget(), key)
    assert nav.currentRow() == 4 and not fired and isinstance(QApplication.focusWidget(), AnswerCardWidget)
    # the next round from a card: the cards are off meanwhile, the keys pressed then are still theirs
    page.prompt_edit.setPlainText(PROMPT)
    card.setFocus()
    with qtbot.waitSignal(page.sig_generated, timeout=TIMEOUT_MS):
        assert page.generate()  # the answers come from the event loop: the keys below are pressed before
        assert page.busy and QApplication.focusWidget() is page.grid
        for key in (Qt.Key_4, Qt.Key_2, Qt.Key_Tab, Qt.Key_S):
            qtbot.keyClick(QApplication.focusWidget(), key)
        assert QApplication.focusWidget() is page.grid and nav.currentRow() == 4 and not fired
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: isinstance(QApplication.focusWidget(), AnswerCardWidget), timeout=2000)
    with qtbot.waitSignal(page.sig_generated, timeout=TIMEOUT_MS):  # Ctrl+Enter on a card: Generate
        qtbot.keyClick(focused_card(page), Qt.Key_Return, Qt.ControlModifier)
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    assert nav.currentRow() == 4 and not fired
    window.takeCentralWidget()
    page.setParent(None)


def test_identical_answers_are_marked_and_the_missing_signal_explained(qtbot, page):
    answers = generate(qtbot, page, prompt=SAME_PROMPT)
    assert len({a.text for a in answers}) == 1  # the demo model always says "The sky is blue."
    c0 = page.cards[0]
    assert c0.same_label.isVisible() and c0.same_label.text() == "same as answers 2, 3 and 4"
    assert page.cards[1].same_label.text() == "same as answers 1, 3 and 4"
    warning = page.diagnostics.warning
    assert warning.isVisible() and "all 4 answers are the same text" in warning.text()
    rate_keys(qtbot, page, "51")
    assert "all 4 answers are the same text" in warning.text()  # still the reason, whatever the ratings


def _preview(weights, ratings):
    rated = [r for r in ratings if r is not None]
    mean = sum(rated) / len(rated) if rated else None
    equal = len(set(rated)) <= 1
    return Preview(len(rated), mean, 0.0 if equal else 0.5, tuple(weights), equal, "")


def test_diagnostics_explain_equal_ratings_and_answers_that_cancel(qtbot):
    d = DiagnosticsWidget()
    qtbot.addWidget(d)
    d.resize(260, 500)
    d.show()
    states = ["rated", "rated", "rated", "unrated"]
    d.set_same_answers([[0], [1], [2], [3]], 4)
    d.set_preview(_preview([0, 0, 0, None], [0.5, 0.5, 0.5, None]), "group", states, [0.5, 0.5, 0.5, None])
    text = d.warning.text()
    assert "all 3 rated answers got the same rating (+0.50)" in text and "rating minus the mean" in text
    d.set_preview(_preview([0, 0, 0, None], [0.5, 0.5, 0.5, None]), "weighted", states, [0.5, 0.5, 0.5, None])
    assert "weights relative to each other" in d.warning.text()
    # answers 1 and 3 are one text rated differently: their pulls cancel out
    d.set_same_answers([[0, 2], [1], [3]], 4)
    ratings = [1.0, 0.0, -1.0, None]
    d.set_preview(_preview([1.2, 0, -1.2, None], ratings), "group", states, ratings)
    assert (
        d.warning.isVisible()
        and "Answers 1 and 3 are the same text but rated differently" in d.warning.text()
    )
    d.set_same_answers([[0], [1], [2], [3]], 4)
    d.set_preview(_preview([1.2, 0, -1.2, None], ratings), "group", states, ratings)
    assert d.warning.isHidden()


def test_the_steps_line_says_what_it_counts(qtbot, page):
    generate(qtbot, page)
    assert page.adapter_label.text().startswith(
        "Optimizer steps taken on this page from your ratings: <b>0</b>"
    )


# --- the adapter to continue ------------------------------------------------------------------------


def demo_adapter(path, info, arch="llama") -> str:
    rng = np.random.default_rng(0)
    pairs = {}
    for name in ("blk.0.attn_q.weight", "blk.1.attn_v.weight"):
        a, b = lora_shapes(name, info.tensors[name].shape, 4)
        pairs[name] = (rng.normal(0, 0.3, a).astype(np.float32), rng.normal(0, 0.01, b).astype(np.float32))
    return write_adapter(path, arch, pairs, alpha=8.0)


def write_run(folder, name, model, info, status="finished", done=10) -> RunRecord:
    out = os.path.join(folder, f"{name}.gguf")
    os.makedirs(folder, exist_ok=True)
    demo_adapter(out, info)
    rec = RunRecord(name=name, model=model, status=status, steps_done=done, steps_planned=10, adapter=out)
    rec.write(os.path.join(folder, f"{name}-checkpoints", "run.json"))
    return rec


def test_the_adapter_to_continue_is_the_latest_finished_run_of_the_model(qtbot, page, demo_info, tmp_path):
    out = page.project.output_folder()
    assert page.start_adapter is None and page.adapter_choice.current_data() == NEW_ADAPTER  # no run yet
    finished = write_run(out, "finished-run", demo_info.path, demo_info)
    write_run(out, "stopped-run", demo_info.path, demo_info, status="stopped", done=2)  # newer, stopped
    write_run(out, "other-model-run", str(tmp_path / "other.gguf"), demo_info)
    page.refresh_runs()
    assert page.start_adapter == finished.adapter  # a stopped run never replaces a finished one
    assert page.adapter_choice.current_label().startswith("Latest finished: finished-run")
    entries = {label: enabled for label, _, enabled in page.adapter_choice.entries()}
    other = [label for label in entries if "other-model-run" in label]
    assert other and not entries[other[0]]  # listed, not selectable
    assert "continues <b>finished-run.gguf</b>" in page.adapter_label.text()
    # a round continues it; the reward-tuned adapter becomes a run of its own, labelled so
    generate(qtbot, page)
    assert page.session_start == finished.adapter
    rate_keys(qtbot, page, "51")
    with qtbot.waitSignal(page.sig_round_applied, timeout=TIMEOUT_MS):
        page.apply()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    labels = [label for label, _, _ in page.adapter_choice.entries()]
    assert any(label.startswith("Reward-tuned: rating rounds") for label in labels)
    assert page.adapter_choice.current_path() == finished.adapter  # the session's own, kept by the refresh
    # another model: the session ends and the choice follows the model (none of its runs: a new adapter)
    page.set_model_info(None)
    page.project.update(model_path=str(tmp_path / "other.gguf"))
    page.refresh_runs()
    assert page.session is None and page.adapter_choice.current_label().startswith(
        "Latest finished: other-model"
    )


def test_an_adapter_for_another_model_is_named_before_it_loads(qtbot, page, demo_info, tmp_path):
    foreign = demo_adapter(tmp_path / "qwen.gguf", demo_info, arch="qwen3")
    page.set_adapter(foreign)
    assert "qwen.gguf was made for another model" in page.banner_text()
    assert page.banner.level == "warning"
    page.prompt_edit.setPlainText(PROMPT)
    jobs = len(page.engine.jobs)
    assert not page.generate() and len(page.engine.jobs) == jobs and page.session is None
    assert "qwen3" in page.banner_text() and "demo.gguf" in page.banner_text()
    page.set_adapter(None)  # a new adapter: the warning goes
    assert "made for another model" not in page.banner_text()


# --- the layout ------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1280 - 164, SMALL[0]])
def test_before_you_apply_wraps_at_every_width(qtbot, page, width):
    page.resize(width, 760)
    generate(qtbot, page, prompt=SAME_PROMPT)  # the all-answers-equal warning: the longest text
    qtbot.wait(20)
    d = page.diagnostics
    assert d.warning.isVisible()
    for label in (d.warning.label, d.counts, d.stats, d.message, d.mode_help, d.bars_title):
        if label.isVisible():
            right = label.mapTo(d, label.rect().topRight()).x()
            assert right <= d.width(), (label.text()[:40], right, d.width())
    assert d.width() <= d.parentWidget().width()  # no wider than its scroll area's view


def test_the_page_fits_a_small_window(page):
    hint = page.minimumSizeHint()
    assert hint.width() <= SMALL[0] and hint.height() <= SMALL[1], hint
