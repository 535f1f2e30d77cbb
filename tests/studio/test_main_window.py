"""The main window: pages, project files, recent files, drag and drop, closing while training, the
--screenshot tour, and one whole flow from the demo to an exported adapter that reloads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QSettings

from engine import LoraAdapter, Model, TargetSpec
from studio.app import DEMO_SETTINGS, main
from studio.main_window import PAGES, MainWindow
from studio.resources import DEMO_DATASET, DEMO_MODEL


@pytest.fixture
def window(qtbot, tmp_path):
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    w = MainWindow(settings)
    w.confirm = lambda title, text: True
    w.project.update(output_dir=str(tmp_path / "runs"))
    qtbot.addWidget(w)
    w.show()
    yield w
    w.engine.shutdown()


def open_model(qtbot, window, path) -> None:
    """Open a model and wait until the engine worker has opened it and every page knows."""
    with qtbot.waitSignal(window.sig_model_changed, timeout=30_000):
        assert window.open_model(str(path))


def test_pages_in_order_with_shortcuts(window):
    assert [window.nav.item(i).text().split(maxsplit=1)[1] for i in range(window.nav.count())] == list(PAGES)
    view = next(a for a in window.menuBar().actions() if a.text() == "&View").menu()
    pages = view.actions()[: len(PAGES)]
    assert [a.text() for a in pages] == list(PAGES)
    assert [a.shortcut().toString() for a in pages] == [f"Ctrl+{i}" for i in range(1, len(PAGES) + 1)]
    window.show_page(3)
    assert window.current_page() is window.train_page


def test_adding_a_page_is_one_line_in_the_page_table(qtbot, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QLabel

    import studio.main_window as mw

    table = list(mw.PAGE_TABLE)
    table.insert(4, ("Notes", "notes_page", lambda w: QLabel("notes")))  # after Train
    monkeypatch.setattr(mw, "PAGE_TABLE", tuple(table))
    w = MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    qtbot.addWidget(w)
    try:
        names = [name for name, _, _ in table]
        assert len(names) == 9
        assert [w.nav.item(i).text() for i in range(w.nav.count())] == [
            f"{i + 1}  {n}" for i, n in enumerate(names)
        ]
        assert [a.shortcut().toString() for a in w.page_actions] == [f"Ctrl+{i}" for i in range(1, 10)]
        w.page_actions[names.index("Notes")].trigger()
        assert w.current_page() is w.notes_page
        w.page_actions[names.index("Export")].trigger()
        assert w.current_page() is w.export_page
        w.page_actions[names.index("Runs")].trigger()
        assert w.current_page() is w.runs_page
        assert w.nav.viewport().width() >= w.nav.sizeHintForColumn(0)  # the nav has room for 9 pages
    finally:
        w.engine.shutdown()


def test_opening_the_demo_reaches_every_page(window, qtbot):
    received = {}
    for page in window.pages[1:]:
        original = page.set_model_info

        def spy(info, page=page, original=original):
            received[type(page).__name__] = info
            original(info)

        page.set_model_info = spy
    open_model(qtbot, window, DEMO_MODEL)
    assert set(received) == {
        "DatasetPage",
        "TargetsPage",
        "TrainPage",
        "ChatPage",
        "RewardsPage",
        "ExportPage",
        "RunsPage",
    }
    assert all(info is window.model_info for info in received.values())
    assert window.open_dataset(str(DEMO_DATASET))
    assert window.model_info is not None and window.targets_page.selected_names()
    assert "demo.gguf" in window.windowTitle()
    assert window.settings.value("recent/models")[0].endswith("demo.gguf")


def test_another_model_reaches_every_page_and_replaces_the_old_ones_facts(window, qtbot, synth_model):
    open_model(qtbot, window, DEMO_MODEL)
    window.targets_page.selection.set_checked(["blk.0.attn_q.weight", "blk.3.ffn_up.weight"], True, "user")
    window.targets_page.selection.replace(["blk.0.attn_q.weight", "blk.3.ffn_up.weight"], origin="user")
    received = {}
    for page in window.pages:
        if hasattr(page, "set_model_info"):
            original = page.set_model_info

            def spy(info, page=page, original=original):
                received[type(page).__name__] = info
                original(info)

            page.set_model_info = spy
    moe = synth_model("qwen3moe", L=2)
    open_model(qtbot, window, moe)
    assert len(received) == len(window.pages) - 1  # every page but the Model page, which opened it
    assert all(info.path == moe for info in received.values())
    assert window.model_page.fact_labels["Architecture"].text().startswith("qwen3moe")
    targets = window.targets_page
    assert targets.selected_names() == ["blk.0.attn_q.weight"]  # kept: the new model has it
    assert "blk.3.ffn_up.weight" in targets.message.text() and not targets.message.isHidden()
    assert window.project.config.targets.patterns == ("blk.0.attn_q.weight",)
    assert window.first_steps.text_of("Model") == f"Model ✓ {Path(moe).name}"


def test_project_round_trip_through_the_window(window, tmp_path, qtbot):
    open_model(qtbot, window, DEMO_MODEL)
    window.open_dataset(str(DEMO_DATASET))
    window.project.update_config(rank=4, targets=TargetSpec(preset="all"))
    path = str(tmp_path / "p.json")
    assert window._save_project(path)
    other = MainWindow(QSettings(str(tmp_path / "s2.ini"), QSettings.IniFormat), engine=window.engine)
    qtbot.addWidget(other)
    with qtbot.waitSignal(other.sig_model_changed, timeout=30_000):
        assert other.open_project(path)
    assert other.project.config.rank == 4 and other.project.model_path == str(DEMO_MODEL)
    assert other.model_info is not None and other.dataset_page.path
    assert json.loads(open(path).read())["config"]["targets"]["preset"] == "all"


def test_files_open_by_type(window, qtbot, tmp_path):
    with qtbot.waitSignal(window.sig_model_changed, timeout=30_000):
        assert window.open_any(str(DEMO_MODEL)) and window.current_page() is window.model_page
    assert window.open_any(str(DEMO_DATASET)) and window.current_page() is window.dataset_page
    assert not window.open_any(str(tmp_path / "notes.txt"))
    assert "not a .gguf model" in window.statusBar().currentMessage()


def _start_demo_training(window, qtbot, steps):
    open_model(qtbot, window, DEMO_MODEL)
    window.open_dataset(str(DEMO_DATASET))
    window.project.update_config(targets=TargetSpec(preset="all"), **{**DEMO_SETTINGS, "steps": steps})
    window.show_page(3)
    assert window.train_page.start()


def test_closing_during_training_asks_then_stops_cleanly(window, qtbot):
    _start_demo_training(window, qtbot, steps=400)
    qtbot.waitUntil(lambda: window.train_page.state == "training", timeout=30_000)
    window.confirm = lambda title, text: False
    assert not window.close()  # refused: still training
    assert window.train_page.is_running()
    window.confirm = lambda title, text: True
    assert window.close()  # the run stops after its step with a checkpoint, and the worker thread ends
    assert window.engine._thread.isFinished()  # the worker thread ended; nothing left running
    ckpts = list(Path(window.project.output_folder()).glob("*-checkpoints/ckpt-*"))
    assert ckpts, "stopping on close writes a checkpoint"


def test_whole_flow_demo_to_exported_adapter_that_reloads(window, qtbot, tmp_path):
    _start_demo_training(window, qtbot, steps=12)
    with qtbot.waitSignal(window.train_page.sig_run_finished, timeout=120_000) as done:
        pass
    result = done.args[0]
    assert type(result).__name__ == "Finished" and result.step == 12
    plots = window.train_page.plots
    plots.flush()
    x, y = plots.train_curve.getData()
    assert len(x) == 12 and np.isfinite(y).all()
    assert len(plots.kind_series) >= 7  # one LoRA-norm curve per tensor kind
    assert window.export_page.adapter_path() == result.adapter_path
    window.show_page(5)
    out = tmp_path / "exported.f16.gguf"
    window.export_page.type_combo.setCurrentIndex(window.export_page.type_combo.findData("F16"))
    window.export_page.out_edit.setText(str(out))
    with qtbot.waitSignal(window.export_page.sig_exported, timeout=30_000):
        window.export_page.export()
    assert "reloads" in window.export_page.result_label.text()
    model = Model.load(DEMO_MODEL)
    trained = LoraAdapter.load(result.adapter_path, model)
    exported = LoraAdapter.load(out, model)
    tokens = np.array([1, 2, 3, 4, 5])
    np.testing.assert_allclose(
        model.forward(tokens, lora=exported.terms()), model.forward(tokens, lora=trained.terms()), atol=1e-2
    )


def test_screenshot_tour_writes_every_page(tmp_path, monkeypatch):
    import studio.app

    # the tour trains the demo before its pictures; 20 steps show the same pages as 150
    monkeypatch.setattr(studio.app, "DEMO_SETTINGS", {**DEMO_SETTINGS, "steps": 20})
    assert main(["--demo", "--screenshot", str(tmp_path)]) == 0
    for name in PAGES:
        png = tmp_path / f"{name.lower()}.png"
        assert png.exists() and png.stat().st_size > 10_000, name
    assert any(
        (tmp_path / "runs").iterdir()
    )  # the demo run wrote beside the screenshots, not into resources/
