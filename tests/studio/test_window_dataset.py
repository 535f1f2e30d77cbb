"""One dataset in the app: the window's `DatasetDocument` is what the Dataset page edits and what the
other pages read (the Rewards page's "From dataset…" included), saved or not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from engine import load_jsonl
from studio.main_window import MainWindow

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "data" / "datasets" / "sample_data.jsonl"


@pytest.fixture
def window(qtbot, tmp_path):
    w = MainWindow(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))
    w.confirm = lambda title, text: True
    qtbot.addWidget(w)
    yield w
    w.engine.shutdown()


def test_the_window_dataset_is_what_the_editor_shows(qtbot, window, tmp_path):
    path = tmp_path / "data.jsonl"
    shutil.copyfile(SAMPLE_DATA, path)
    assert window.dataset_page.document is window.dataset
    assert window.rewards_page.samples is None  # nothing open: the page would read the project's file
    assert window.open_dataset(str(path))
    assert window.dataset.samples() == load_jsonl(path)[0] and window.dataset.path == str(path)

    page = window.dataset_page
    page.select_rows([2])
    page.delete_selected()
    page.select_rows([0])
    page.editor.reward.setValue(0.5)
    assert window.dataset.samples() == page.samples and len(window.dataset) == 6
    assert window.dataset.sample(0).reward == 0.5 and window.dataset.dirty
    assert window.windowTitle().endswith("*")
    qtbot.waitUntil(lambda: window.rewards_page.samples == window.dataset.samples())

    page.undo()
    qtbot.waitUntil(lambda: window.rewards_page.samples == window.dataset.samples())
    assert window.rewards_page.samples[0].reward is None


def test_a_change_made_through_the_document_shows_in_the_page(window):
    assert window.open_dataset(str(SAMPLE_DATA))
    page = window.dataset_page
    page.select_rows([0])
    moved = window.dataset.sample(6)
    window.dataset.move(6, 1, "Move sample up")  # e.g. another page reorders the dataset
    assert page.model.rowCount() == 7 and page.model.sample(1) == moved
    assert page.current_row() == 1 and page.editor.sample == moved  # the page selects what changed
    assert page.action_undo.text() == "Undo move sample up" and page.is_modified
    window.dataset.undo()
    assert page.model.samples == window.dataset.samples() and not page.is_modified
