"""The Chat page's decisions without Qt (studio.pages.chat.controller, studio.pages.generation): the
conversation, the Base / Adapter toggle and the adapter box, what the buttons offer while a job runs,
the texts of a failure, a seed, a comparison and a wait, and the stream between worker and UI."""

from __future__ import annotations

import subprocess
import sys
import threading

from engine import RUN
from studio.pages.chat import controller as chat
from studio.pages.chat.controller import BASE, ChatController
from studio.pages.generation import StreamBuffer, chat_messages, describe, invalid_setting


def test_the_controllers_load_without_qt():
    """A fresh interpreter imports the pages' controllers and never loads Qt or pyqtgraph."""
    names = ("studio.pages.generation", "studio.pages.chat.controller", "studio.pages.rewards.controller")
    qt = "sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph'))"
    code = f"import sys; import {', '.join(names)}; print({qt})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_conversation_is_system_history_then_the_new_turn():
    c = ChatController()
    assert c.messages_for("", "Hi") == [{"role": "user", "content": "Hi"}]
    c.answered("Hi", "Hello!")
    assert c.turns() == 1
    assert c.messages_for("Be brief.", "And?") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "And?"},
    ]
    assert c.last_prompt("typed", "compare") == "Hi"  # the last message sent wins over what is typed
    assert ChatController().last_prompt("  typed ", "compare") == "typed"
    assert ChatController().last_prompt("", " compare ") == "compare"
    assert chat_messages(None, "Q") == [{"role": "user", "content": "Q"}]


def test_the_adapter_list_and_the_toggle():
    c = ChatController()
    assert c.adapter("/a.gguf") is None  # the toggle is off: the base model answers
    c.adapter_changed("/a.gguf")
    assert c.use_adapter and c.adapter("/a.gguf") == "/a.gguf" and c.adapter(RUN) == RUN
    assert c.toggle(False, "/a.gguf", None) is None and not c.use_adapter  # Base
    assert c.toggle(True, "/a.gguf", None) is None and c.use_adapter  # Adapter, an adapter chosen
    c.adapter_changed(BASE)
    assert not c.use_adapter and c.adapter(BASE) is None
    # Adapter on the base model's entry: the list goes back to the last adapter chosen
    assert c.toggle(True, BASE, "/default.gguf") == "/a.gguf"
    fresh = ChatController()
    assert fresh.toggle(True, BASE, "/default.gguf") == "/default.gguf"  # else the default run's
    none = ChatController()
    assert none.toggle(True, BASE, None) is None and not none.use_adapter
    view = none.adapter_view(BASE, None, "")
    assert view.note == "Choose an adapter in the list first." and not view.use_adapter
    none.adapter_changed(BASE)
    assert none.adapter_view(BASE, None, "").note == ""


def test_the_adapter_box_says_what_answers_and_what_can_be_handed_on():
    c = ChatController()
    c.adapter_changed("/a.gguf")
    v = c.adapter_view("/a.gguf", "/a.gguf", "")
    assert v.use_adapter and v.export and v.rate and v.note == "/a.gguf" and v.note_tip == "/a.gguf"
    assert not c.adapter_view("/a.gguf", "/a.gguf", "chat").export  # nothing is handed on while busy
    c.toggle(False, "/a.gguf", None)
    assert "Answering with the base model" in c.adapter_view("/a.gguf", "/a.gguf", "").note
    c.adapter_changed(RUN)
    v = c.adapter_view(RUN, None, "")
    assert not v.export and not v.rate and "trained so far" in v.note
    assert (
        chat.rate_request(RUN) is None and chat.rate_request(BASE) == "" and chat.rate_request("/a") == "/a"
    )
    assert chat.export_request(None) is None and chat.export_request("/a") == "/a"
    assert chat.compare_adapter(BASE) is None and chat.compare_adapter(RUN) == RUN


def test_what_the_buttons_offer_in_each_state():
    assert chat.controls("") == chat.Controls(send=True, stop=False, compare_stop=False, adapter=True)
    assert chat.controls("chat") == chat.Controls(send=False, stop=True, compare_stop=False, adapter=False)
    assert chat.controls("compare") == chat.Controls(send=False, stop=False, compare_stop=True, adapter=False)


def test_labels_and_texts():
    assert chat.adapter_name("run-1", "rewards", "x") == "run-1 (reward-tuned)"
    assert chat.adapter_name("run-1", "sft", "x") == "run-1"
    assert chat.adapter_name(None, None, "File · a.gguf") == "a.gguf"
    assert chat.adapter_name(None, None, "Latest finished: b") == "b"
    assert chat.adapter_label(None, "n") == "Base model"
    assert chat.adapter_label(RUN, "n") == "Live adapter of the training run"
    assert chat.adapter_label("/a", "n") == "Adapter · n"
    assert chat.seed_note(1, "Base model", 11) == "1 turn · last answer: base model, seed 11"
    assert chat.seed_note(2, "Adapter · n", None) == "2 turns · last answer: adapter · n, a random seed"
    assert "New chat" in chat.failure_text("the prompt does not fit in the context", None)
    assert "Train page" in chat.failure_text("no run", RUN)
    assert "another adapter" in chat.failure_text("bad", "/a.gguf")
    assert chat.failure_text("boom", None).startswith("Could not answer: boom. Check the model")
    assert chat.compare_status(3, ["a", "a"]).endswith("does not change this one.")
    assert chat.compare_status(3, ["a", "b"]) == "Seed 3, the same sampling for both. The answers differ."
    assert chat.compare_status(3, ["a"]) == "Stopped."
    assert chat.waiting_text([]) is None
    assert "(training)" in chat.waiting_text([("loading", "queued"), ("training", "running")])
    assert "(loading)" in chat.waiting_text([("loading", "queued")])
    assert chat.placeholder(None, "x", "C", "N").startswith("No model is open")
    assert chat.placeholder("/m/model.gguf", "the base model", "C", "N").startswith(
        "Chat with model.gguf (the base model)."
    )
    assert chat.blind_extra(5, "/m/model.gguf") == {
        "source": "chat side by side",
        "seed": 5,
        "model": "model.gguf",
    }
    assert describe(MemoryError()).startswith("out of memory") and describe(ValueError()) == "ValueError"
    assert invalid_setting("t < 0", "right", "try again") == (
        "A sampling setting is not valid: t < 0. Fix it on the right, then try again."
    )
    assert invalid_setting("x", "left") == "A sampling setting is not valid: x. Fix it on the left."


def test_the_stream_hands_each_piece_once_in_order_while_a_thread_appends():
    s = StreamBuffer(2)
    s.append(0, "a")
    s.append(1, "x")
    s.append(5, "dropped")  # no such answer
    assert s.take() == {0: ["a"], 1: ["x"]} and s.take() == {}
    s.append(0, "b")
    assert s.take() == {0: ["b"]} and s.total() == 3 and [list(c) for c in s] == [["a", "b"], ["x"]]

    s = StreamBuffer(1)
    n = 20_000
    writer = threading.Thread(target=lambda: [s.append(0, i) for i in range(n)])
    writer.start()
    seen = []
    while writer.is_alive():
        for piece in s.take().get(0, []):
            seen.append(piece)
    writer.join()
    seen += s.take().get(0, [])
    assert seen == list(range(n))
