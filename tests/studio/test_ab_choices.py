"""Blind A/B choices on the Chat page's side by side: the two answers come as A and B in a random order
with nothing streamed (the order would tell), who gave which is shown only after the choice, a
choice is a preference pair on disk at once, a tie or a skip saves nothing; and the journey in the
real window: choices on Chat, "Train on choices", the pairs on the Dataset page, a DPO run."""

from __future__ import annotations

import json
import os
import random

from PySide6.QtCore import QSettings, Qt

from engine import Finished, PreferenceStep, TargetSpec, blind_pair, load_jsonl
from studio.main_window import MainWindow
from studio.pages.chat import page as chat_page
from studio.resources import DEMO_DATASET, DEMO_MODEL
from tests.studio.test_chat_page import TIMEOUT_MS, demo_adapter, page  # noqa: F401 - fixtures

WINDOW_TIMEOUT_MS = 60_000


def compare(qtbot, chat) -> tuple:
    with qtbot.waitSignal(chat.sig_compared, timeout=TIMEOUT_MS) as compared:
        assert chat.compare()
        assert chat.base_column.text == "" and chat.adapter_column.text == ""  # nothing streams
    qtbot.waitUntil(lambda: not chat.is_busy(), timeout=TIMEOUT_MS)
    return compared.args


def test_blind_choices_hide_the_sides_until_chosen_and_save_pairs(
    qtbot,
    page,  # noqa: F811
    tmp_path,
    demo_info,  # noqa: F811
    monkeypatch,
):  # noqa: F811
    adapter = demo_adapter(tmp_path / "strong.gguf", demo_info, scale=2.0)
    page.set_adapter(adapter, "strong")
    page.tabs.setCurrentIndex(1)
    page.blind_check.setChecked(True)
    assert page.compare_stack.currentWidget() is page.blind
    assert not page.train_choices_button.isEnabled()  # nothing chosen yet
    page.compare_prompt.setPlainText("Tell me a fact.")
    page.sampling.seed_spin.setValue(5)
    streamed = []
    page.sig_chosen.connect(streamed.append)
    base, adapted = compare(qtbot, page)
    pair, blind = page.blind.pair, page.blind
    assert {pair.a, pair.b} == {base.text, adapted.text} and base.text != adapted.text
    titles = [blind.columns[k].title.text() for k in "AB"]
    assert titles == ["<b>A</b>", "<b>B</b>"]  # nobody is named before the choice
    assert blind.columns["A"].text.toPlainText() == pair.a
    # B is better, by its key
    blind.columns["B"].text.setFocus()
    qtbot.keyClick(blind.columns["B"].text, Qt.Key_2)
    assert streamed == ["B"] and blind.choice == "B"
    assert "chosen" in blind.columns["B"].title.text() and pair.b_source in blind.columns["B"].title.text()
    path = page.preferences.path()
    assert path == os.path.join(page.project.output_folder(), "preferences.jsonl")
    [row] = [json.loads(x) for x in open(path, encoding="utf-8")]
    assert (row["chosen"], row["rejected"]) == (pair.b, pair.a)
    assert row["messages"] == [{"role": "user", "content": "Tell me a fact."}]
    assert row["chosen_from"] == pair.b_source and row["seed"] == 5
    assert "saved to preferences.jsonl (1 pair" in blind.status.text()
    assert not blind.choose("A")  # one choice per pair
    # a tie and a skip save nothing
    compare(qtbot, page)
    assert blind.choose("tie") and page.preferences.ties == 1
    compare(qtbot, page)
    qtbot.keyClick(blind, Qt.Key_S)
    assert page.preferences.skipped == 1 and blind.choice == "skip"
    samples, problems = load_jsonl(path)
    assert len(samples) == 1 and samples[0].kind == "preference" and not problems
    assert page.train_choices_button.isEnabled() and "1 pair saved" in page.preferences_row.label.text()
    with qtbot.waitSignal(page.sig_train_choices) as train:
        qtbot.mouseClick(page.train_choices_button, Qt.LeftButton)
    assert train.args == [path]
    # the sides are a coin per pair (engine.blind_pair): both orders come up. The coin is seeded
    # here (an unseeded one gave one order six times in a row about once in 32 runs)
    coins = random.Random(0)
    monkeypatch.setattr(chat_page, "blind_pair", lambda a, b, sources: blind_pair(a, b, sources, rng=coins))
    sides = set()
    for seed in range(6):
        page.sampling.seed_spin.setValue(seed)
        compare(qtbot, page)
        sides.add(page.blind.pair.swapped)
        page.blind.choose("skip")
    assert sides == {True, False}


def test_choices_on_chat_become_a_dpo_run_in_the_window(qtbot, tmp_path, demo_info):  # noqa: F811
    w = MainWindow(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))
    w.confirm = lambda title, text: True
    qtbot.addWidget(w)
    w.show()
    try:
        w.project.update(output_dir=str(tmp_path / "runs"))
        with qtbot.waitSignal(w.sig_model_changed, timeout=WINDOW_TIMEOUT_MS):
            assert w.open_model(str(DEMO_MODEL))
        assert w.open_dataset(str(DEMO_DATASET))
        chat = w.chat_page
        adapter = demo_adapter(tmp_path / "strong.gguf", demo_info, scale=2.0)
        chat.set_adapter(adapter, "strong")
        w.show_page_named("Chat")
        chat.tabs.setCurrentIndex(1)
        chat.blind_check.setChecked(True)
        prompts = ["Tell me a fact.", "What is your name?", "What color is the sky?", "Say something."]
        for i, prompt in enumerate(prompts * 2):
            chat.compare_prompt.setPlainText(prompt)
            chat.sampling.seed_spin.setValue(i)
            compare(qtbot, chat)
            pair = chat.blind.pair
            if pair.a != pair.b:
                chat.blind.choose(
                    "A" if "adapter" in pair.a_source else "B"
                )  # the person prefers the adapter
        assert chat.preferences.saved >= 4
        qtbot.mouseClick(chat.train_choices_button, Qt.LeftButton)
        assert w.current_page() is w.train_page
        assert w.project.config.objective == "dpo"
        assert w.dataset_page.document.path == chat.preferences.path()
        assert {s.kind for s in w.dataset_page.samples} == {"preference"}
        train = w.train_page
        w.project.update_config(
            steps=4, n_ctx=128, batch_size=2, lr=5e-3, targets=TargetSpec(preset="attention")
        )
        qtbot.waitUntil(
            lambda: train.check is not None and train.start_button.isEnabled(), timeout=TIMEOUT_MS
        )
        steps = []
        real = train._on_preference
        train._on_preference = lambda e: (steps.append(e), real(e))
        with qtbot.waitSignal(train.sig_run_finished, timeout=WINDOW_TIMEOUT_MS) as done:
            assert train.start()
        result = done.args[0]
        assert isinstance(result, Finished) and result.step == 4
        figures = [e for e in steps if isinstance(e, PreferenceStep)]
        assert [e.step for e in figures] == [1, 2, 3, 4]
        assert figures[0].margin == 0.0 and figures[-1].margin > 0.0  # it learns what the person chose
        tabs = train.plots.tabs
        assert tabs.isTabVisible(tabs.indexOf(train.preference_plots))
        assert result.adapter_path and os.path.isfile(result.adapter_path)
    finally:
        w.engine.shutdown()
