"""A large dataset on the Dataset page: read off the UI thread with progress, counted in the
background, searched, sorted and its problems listed without holding the window.

The files here are a few thousand samples (a test must stay quick); bench/dataset_stall.py opens a
hundred thousand in the real window and measures the stalls.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from PySide6.QtCore import QItemSelectionModel, QSettings, Qt, QTimer

from engine import EncodeOptions, encode_samples, load_jsonl
from studio.main_window import MainWindow
from studio.pages.dataset.page import DatasetPage
from studio.pages.dataset.proxy import SamplesFilterModel
from studio.pages.dataset.rows import sample_text
from studio.pages.dataset.table import SamplesModel
from studio.project import ModelInfo, Project
from studio.resources import DEMO_MODEL

WORDS = "the model learns from data each step updates weights gradient loss token answer question".split()


def write_big(path: Path, n: int, *, bad_lines: tuple[int, ...] = (), seed: int = 0) -> Path:
    """n chats (a numbered question, an answer), with unreadable lines at `bad_lines` (1-based) and
    an empty reply on every 500th sample."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(1, n + 1):
            if i in bad_lines:
                f.write('{"messages": [broken\n')
                continue
            answer = "" if i % 500 == 0 else " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))
            messages = [
                {
                    "role": "user",
                    "content": f"Question {i}: " + " ".join(rng.choice(WORDS) for _ in range(8)),
                },
                {"role": "assistant", "content": answer},
            ]
            f.write(json.dumps({"messages": messages, "reward": round(rng.random(), 2)}) + "\n")
    return path


@pytest.fixture(scope="module")
def info() -> ModelInfo:
    return ModelInfo.read(str(DEMO_MODEL))


@pytest.fixture
def window(qtbot, tmp_path):
    w = MainWindow(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))
    qtbot.addWidget(w)
    w.ask_unsaved = lambda text: "discard"
    w.dataset_page.ask_unsaved = lambda: "discard"
    w.resize(1200, 800)
    w.show()
    qtbot.waitExposed(w)
    return w


def test_a_large_file_opens_off_the_ui_thread_with_progress_and_everything_works(
    qtbot, window, info, tmp_path
):
    """As a person does: open a big file (File > Open), watch the progress while the window keeps
    answering, then find the problems, search, sort, and see every row's tokens counted."""
    page = window.dataset_page
    window.model_page.sig_model_opened.emit(info)  # the model is open: tokens are counted
    path = write_big(tmp_path / "big.jsonl", 3000, bad_lines=(7, 1500))
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(page.loading))
    timer.start(1)

    assert window.open_dataset(str(path))  # returns at once: the file is read off the UI thread
    assert page.loading and "big.jsonl" in page.load_label.text()
    assert window.stack.currentIndex() == window.page_names.index("Dataset")  # the progress shows
    assert page.load_strip.isVisible()
    assert not page.splitter.isEnabled()  # nothing to edit until the file is in
    qtbot.waitUntil(lambda: not page.loading, timeout=60_000)
    timer.stop()
    assert any(ticks), "the event loop did not run while the file was read"
    assert not page.load_strip.isVisible() and page.splitter.isEnabled()

    samples, problems = load_jsonl(path)
    assert page.model.rowCount() == len(samples) == 2998 and page.samples == samples
    assert window.project.dataset_path == str(path) and page.path == str(path)
    assert "2 line(s) could not be read" in page.message.text()

    # the problems: the two unreadable lines and the empty replies, by line; one click selects a sample
    page.problems_count()
    texts = [page.problems_model.text(i) for i in range(page.problems_model.rowCount())]
    assert texts[0].startswith("line 7: invalid JSON") and any(t.startswith("line 1500: ") for t in texts)
    empty = next(i for i, t in enumerate(texts) if t.startswith("line 1000: ") and "empty content" in t)
    page.select_problem_at(empty)
    assert (
        page.samples[page.current_row()].line == 1000
        and page.editor.sample == page.samples[page.current_row()]
    )

    # every row's tokens are counted in the background, as the engine counts them
    qtbot.waitUntil(page.model.fully_counted, timeout=120_000)
    c = window.project.config
    options = EncodeOptions(n_ctx=c.n_ctx, train_on_prompt=c.train_on_prompt, prompt_format=c.prompt_format)
    encoded, _ = encode_samples(samples, info.tokenizer, info.template, options)
    page.refresh()
    assert f"{sum(len(e.tokens) for e in encoded):,} tokens" in page.stats_label.text()
    by_line = {samples[e.index].line: e for e in encoded}
    for row in (0, 1234, 2997):
        e = by_line.get(samples[row].line)
        shown = page.model.index(row, SamplesModel.COL_TOKENS).data()
        assert shown == ("–" if e is None else f"{len(e.tokens):,}" + (" ✂" if e.truncated else ""))

    # search: what a person types, ignoring case; the rows are those whose text holds it
    page.search.setText("QUESTION 12")
    qtbot.waitUntil(lambda: not page.busy())
    want = [i for i, s in enumerate(samples) if "question 12" in sample_text(s).casefold()]
    shown = [page.proxy.mapToSource(page.proxy.index(r, 0)).row() for r in range(page.proxy.rowCount())]
    assert shown == want and f"{len(want):,} shown" in page.stats_label.text()
    page.search.setText("QUESTION 123")  # typing on narrows the rows that matched
    qtbot.waitUntil(lambda: not page.busy())
    assert page.proxy.rowCount() == sum(
        1 for i in want if "question 123" in sample_text(samples[i]).casefold()
    )
    page.search.clear()
    qtbot.waitUntil(lambda: not page.busy())
    assert page.proxy.rowCount() == len(samples)

    # sort by tokens, longest first: ties keep the file's order
    page.table.sortByColumn(SamplesModel.COL_TOKENS, Qt.DescendingOrder)
    rows = [page.proxy.mapToSource(page.proxy.index(r, 0)).row() for r in range(page.proxy.rowCount())]
    counts = [page.model.sort_key(row, SamplesModel.COL_TOKENS) for row in rows]
    assert counts == sorted(counts, reverse=True)


