"""Journey (d): after some work (a model, a dataset, a run, a conversation, an export), File > New
project leaves nothing of it on any page: no model, no dataset, no run, no conversation, no export;
opening the model again does not train on the old dataset."""

from __future__ import annotations

from PySide6.QtGui import QKeySequence

from .conftest import chat, open_model, open_model_and_dataset, train_with


def test_new_project_resets_every_page(qtbot, app, tiny_q4, facts):
    window = app.launch()
    open_model_and_dataset(qtbot, window, tiny_q4, facts)
    train_with(qtbot, window, steps=4)
    chat(qtbot, window, "what is the answer", adapter=True)
    window.export_page.export()
    qtbot.waitUntil(lambda: not window.export_page.result.isHidden(), timeout=60_000)

    new = next(a for a in window.menuBar().actions()[0].menu().actions() if a.text() == "&New project")
    assert new.shortcut() == QKeySequence(QKeySequence.New)
    new.trigger()  # Ctrl+N; the unsaved changes are discarded
    qtbot.waitUntil(lambda: not window.engine.jobs, timeout=60_000)
    p = window.project
    assert (p.model_path, p.dataset_path, p.path, p.output_dir, p.dirty) == (None, None, None, None, False)
    assert window.model_info is None and window.current_page() is window.model_page
    assert window.model_page.fact_labels["Architecture"].text() == "–"
    assert "No model open" in window.model_page.path_label.text()
    assert len(window.dataset) == 0 and window.dataset.path is None
    assert window.targets_page.selected_names() == []
    train_page = window.train_page
    assert train_page.state == "idle" and not train_page.resume_button.isEnabled()
    assert train_page.log.toPlainText() == "" and train_page.plots.curve_data()["loss"][0].size == 0
    assert "No model is chosen" in train_page.blocker().reason
    assert window.chat_page.conversation.messages == [] and window.chat_page.info is None
    assert window.export_page.result.isHidden() and window.export_page.adapter_path() == ""
    assert window.rewards_page.session is None
    forgot: list[bool] = []  # the session lives on the engine's thread: asked there
    window.engine.submit("look", lambda s, j: forgot.append(s is None or s.run is None), needs_session=False)
    qtbot.waitUntil(lambda: bool(forgot), timeout=10_000)
    assert forgot == [True]  # the session forgot the run
    assert "untitled project" in window.windowTitle() and "*" not in window.windowTitle()

    # the model again: nothing is trained until a dataset is chosen (not the old one)
    open_model(qtbot, window, tiny_q4)
    qtbot.waitUntil(lambda: train_page.blocker() is not None, timeout=10_000)
    assert "No dataset is chosen" in train_page.blocker().reason
    assert not train_page.start()
    assert window.runs_page.runs()  # the old project's run is still on disk, in the history
