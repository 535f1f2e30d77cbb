"""The Chat page on the demo model: a multi-turn conversation with the chat template, tokens shown as
they stream, Stop, New chat with Ctrl+N inside the page (not the window's New project), copying an
answer, the sampling settings, the adapter choice (latest finished run by default, a stopped run
never chosen by itself, an adapter of another model refused before anything loads), the base /
adapter toggle, side by side with one seed, the hand-over signals, and a small window."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import QMainWindow

from engine import RUN, RunRecord, lora_shapes, write_adapter
from studio.pages.chat.page import BASE, ChatPage
from studio.project import Project
from studio.resources import DEMO_MODEL
from tests.studio.conftest import SMALL, open_page, show_active, submit_text

TIMEOUT_MS = 20_000


def demo_adapter(path, info, arch="llama", scale=0.3) -> str:
    rng = np.random.default_rng(1)
    pairs = {}
    for name in ("blk.0.attn_q.weight", "blk.1.attn_v.weight", "blk.2.ffn_down.weight"):
        a, b = lora_shapes(name, info.tensors[name].shape, 4)
        pairs[name] = (rng.normal(0, 0.5, a).astype(np.float32), rng.normal(0, scale, b).astype(np.float32))
    return write_adapter(path, arch, pairs, alpha=8.0)


def record(folder, name, info, status="finished", done=10) -> RunRecord:
    out = os.path.join(folder, f"{name}.gguf")
    demo_adapter(out, info)
    rec = RunRecord(name=name, model=info.path, status=status, steps_done=done, steps_planned=10, adapter=out)
    rec.write(os.path.join(folder, f"{name}-checkpoints", "run.json"))
    return rec


@pytest.fixture
def page(qtbot, engine, tmp_path, demo_info) -> ChatPage:
    out = tmp_path / "out"
    out.mkdir()
    project = Project()
    project.update(model_path=str(DEMO_MODEL), output_dir=str(out))
    page = open_page(qtbot, ChatPage, project, engine, tmp_path, demo_info, (1100, 700))
    yield page
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)


def send(qtbot, page: ChatPage, text: str, keyboard: bool = False):
    return submit_text(qtbot, page, page.input, text, page.sig_answered, page.send, keyboard, TIMEOUT_MS)[0]


def test_a_multi_turn_conversation_streams_and_is_kept(qtbot, page, monkeypatch):
    seen: list[str] = []  # the answer's text at each redraw while it streams
    flush = page._flush

    def spy():
        flush()
        if page._targets:
            seen.append(page._targets[0].text)

    monkeypatch.setattr(page, "_flush", spy)
    page._flush_timer.timeout.disconnect()
    page._flush_timer.timeout.connect(spy)
    page._flush_timer.setInterval(1)
    page.sampling.temp_spin.setValue(0.0)  # greedy: the demo's own answer

    reply = send(qtbot, page, "What is your name?", keyboard=True)
    assert reply.text == "I am the Tune Studio demo model." and reply.stop_reason == "eos"
    streamed = [t for t in seen if t]
    assert streamed and all(reply.text.startswith(t) for t in streamed)  # pieces of the answer, in order
    assert page.input.toPlainText() == ""
    msgs = page.conversation.messages
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[1].text == reply.text
    assert "ended its turn" in msgs[1].meta.text()

    second = send(qtbot, page, "What color is the sky?")
    assert second.text == "The sky is blue."
    assert [m["role"] for m in page.history] == ["user", "assistant", "user", "assistant"]
    # the model was given the whole conversation, rendered by the model's chat template
    assert page.messages_for("Next?")[:2] == [
        {"role": "user", "content": "What is your name?"},
        {"role": "assistant", "content": reply.text},
    ]
    page.system_edit.setPlainText("You are Tuna.")
    assert page.messages_for("Hi")[0] == {"role": "system", "content": "You are Tuna."}
    # copy the last answer
    QGuiApplication.clipboard().clear()
    qtbot.keyClick(page.input, Qt.Key_C, Qt.ControlModifier | Qt.ShiftModifier)
    assert QGuiApplication.clipboard().text() == "The sky is blue."
    qtbot.mouseClick(msgs[1].copy_button, Qt.LeftButton)
    assert QGuiApplication.clipboard().text() == reply.text


def test_ctrl_n_inside_the_page_is_new_chat_not_the_windows_new_project(qtbot, engine, page):
    window = QMainWindow()
    qtbot.addWidget(window)
    new_project = QAction("New project", window)
    new_project.setShortcut(QKeySequence.New)
    fired = []
    new_project.triggered.connect(lambda: fired.append(True))
    window.addAction(new_project)
    window.setCentralWidget(page)
    show_active(qtbot, window)
    send(qtbot, page, "Hello")
    assert page.history
    page.input.setFocus()
    qtbot.keyClick(page.input, Qt.Key_N, Qt.ControlModifier)
    assert page.history == [] and page.conversation.messages == [] and not fired
    window.takeCentralWidget()  # the page's fixture ends it
    page.setParent(None)


def test_coming_to_the_page_puts_the_cursor_in_the_message_box(qtbot, page):
    window = QMainWindow()
    qtbot.addWidget(window)
    window.setCentralWidget(page)
    page.hide()
    show_active(qtbot, window)
    page.show()  # what the window's page stack does on Ctrl+5
    qtbot.waitUntil(page.input.hasFocus, timeout=2000)
    qtbot.keyClicks(window.focusWidget(), "Hi")
    assert page.input.toPlainText() == "Hi"
    page.tabs.setCurrentIndex(1)
    page.hide()
    page.show()
    qtbot.waitUntil(page.compare_prompt.hasFocus, timeout=2000)
    page.tabs.setCurrentIndex(0)
    page.input.clear()
    window.takeCentralWidget()  # the page's fixture ends it
    page.setParent(None)


def _hold_the_engine(page: ChatPage):
    """A job that keeps the engine busy until the returned event is set (training, say)."""
    gate = threading.Event()
    started = threading.Event()

    def hold(session, job):
        started.set()
        gate.wait(10)

    page.engine.submit("holding", hold, needs_session=False)
    assert started.wait(10)
    return gate


def test_stop_ends_the_answer_where_it_is(qtbot, page):
    gate = _hold_the_engine(page)
    page.input.setPlainText("Tell me a fact.")
    assert page.send()
    assert "Waiting for the engine (holding)" in page.status_label.text()
    assert page.stop_button.isEnabled() and not page.send_button.isEnabled()
    page._stop.set()  # Stop pressed once the answer has begun: the flag reaches the generation
    with qtbot.waitSignal(page.sig_answered, timeout=TIMEOUT_MS) as answered:
        gate.set()
    assert answered.args[0].stop_reason == "stopped"
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    assert page.send_button.isEnabled() and "stopped" in page.conversation.messages[-1].meta.text()


def test_stop_before_the_engine_is_free_drops_the_question(qtbot, page):
    gate = _hold_the_engine(page)
    page.input.setPlainText("Tell me a fact.")
    assert page.send()
    qtbot.keyClick(page.input, Qt.Key_Period, Qt.ControlModifier)  # Stop (Ctrl+.) while it waits
    assert not page.is_busy() and page.send_button.isEnabled()
    assert page.conversation.messages == [] and page.history == []
    assert page.input.toPlainText() == "Tell me a fact." and "Stopped before" in page.status_label.text()
    gate.set()
    qtbot.waitUntil(lambda: not page.engine.jobs, timeout=TIMEOUT_MS)
    send(qtbot, page, "What is your name?")  # the page goes on as before
    assert len(page.history) == 2


def test_sampling_settings_have_defaults_and_tooltips(page):
    s = page.sampling
    cfg = s.sampling()
    assert (cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p, cfg.max_new_tokens) == (
        0.8,
        40,
        0.95,
        0.05,
        256,
    )
    assert cfg.seed is None and s.seed_spin.text() == "random"
    for w in (s.temp_spin, s.top_k_spin, s.top_p_spin, s.min_p_spin, s.max_tokens_spin, s.seed_spin):
        assert "Default:" in w.toolTip()
    s.seed_spin.setValue(7)
    assert s.sampling().seed == 7


def test_the_adapter_list_defaults_to_the_latest_finished_run_and_toggles(qtbot, page, demo_info):
    out = page.project.output_folder()
    finished = record(out, "finished-run", demo_info)
    record(out, "stopped-run", demo_info, status="stopped", done=2)  # newer, but stopped
    page.refresh_adapters()
    assert page.adapter() == finished.adapter  # a stopped run is never chosen by itself
    assert page.adapter_label() == "Adapter · finished-run"
    assert page.adapter_choice.current_label() == "Latest finished: finished-run — finished, 10 steps"
    labels = [e[0] for e in page.adapter_choice.entries()]
    assert labels[:2] == ["Base model (no adapter)", "Live adapter of the training run"]
    assert any(t.startswith("stopped-run — stopped at step 2") for t in labels)
    # Ctrl+B switches between the base model and the adapter
    page.input.setFocus()
    qtbot.keyClick(page.input, Qt.Key_B, Qt.ControlModifier)
    assert page.adapter() is None and page.base_toggle.isChecked()
    qtbot.keyClick(page.input, Qt.Key_B, Qt.ControlModifier)
    assert page.adapter() == finished.adapter and page.adapter_toggle.isChecked()
    reply = send(qtbot, page, "What is your name?")
    assert page.conversation.messages[-1].who.full_text() == "Adapter · finished-run"
    assert reply.text
    # the window hands an adapter over when a run ends
    page.set_adapter(None)
    assert page.adapter() is None and page.adapter_choice.current_data() == BASE


def test_adapter_with_no_adapter_to_turn_on_says_to_choose_one(qtbot, page):
    # no run yet: the list holds only the base model and the live adapter
    qtbot.mouseClick(page.adapter_toggle, Qt.LeftButton)
    assert page.adapter() is None and page.base_toggle.isChecked() and not page.adapter_toggle.isChecked()
    assert page.adapter_note.text() == "Choose an adapter in the list first."
    qtbot.keyClick(page.input, Qt.Key_B, Qt.ControlModifier)  # Ctrl+B says the same
    assert page.adapter_note.text() == "Choose an adapter in the list first."


def test_an_adapter_of_another_model_is_refused_before_anything_loads(qtbot, page, tmp_path, demo_info):
    foreign = demo_adapter(tmp_path / "qwen.gguf", demo_info, arch="qwen3")
    page.set_adapter(foreign, "qwen adapter")
    assert page.adapter() == foreign
    page.input.setPlainText("Hello")
    jobs = len(page.engine.jobs)
    assert not page.send()
    assert len(page.engine.jobs) == jobs  # nothing was submitted
    text = page.banner_text()
    assert "qwen.gguf was made for another model" in text and "qwen3" in text and "demo.gguf" in text
    assert page.input.toPlainText() == "Hello"


def test_the_live_adapter_without_a_run_says_what_to_do(qtbot, page):
    page.adapter_choice.set_path(RUN)
    assert page.adapter() == RUN
    page.input.setPlainText("Hello")
    with qtbot.waitSignal(page.sig_error, timeout=TIMEOUT_MS) as error:
        assert page.send()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    assert "no training run has an adapter yet" in error.args[0] and "Train page" in error.args[0]
    assert page.conversation.messages == [] and page.input.toPlainText() == "Hello"


def test_side_by_side_uses_one_seed_for_base_and_adapter(qtbot, page, tmp_path, demo_info):
    adapter = demo_adapter(tmp_path / "strong.gguf", demo_info, scale=2.0)
    page.set_adapter(adapter, "strong")
    page.tabs.setCurrentIndex(1)
    page.compare_prompt.setPlainText("Tell me a fact.")
    page.sampling.seed_spin.setValue(5)
    with qtbot.waitSignal(page.sig_compared, timeout=TIMEOUT_MS) as compared:
        qtbot.keyClick(page.compare_prompt, Qt.Key_Return, Qt.ControlModifier)
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    base, adapted = compared.args
    assert page.base_column.text == base.text and page.adapter_column.text == adapted.text
    assert base.text != adapted.text  # a strong adapter changes the answer
    assert "Seed 5" in page.compare_status.text() and "strong" in page.adapter_column.title.text()
    # the same seed gives the same base answer again
    with qtbot.waitSignal(page.sig_compared, timeout=TIMEOUT_MS) as again:
        assert page.compare()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    assert again.args[0].text == base.text and again.args[1].text == adapted.text


def test_export_and_rate_hand_the_adapter_and_prompt_on(qtbot, page, tmp_path, demo_info):
    assert not page.export_button.isEnabled()  # the base model has no file to export
    adapter = demo_adapter(tmp_path / "a.gguf", demo_info)
    page.set_adapter(adapter, "mine")
    send(qtbot, page, "What is your name?")
    with qtbot.waitSignal(page.sig_export_requested) as export:
        qtbot.mouseClick(page.export_button, Qt.LeftButton)
    assert export.args == [adapter]
    with qtbot.waitSignal(page.sig_rate_requested) as rate:
        qtbot.mouseClick(page.rate_button, Qt.LeftButton)
    assert rate.args == [adapter, "What is your name?"]


def test_no_model_says_where_to_open_one(qtbot, engine, tmp_path):
    page = ChatPage(Project(), engine, settings=QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    qtbot.addWidget(page)
    assert "No model is open" in page.conversation.placeholder.text()
    page.input.setPlainText("Hello")
    assert not page.send() and "Model page" in page.banner_text()


def test_the_page_fits_a_small_window(page):
    hint = page.minimumSizeHint()
    assert hint.width() <= SMALL[0] and hint.height() <= SMALL[1], hint
