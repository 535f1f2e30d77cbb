"""The Train page's Sample answers tab: prompts typed there are answered every N steps during the
run, and the table grows at those steps (the answers are the run's SampleAnswers events)."""

from __future__ import annotations

from engine import Finished
from tests.studio.test_train_page import chats, make_page, run, settle  # noqa: F401 - chats: fixture


def test_typed_prompts_are_answered_at_the_planned_steps(qtbot, engine, tmp_path, synth_model, chats):  # noqa: F811
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, steps=6)
    tab = page.sample_answers
    assert page.plots.tabs.indexOf(tab) >= 0
    tab.prompts_edit.setPlainText("hello\n\nwho are you\n")
    tab.every_spin.setValue(3)
    seen = []
    original = tab.table.add_event
    tab.table.add_event = lambda e: (seen.append(tab.table.rowCount()), original(e))
    result = run(qtbot, page)
    settle(qtbot, page)
    assert isinstance(result, Finished)
    rows = tab.table.rows()
    assert [(step, prompt) for step, prompt, _ in rows] == [
        ("3", "hello"), ("3", "who are you"), ("6", "hello"), ("6", "who are you"),
    ]  # fmt: skip
    assert seen == [0, 2]  # the table grew during the run, a step's rows at a time
    assert all(answer for _, _, answer in rows) and tab.empty.isHidden()
    assert page.run_config.sample_prompts == ("hello", "who are you") and page.run_config.sample_every == 3


def test_no_prompts_no_sample_answers(qtbot, engine, tmp_path, synth_model, chats):  # noqa: F811
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, steps=2)
    run(qtbot, page)
    settle(qtbot, page)
    assert page.sample_answers.table.rowCount() == 0 and page.run_config.sample_every == 0


def test_the_runs_page_shows_a_runs_sample_answers(qtbot, engine, tmp_path, synth_model, chats):  # noqa: F811
    from studio.pages.runs.page import RunsPage
    from studio.project import Project

    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, steps=4)
    page.sample_answers.prompts_edit.setPlainText("hello")
    page.sample_answers.every_spin.setValue(2)
    run(qtbot, page)
    settle(qtbot, page)
    shown = page.sample_answers.table.rows()
    project = Project()
    project.update(model_path=page.project.model_path, output_dir=page.project.output_dir)
    runs = RunsPage(project, engine)
    qtbot.addWidget(runs)
    runs.refresh()
    record = next(r for r in runs.runs() if r.adapter == page.run_config.out)
    assert [[str(s), p, a] for s, p, a in record.sample_answers] == [list(r) for r in shown]
    runs.select_runs([record.name])
    assert runs.samples_table.rows() == shown and len(shown) == 2


def test_a_run_known_by_its_events_file_shows_its_sample_answers(qtbot, engine, tmp_path, synth_model):
    """A run started from the command line (or whose record was lost) is listed from its events file
    (the Runs page follows it): its sample answers are there as the run's own record would show."""
    from PySide6.QtCore import QSettings

    from engine.cli.main import main
    from studio.pages.runs.page import RunsPage
    from studio.project import Project
    from tests.conftest import write_chats
    from tests.engine.test_trainer import CHATS

    model = synth_model("llama")
    prompts, events, out = tmp_path / "prompts.txt", tmp_path / "run-events.jsonl", tmp_path / "a.gguf"
    prompts.write_text("hello\nwho are you\n", encoding="utf-8")
    data = write_chats(tmp_path / "d.jsonl", CHATS)
    args = ["train", model, data, "--out", str(out), "--steps", "4", "--ctx", "64",
            "--sample-prompts", str(prompts), "--sample-every", "2", "--events", str(events)]  # fmt: skip
    assert main(args) == 0
    (tmp_path / "a.run.json").unlink()  # the record is lost: only the events file tells the run
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    project = Project()
    project.update(model_path=model, output_dir=str(tmp_path / "elsewhere"))
    runs = RunsPage(project, engine, settings=settings)
    qtbot.addWidget(runs)
    runs.follow(str(events))
    (record,) = runs.runs()
    runs.select_runs([record.name])
    rows = runs.samples_table.rows()
    assert [(step, prompt) for step, prompt, _ in rows] == [
        ("2", "hello"), ("2", "who are you"), ("4", "hello"), ("4", "who are you"),
    ]  # fmt: skip
    assert all(answer for _, _, answer in rows) and not runs.samples_table.isHidden()


def test_prompts_from_the_validation_split_or_a_note(qtbot, engine, tmp_path, synth_model, chats):  # noqa: F811
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, steps=2, val_split=0.0)
    tab = page.sample_answers
    tab.prompts_edit.setPlainText("typed, not asked")
    tab.validation_radio.setChecked(True)
    tab.count_spin.setValue(2)
    tab.every_spin.setValue(2)
    assert page.project.sample_answers.source == "validation" and not tab.prompts_edit.isEnabled()
    assert not tab.validation_note.isHidden() and "No validation split" in tab.validation_note.text()
    page.project.update_config(val_split=0.5)  # the Settings' validation split: the note follows it
    assert "No validation split" not in tab.validation_note.text()
    assert "first 2 validation samples" in tab.validation_note.text()
    result = run(qtbot, page)
    settle(qtbot, page)
    assert isinstance(result, Finished)
    config = page.run_config
    assert (config.sample_prompts, config.sample_from_validation, config.sample_every) == ((), 2, 2)
    rows = tab.table.rows()
    questions = {f"What is {i} plus {i}? Answer in one sentence." for i in range(12)}
    assert len(rows) == 2 and all(s == "2" and p in questions and a for s, p, a in rows)
    assert len({p for _, p, _ in rows}) == 2 and "typed, not asked" not in {p for _, p, _ in rows}
    tab.typed_radio.setChecked(True)  # back to the typed prompts: they were kept
    assert tab.prompts_edit.isEnabled() and tab.validation_note.isHidden()
    assert page.project.sample_answers.prompts == ("typed, not asked",)
