"""Journey: the sample answers' prompts are part of the project. A person types prompts on the Train
page's Sample answers tab and sets how often they are answered, saves the project and closes the
window; a new window opening the project shows the same prompts and rhythm, and a run answers them
at those steps."""

from __future__ import annotations

from engine import Finished

from .conftest import checked, open_model_and_dataset, train


def test_typed_prompts_come_back_with_the_project_and_are_answered(qtbot, app, tiny_q4, facts, tmp_path):
    window = app.launch()
    open_model_and_dataset(qtbot, window, tiny_q4, facts)
    window.project.update_config(steps=6)
    window.show_page_named("Train")
    plots, tab = window.train_page.plots, window.train_page.sample_answers
    assert plots.placeholder_shown and "Sample answers" in plots.placeholder.text()  # no run yet
    plots.placeholder.linkActivated.emit("tab:samples")  # the first look's link opens the tab
    checked(qtbot, window)  # (a check that comes back does not hide it again)
    assert not plots.placeholder_shown and plots.tabs.currentWidget() is tab
    qtbot.keyClicks(tab.prompts_edit, "what is the answer")
    tab.prompts_edit.appendPlainText("say the answer")
    tab.every_spin.setValue(3)
    project_file = str(tmp_path / "facts.tune.json")
    assert window._save_project(project_file)
    assert window.close()

    again = app.launch()
    with qtbot.waitSignal(again.sig_model_changed, timeout=60_000):
        assert again.open_project(project_file)
    checked(qtbot, again)
    tab = again.train_page.sample_answers
    assert "(2 typed prompts, every 3 steps)" in again.train_page.plots.placeholder.text()
    assert tab.prompts_edit.toPlainText() == "what is the answer\nsay the answer"
    assert tab.every_spin.value() == 3 and tab.typed_radio.isChecked()
    result = train(qtbot, again)
    assert isinstance(result, Finished) and result.step == 6
    rows = tab.table.rows()
    asked = ["what is the answer", "say the answer"]
    assert [(step, prompt) for step, prompt, _ in rows] == [(s, p) for s in ("3", "6") for p in asked]
    assert all(answer for _, _, answer in rows)
