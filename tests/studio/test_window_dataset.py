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


def test_the_train_page_trains_what_the_editor_shows(qtbot, tmp_path):
    """An edit that is not saved is trained (and said so); the file on disk is left as it was."""
    import json

    from PySide6.QtCore import QSettings

    from engine import Finished, TargetSpec
    from studio.main_window import MainWindow
    from studio.resources import DEMO_MODEL

    data = tmp_path / "d.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(4)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = data.read_bytes()
    w = MainWindow(
        QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat), recovery_dir=str(tmp_path / "rec")
    )
    qtbot.addWidget(w)
    try:
        w.confirm = lambda *a: True
        w.project.update(output_dir=str(tmp_path / "out"))
        with qtbot.waitSignal(w.sig_model_changed, timeout=30_000):
            w.open_model(str(DEMO_MODEL))
        assert w.open_dataset(str(data))
        w.dataset.remove([0, 1], "delete 2 samples")  # unsaved: the editor shows 2 samples
        w.project.update_config(steps=1, n_ctx=64, targets=TargetSpec(preset="attention"))
        with qtbot.waitSignal(w.train_page.sig_run_finished, timeout=60_000) as done:
            assert w.train_page.start()
        assert isinstance(done.args[0], Finished)
        assert "Training the 2 samples the editor shows" in w.train_page.log.toPlainText()
        assert "Started: 2 training" in w.train_page.log.toPlainText()
        assert data.read_bytes() == before
    finally:
        w.engine.shutdown()