def test_reading_can_be_cancelled_and_a_file_that_cannot_be_read_changes_nothing(qtbot, window, tmp_path):
    page = window.dataset_page
    small = write_big(tmp_path / "small.jsonl", 20)
    assert window.open_dataset(str(small)) and not page.loading  # small files open at once
    before = page.samples
    big = write_big(tmp_path / "big.jsonl", 2000)
    assert window.open_dataset(str(big)) and page.loading
    page.load_cancel.click()
    assert not page.loading and page.samples == before and page.path == str(small)
    assert "Stopped reading big.jsonl" in page.message.text()
    qtbot.wait(300)  # the cancelled read ends on its own and changes nothing
    assert page.samples == before

    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\0" * (page.background_bytes + 10))
    assert window.open_dataset(str(binary)) and page.loading
    qtbot.waitUntil(lambda: not page.loading, timeout=30_000)
    assert page.samples == before and page.path == str(small)
    assert "could not be opened" in page.message.text() and "NUL byte" in page.message.text()


def test_the_filter_model_sorts_and_searches_as_qt_would(qtmodeltester, tmp_path):
    """Sorting is stable (ties in dataset order, also descending); searching keeps the rows whose
    text holds the words; the model tester finds the proxy consistent; a selection survives a sort."""
    path = write_big(tmp_path / "chats.jsonl", 300)
    doc = SamplesModel().document
    samples, problems = load_jsonl(path)
    doc.reset(samples, path, problems=problems)
    model = SamplesModel(doc)
    proxy = SamplesFilterModel()
    proxy.setSourceModel(model)
    qtmodeltester.check(proxy)
    rewards = [s.reward for s in samples]
    for order in (Qt.AscendingOrder, Qt.DescendingOrder):
        proxy.sort(SamplesModel.COL_REWARD, order)
        rows = [proxy.mapToSource(proxy.index(r, 0)).row() for r in range(proxy.rowCount())]
        want = sorted(
            range(len(samples)), key=lambda i: -rewards[i] if order == Qt.DescendingOrder else rewards[i]
        )
        assert rows == want  # Python's sort is stable too
        assert all(proxy.mapFromSource(model.index(s, 0)).row() == p for p, s in enumerate(rows))
    proxy.set_search("question 1")
    while proxy.searching:
        proxy._search_step()
    shown = {proxy.mapToSource(proxy.index(r, 0)).row() for r in range(proxy.rowCount())}
    assert shown == {i for i, s in enumerate(samples) if "question 1" in sample_text(s).casefold()}
    qtmodeltester.check(proxy)

    from PySide6.QtCore import QItemSelectionModel as Selection  # noqa: F401 - documents the flags used

    selection = QItemSelectionModel(proxy)
    proxy.set_search("")
    target = proxy.index(5, 0)
    source_row = proxy.mapToSource(target).row()
    selection.setCurrentIndex(target, QItemSelectionModel.ClearAndSelect | QItemSelectionModel.Rows)
    proxy.sort(SamplesModel.COL_WORDS, Qt.DescendingOrder)
    assert proxy.mapToSource(selection.currentIndex()).row() == source_row  # the same sample stays current
    doc.remove([0, 1])  # rows go away under a sorted view: the current sample is still current
    assert proxy.mapToSource(selection.currentIndex()).row() == source_row - 2


def test_a_page_without_a_window_reads_in_the_background_too(qtbot, tmp_path):
    page = DatasetPage(Project())
    qtbot.addWidget(page)
    path = write_big(tmp_path / "big.jsonl", 1200)
    assert page.open_path(path) and page.loading
    with qtbot.waitSignal(page.sig_dataset_opened, timeout=60_000) as opened:
        pass
    assert opened.args == [str(path)] and len(page.samples) == 1200 and not page.is_modified


def test_closing_the_window_while_tokens_are_counted_leaves_no_counting_process(
    qtbot, window, info, tmp_path
):
    """A person opens a big file and closes the window before its tokens are all counted: the
    counting child process ends with the window (killed and reaped), no zombie left behind."""
    import multiprocessing
    import os

    page = window.dataset_page
    window.model_page.sig_model_opened.emit(info)
    assert window.open_dataset(str(write_big(tmp_path / "big.jsonl", 3000)))
    qtbot.waitUntil(lambda: not page.loading, timeout=60_000)
    qtbot.waitUntil(lambda: page.loader.count_pid is not None, timeout=30_000)
    pid = page.loader.count_pid
    assert not page.model.fully_counted()
    window.project.dirty = False
    assert window.close()
    assert page.loader.count_pid is None
    assert multiprocessing.active_children() == []
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped already: not a zombie
