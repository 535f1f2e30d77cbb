"""The Rewards page on the demo model: generate answers in the worker, rate them from the keyboard
(and with the mouse controls), the ratings file on disk before Apply, the diagnostics (weights,
no-signal warning), Apply into the history table and plots, a better answer saved as an SFT sample,
side by side, saving the adapter, errors in the page, and screenshots."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from engine import RoundResult, TargetSpec, load_jsonl
from studio.pages.rewards.cards import AnswerCardWidget
from studio.pages.rewards.page import RewardsPage
from studio.pages.rewards.panels import PromptPickerDialog, dataset_prompts, word_diff_html
from studio.project import ModelInfo, Project
from studio.resources import DEMO_DATASET, DEMO_MODEL

TIMEOUT_MS = 20_000
PROMPT = "What color is the sky?"
SHOTS = Path(os.environ.get("TUNE_STUDIO_SHOTS") or "/tmp/shots_rewards")


@pytest.fixture(scope="module")
def demo_info() -> ModelInfo:
    return ModelInfo.read(str(DEMO_MODEL))


@pytest.fixture
def page(qtbot, engine, tmp_path, demo_info) -> RewardsPage:
    project = Project()
    project.update(
        model_path=str(DEMO_MODEL), dataset_path=str(DEMO_DATASET), output_dir=str(tmp_path / "out")
    )
    project.update_config(targets=TargetSpec(preset="all"), rank=8, alpha=16.0)
    page = RewardsPage(project, engine)
    qtbot.addWidget(page)
    page.set_model_info(demo_info)
    page.resize(1280, 800)
    page.show()
    qtbot.waitExposed(page)
    page.activateWindow()
    qtbot.waitUntil(page.isActiveWindow, timeout=2000)
    yield page
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)


def generate(qtbot, page: RewardsPage, prompt: str = PROMPT, keyboard: bool = False) -> list:
    """Type the prompt and Generate (Ctrl+Enter with keyboard=True); the round's answers."""
    page.prompt_edit.setPlainText(prompt)
    with qtbot.waitSignal(page.sig_generated, timeout=TIMEOUT_MS) as done:
        if keyboard:
            page.prompt_edit.setFocus()
            qtbot.keyClick(page.prompt_edit, Qt.Key_Return, Qt.ControlModifier)
        else:
            assert page.generate()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    # the new cards are shown from Qt's event queue, then the first one takes the focus
    qtbot.waitUntil(lambda: not page.cards or page.cards[0].isVisible(), timeout=TIMEOUT_MS)
    qtbot.wait(1)
    return done.args[0]


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
    page.settings.mode_combo.setCurrentIndex(page.settings.mode_combo.findData("weighted"))
    assert page.session.config.mode == "weighted"
    assert page.cards[0].weight_label.text() == "weight 1.00"
    assert page.cards[1].weight_label.text() == "weight 0.00"
    assert page.diagnostics.bars.kind == "weight"
    assert not page.settings.kl_spin.isEnabled()


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
    page.session.ratings_path = str(tmp_path)  # a folder: appending to it fails
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
    page._stream = [list(ids), []]
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
    assert "1</b> step" in page.adapter_label.text()


def test_screenshots(qtbot, page):
    """Rated cards with the diagnostics and a round in the history; the side-by-side view."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    qtbot.wait(50)
    assert page.grab().save(str(SHOTS / "rewards_empty.png"))
    page.settings.temp_spin.setValue(1.5)  # the demo model is sure of its facts: sample widely for variety
    page.settings.top_k_spin.setValue(0)
    page.settings.top_p_spin.setValue(1.0)
    page.settings.min_p_spin.setValue(0.0)
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
    assert page.grab().save(str(SHOTS / "rewards_rate.png"))

    page.tabs.setCurrentIndex(1)
    page.side_by_side.seed.setValue(3)
    with qtbot.waitSignal(page.sig_compared, timeout=TIMEOUT_MS):
        page.side_by_side.compare_button.click()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    qtbot.wait(100)
    assert page.grab().save(str(SHOTS / "rewards_side_by_side.png"))
