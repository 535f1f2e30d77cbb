"""Journey: a dataset too large to read on the window's thread. A person opens a model and a file of
3,000 chats: the Dataset page shows the reading with its progress while the window keeps answering,
and nothing of the file is parsed in the window's process (a child process reads it); every row
comes with its token counts, and the Train page's check counts all 3,000 samples. The person edits
an answer in the editor, saves the dataset and the project, and closes the window; a new window
opening the project reads the file in the background again and shows the edit."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from PySide6.QtCore import QTimer

from studio.pages.dataset.page import BACKGROUND_BYTES
from tests.conftest import parsing_threads, write_chats

from .conftest import ANSWER, QUESTIONS, TIMEOUT_MS, checked, open_model

N = 3000


def read_in_the_background(qtbot, window, open_it) -> list[str]:
    """Open the dataset (`open_it()`) and wait for the Dataset page's background read, ticking a 5 ms
    timer as the window's event loop would; the threads of this process that parsed the file (none
    expected)."""
    page = window.dataset_page
    ticks: list[bool] = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(page.loading))
    timer.start(5)
    try:
        with parsing_threads() as parsed_here:
            assert open_it()
            qtbot.waitUntil(lambda: not page.loading and page.model.rowCount() == N, timeout=TIMEOUT_MS)
    finally:
        timer.stop()
    assert ticks.count(True) >= 5  # the window answered while the file was read
    return parsed_here


def test_a_large_dataset_reads_in_the_background_edits_saves_and_comes_back(qtbot, app, tiny_q4, tmp_path):
    data = tmp_path / "data" / "big.jsonl"
    data.parent.mkdir()
    write_chats(data, ((f"{QUESTIONS[i % len(QUESTIONS)]} {i}", ANSWER) for i in range(N)))
    assert os.path.getsize(data) > BACKGROUND_BYTES

    window = app.launch()
    open_model(qtbot, window, tiny_q4)
    page = window.dataset_page
    shown = []  # what the person sees at once: the reading strip with the file's name

    def open_it() -> bool:
        opened = window.open_dataset(str(data))  # returns at once: the file is being read
        shown.append((page.loading, page.load_strip.isVisible(), page.load_label.text()))
        return opened

    assert read_in_the_background(qtbot, window, open_it) == []
    assert shown[0][:2] == (True, True) and "big.jsonl" in shown[0][2]
    assert not page.load_strip.isVisible()
    qtbot.waitUntil(page.model.fully_counted, timeout=TIMEOUT_MS)
    stats = page.model.stats()
    assert stats.samples == N and stats.counted == N and stats.tokens > N
    checked(qtbot, window)
    plan = window.train_page.check.plan
    assert plan.n_samples == plan.n_usable == plan.n_train + plan.n_val == N and plan.total_steps > 0
    assert plan.usable_tokens == stats.tokens  # the check and the table counted the same tokens

    # the person selects the second sample and adds to its answer in the editor
    page.select_rows([1])
    qtbot.waitUntil(lambda: len(page.editor.turns) == 2, timeout=TIMEOUT_MS)
    edit = page.editor.turns[1].edit
    edit.setFocus()
    edit.moveCursor(edit.textCursor().MoveOperation.End)
    qtbot.keyClicks(edit, " again")
    assert page.samples[1].messages[1]["content"] == ANSWER + " again"
    assert page.save()
    project_file = str(tmp_path / "big.tune.json")
    assert window._save_project(project_file)
    assert window.close()

    again = app.launch()
    with qtbot.waitSignal(again.sig_model_changed, timeout=TIMEOUT_MS):
        assert read_in_the_background(qtbot, again, lambda: again.open_project(project_file)) == []
    page = again.dataset_page
    assert page.path == str(data)
    assert page.samples[1].messages[1]["content"] == ANSWER + " again"
    assert page.samples[0].messages[1]["content"] == ANSWER and not page.is_modified
    checked(qtbot, again)
    assert again.train_page.check.plan.n_samples == N


def test_closing_the_window_while_a_large_dataset_is_checked_closes_at_once(qtbot, app, tiny_q4, tmp_path):
    """The person opens the large file and closes the window while its tokens are still counted and
    the Train page still checks the run (each in a child process): the window goes at once, and no
    process of the app is left behind."""
    data = tmp_path / "big.jsonl"
    write_chats(data, ((f"{QUESTIONS[i % len(QUESTIONS)]} {i}", ANSWER * 8) for i in range(8 * N)))
    window = app.launch()
    open_model(qtbot, window, tiny_q4)
    assert window.open_dataset(str(data))
    qtbot.waitUntil(lambda: not window.dataset_page.loading, timeout=TIMEOUT_MS)
    checker = window.train_page.checker

    def encoding() -> bool:  # the check's child has started
        job = checker.encodings._job
        return job is not None and job.pid is not None

    qtbot.waitUntil(encoding, timeout=TIMEOUT_MS)
    t0 = time.monotonic()
    assert checker.encodings._job is not None  # the check's child still encodes
    assert window.close()
    window.engine.shutdown(60_000)
    closed_s = time.monotonic() - t0
    assert closed_s < 1.5, closed_s  # it waited for the child to encode everything (2.6 s here)
    qtbot.waitUntil(lambda: not mp.active_children(), timeout=5_000)
