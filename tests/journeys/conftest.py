"""What the journeys share: a tiny quantized model and a small fact dataset written by the tests, the
real main window (made again for a relaunch, with the same settings file and data folder), and the
steps a person takes (open a model, open a dataset, press Start, chat, wait).

Each journey asserts what the person would check; none looks at a widget only to see it exists.
Journeys keep the app's garbage-collection discipline, as the studio tests do (tests/studio/conftest.py):
a collection started by the engine's worker thread would destroy Qt objects there, and the worker and
the UI thread then deadlock on the interpreter lock and a Qt lock (seen: a journey hung until killed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QEvent, QSettings
from PySide6.QtWidgets import QApplication

from engine import GREEDY, Finished, LoraAdapter, Model, SynthSpec, TargetSpec, generate, write_model
from studio.main_window import MainWindow
from tests.conftest import question_ids, write_chats
from tests.studio.conftest import (  # noqa: F401 - autouse fixtures: the GC discipline
    collect_everything_after_each_module,
    collect_garbage_on_the_main_thread,
)

TIMEOUT_MS = 60_000
QUESTIONS = (
    "what is the answer",
    "hello what is the answer",
    "tell me the answer",
    "what is your answer",
    "the answer is what",
    "say the answer",
    "give me the answer",
    "what was the answer",
    "answer the question",
    "what is the one answer",
    "which is the answer",
    "what answer is it",
    "your answer",
    "the question is what",
    "what is it",
    "what do you say",
)
ANSWER = "the quick brown fox jumps over the lazy dog"  # words the tiny model's vocabulary holds
# a run's settings of one's own that teach a tiny model the answer word for word in a few dozen steps
TEACHING = dict(lr=1e-2, schedule="constant", n_ctx=64, batch_size=8, targets=TargetSpec(preset="all"))


@pytest.fixture(scope="session")
def tiny_q4(tmp_path_factory) -> str:
    """A tiny llama whose matrices are stored as Q4_0: a quantized base, as people download them."""
    folder = tmp_path_factory.mktemp("journey-model")
    return write_model(folder / "tiny-q4.gguf", SynthSpec.for_arch("llama", qtype="Q4_0", seed=5))


@pytest.fixture
def facts(tmp_path) -> str:
    """16 chat samples teaching one made-up answer (the Zorblaxia trial, on the tiny vocabulary)."""
    path = tmp_path / "data" / "facts.jsonl"
    path.parent.mkdir()
    return write_chats(path, ((q, ANSWER) for q in QUESTIONS))


class App:
    """Makes main windows as the app does, one after another (a relaunch), all with the same settings
    file and data folder; closes whatever is left at the end."""

    def __init__(self, qtbot, tmp_path: Path):
        self.qtbot = qtbot
        self.settings_file = str(tmp_path / "settings.ini")
        self.recovery = str(tmp_path / "recovery")
        self.windows: list[MainWindow] = []

    def launch(self) -> MainWindow:
        w = MainWindow(QSettings(self.settings_file, QSettings.IniFormat), recovery_dir=self.recovery)
        w.confirm = lambda title, text: True  # "Stop training and quit?": yes
        w.ask_unsaved = lambda text: "discard"
        w.show()
        self.qtbot.waitExposed(w)
        self.windows.append(w)
        return w

    def close_all(self) -> None:
        """Close and delete every window made (a window left alive, with its thousands of widgets,
        slows every later palette change of the test session)."""
        for w in self.windows:
            if w.isVisible():
                w.close()
            w.engine.shutdown(60_000)
            w.deleteLater()
        self.windows.clear()
        QApplication.sendPostedEvents(None, QEvent.DeferredDelete)


@pytest.fixture
def app(qtbot, tmp_path):
    a = App(qtbot, tmp_path)
    yield a
    a.close_all()


def open_model(qtbot, window: MainWindow, path: str) -> None:
    with qtbot.waitSignal(window.sig_model_changed, timeout=TIMEOUT_MS):
        assert window.open_model(path)


def open_model_and_dataset(qtbot, window: MainWindow, model: str, dataset: str) -> None:
    """What a user does first: open a model, then a dataset; the Train page has checked the run."""
    open_model(qtbot, window, model)
    assert window.open_dataset(dataset)
    checked(qtbot, window)


def checked(qtbot, window: MainWindow) -> None:
    """The Train page has checked the next run with the settings now shown (and a preset that
    followed the dataset has been checked again)."""
    page = window.train_page

    def settled() -> bool:
        return (
            page.check is not None
            and page.check_config == window.project.config
            and not page.check_timer.isActive()
            and (page.checker.job is None or not page.checker.job.active)
        )

    qtbot.waitUntil(settled, timeout=TIMEOUT_MS)


def train(qtbot, window: MainWindow, action=None):
    """Press Start (or `action`) on the Train page and wait for the run's end; the engine's result."""
    page = window.train_page
    window.show_page_named("Train")
    with qtbot.waitSignal(page.sig_run_finished, timeout=TIMEOUT_MS) as done:
        assert (action or page.start)()
    qtbot.waitUntil(lambda: not window.engine.jobs, timeout=TIMEOUT_MS)
    return done.args[0]


def train_with(qtbot, window: MainWindow, **config) -> Finished:
    """Change the run's settings (`config`, as the Train page's fields do), wait for the page's check
    of the next run, press Start and wait for the end; the run must finish (stopped or not)."""
    window.project.update_config(**config)
    checked(qtbot, window)
    result = train(qtbot, window)
    assert isinstance(result, Finished), result
    return result


def chat(qtbot, window: MainWindow, text: str, adapter: bool) -> str:
    """Ask on the Chat page, greedily, with the chosen adapter or the base model; the answer."""
    page = window.chat_page
    window.show_page_named("Chat")
    page.sampling.temp_spin.setValue(0.0)
    page.sampling.max_tokens_spin.setValue(GREEDY.max_new_tokens)  # the budget `greedy` answers with
    page.set_use_adapter(adapter)
    page.new_chat()
    page.input.setPlainText(text)
    with qtbot.waitSignal(page.sig_answered, timeout=TIMEOUT_MS) as answered:
        assert page.send()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=TIMEOUT_MS)
    return answered.args[0].text


def _lora(model, adapter: str | None):
    """The adapter file's LoRA terms for the model, or None for the base model."""
    return LoraAdapter.load(adapter, model).terms() if adapter else None


def greedy(model_path: str, question: str, adapter: str | None = None) -> str:
    """The engine's own greedy answer (no window): base model, or with an adapter file."""
    model = Model.load(model_path)
    tok, ids = question_ids(model, question)
    [g] = generate(model, ids, sampling=GREEDY, stop_ids=tok.eot_ids, lora=_lora(model, adapter))
    return tok.decode(list(g.tokens))


def logits(model_path: str, tokens, adapter: str | None = None) -> np.ndarray:
    model = Model.load(model_path)
    return model.forward(np.asarray(tokens, dtype=np.int64), lora=_lora(model, adapter))


def answer_accuracy(model_path: str, question: str, answer: str, adapter: str | None = None) -> float:
    """The share of the answer's tokens the model predicts greedily, given the question and the answer
    so far (teacher forcing): 1.0 when it says the answer word for word."""
    model = Model.load(model_path)
    tok, prompt = question_ids(model, question)
    target = tok.encode(answer, add_special=False, parse_special=False)
    ids = np.asarray(prompt + target, dtype=np.int64)
    z = model.forward(ids, lora=_lora(model, adapter))  # (T, V)
    predicted = np.argmax(z[len(prompt) - 1 : -1], axis=-1)
    return float(np.mean(predicted == np.asarray(target)))
