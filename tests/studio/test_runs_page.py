"""The Runs page over run records written by the test (no training: records and adapters are written
directly): every run listed with its status, steps and losses; runs of other models marked; two
runs' loss curves overlaid; the buttons hand the adapter on (and say why not); added folders
remembered; the list read again when a folder changes; the page fits a small window."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PySide6.QtCore import QSettings, Qt

from engine import RunRecord, find_runs, lora_shapes, write_adapter
from studio.pages.runs.model import COLUMNS, RunsModel
from studio.pages.runs.page import RunsPage
from studio.project import Project
from studio.resources import DEMO_MODEL
from studio.widgets.runs import RunChoiceWidget, adapter_problems, run_label, status_text
from tests.studio.conftest import SMALL


def demo_adapter(path, info, arch="llama", c=None) -> str:
    """A small adapter for the demo model (or, with `c`, for a model of another width)."""
    rng = np.random.default_rng(0)
    pairs = {}
    for name in ("blk.0.attn_q.weight", "blk.1.attn_v.weight"):
        shape = info.tensors[name].shape if c is None else (c, c)
        a, b = lora_shapes(name, shape, 4)
        pairs[name] = (rng.normal(0, 0.3, a).astype(np.float32), rng.normal(0, 0.05, b).astype(np.float32))
    return write_adapter(path, arch, pairs, alpha=8.0)


def make_run(folder, name, info, *, status="finished", done=20, planned=20, adapter=True, model=None,
             kind="training", message="", losses=None) -> RunRecord:  # fmt: skip
    """A run record (and its adapter) laid out as the Train page writes them."""
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, f"{name}.gguf")
    if adapter:
        demo_adapter(out, info)
    rec = RunRecord(
        name=name, kind=kind, model=model or info.path, dataset="/data/chats.jsonl",
        targets=["attn_q", "attn_v"], n_targets=2, rank=4, alpha=8.0, steps_planned=planned, status=status,
        message=message, adapter=out,
        checkpoints=os.path.join(folder, f"{name}-checkpoints"), config={"lr": 0.001, "steps": planned},
    )  # fmt: skip
    for step, loss in losses if losses is not None else [(s, 3.0 - 0.1 * s) for s in range(1, done + 1)]:
        rec.add_loss(step, loss)
    rec.steps_done = done
    rec.write(os.path.join(folder, f"{name}-checkpoints", "run.json"))
    return rec


@pytest.fixture
def runs(tmp_path, demo_info):
    """Oldest first: a finished run, a failed one, another model's, and a newer stopped one."""
    out = tmp_path / "out"
    made = [
        make_run(out, "finished-run", demo_info, done=20, planned=20),
        make_run(
            out,
            "failed-run",
            demo_info,
            status="failed",
            done=3,
            planned=20,
            adapter=False,
            message="out of memory: lower the batch size",
        ),  # fmt: skip
        make_run(out, "other-model-run", demo_info, model=str(tmp_path / "other.gguf")),
        make_run(out, "stopped-run", demo_info, status="stopped", done=2, planned=150),
    ]
    return out, made


@pytest.fixture
def settings(tmp_path) -> QSettings:
    return QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)


@pytest.fixture
def page(qtbot, engine, runs, settings, demo_info) -> RunsPage:
    out, _ = runs
    project = Project()
    project.update(model_path=str(DEMO_MODEL), output_dir=str(out))
    page = RunsPage(project, engine, settings=settings)
    qtbot.addWidget(page)
    page.set_model_info(demo_info)
    page.resize(1100, 700)
    page.show()
    qtbot.waitExposed(page)
    return page


def cell(page: RunsPage, name: str, column: str) -> str:
    row = [r.name for r in page.runs()].index(name)
    return page.model.index(row, COLUMNS.index(column)).data()


def test_every_run_is_listed_newest_first_with_its_status_steps_and_losses(page):
    assert [r.name for r in page.runs()] == ["stopped-run", "other-model-run", "failed-run", "finished-run"]
    assert cell(page, "finished-run", "Status") == "finished"
    assert cell(page, "stopped-run", "Status") == "stopped at step 2"
    assert cell(page, "failed-run", "Status") == "failed at step 3: out of memory: lower the batch size"
    assert cell(page, "stopped-run", "Steps") == "2/150" and cell(page, "finished-run", "Steps") == "20/20"
    assert (
        cell(page, "finished-run", "Final loss") == "1.0000"
        and cell(page, "finished-run", "Best loss") == "1.0000"
    )
    assert cell(page, "finished-run", "Dataset") == "chats.jsonl"
    assert cell(page, "finished-run", "Targets") == "attn_q, attn_v (2, r4)"
    assert cell(page, "finished-run", "Adapter") == "finished-run.gguf"
    assert cell(page, "failed-run", "Adapter") == "failed-run.gguf (not written)"
    # runs of another model are marked
    assert cell(page, "other-model-run", "Model") == "other model: other.gguf"
    assert cell(page, "finished-run", "Model") == "demo.gguf"
    assert "Select runs" in page.plot.hint.text()


def test_runs_model_passes_the_model_tester(qtmodeltester, runs):
    model = RunsModel()
    model.set_runs(runs[1])
    qtmodeltester.check(model)


def test_selecting_two_runs_overlays_their_loss_curves(qtbot, page):
    page.select_runs(["finished-run", "stopped-run"])
    assert {r.name for r in page.selected_runs()} == {"finished-run", "stopped-run"}
    assert page.plot.points() == {"finished-run": 20, "stopped-run": 2}
    assert page.plot.hint.isHidden()
    # a run's details: its adapter and checkpoints, each folder one click away
    opened = []
    page.open_url = opened.append
    page.select_runs(["finished-run"])
    assert page.adapter_label.full_text().startswith("finished-run.gguf\nin ")
    page.resize(1024, 640)
    page.show()
    qtbot.waitExposed(page)
    # in the window's narrowest size the run's file name is shown whole (the folder is elided)
    assert page.adapter_label.text().split("\n")[0] == "finished-run.gguf"
    qtbot.mouseClick(page.open_adapter_button, Qt.LeftButton)
    assert opened and opened[0].toLocalFile() == os.path.dirname(page.current_run().adapter)


def test_the_buttons_hand_the_adapter_on_or_say_why_not(qtbot, page):
    page.select_runs(["stopped-run"])  # a stopped run wrote an adapter: usable when chosen
    run = page.current_run()
    with qtbot.waitSignal(page.sig_chat_requested) as chat:
        qtbot.mouseClick(page.chat_button, Qt.LeftButton)
    assert chat.args == [run.adapter, run_label(run)] and "stopped at step 2" in chat.args[1]
    with qtbot.waitSignal(page.sig_rate_requested) as rate:
        qtbot.mouseClick(page.rate_button, Qt.LeftButton)
    assert rate.args == [run.adapter]
    with qtbot.waitSignal(page.sig_export_requested) as export:
        qtbot.mouseClick(page.export_button, Qt.LeftButton)
    assert export.args == [run.adapter]
    # Enter in the table chats with the selected run
    page.table.setFocus()
    with qtbot.waitSignal(page.sig_chat_requested):
        qtbot.keyClick(page.table, Qt.Key_Return)

    page.select_runs(["failed-run"])
    assert not page.chat_button.isEnabled() and not page.export_button.isEnabled()
    assert "left no adapter file" in page.why_label.text()
    page.select_runs(["other-model-run"])
    assert not page.chat_button.isEnabled()
    assert "not the open model" in page.why_label.text() and "other.gguf" in page.why_label.text()


def test_added_folders_are_remembered_and_listed(qtbot, engine, page, settings, tmp_path, demo_info):
    elsewhere = tmp_path / "older-project"
    make_run(elsewhere, "older-run", demo_info)
    page.add_folder(str(elsewhere))
    assert "older-run" in [r.name for r in page.runs()]
    assert "1 added folder" in page.folders_label.text()
    # a new page (the next start) reads the same settings
    again = RunsPage(page.project, engine, settings=settings)
    qtbot.addWidget(again)
    assert "older-run" in [r.name for r in again.runs()]
    again.remove_folder(os.path.abspath(elsewhere))
    assert "older-run" not in [r.name for r in again.runs()]


def test_a_new_run_appears_without_refreshing_by_hand(qtbot, page, runs, demo_info):
    out, _ = runs
    n = len(page.runs())
    page.select_runs(["finished-run"])
    make_run(out, "new-run", demo_info, status="running", done=1, planned=10, adapter=False)
    qtbot.waitUntil(lambda: len(page.runs()) == n + 1, timeout=5000)  # the folder watcher (or the timer)
    assert page.runs()[0].name == "new-run" and cell(page, "new-run", "Status").startswith("running (step 1")
    assert [r.name for r in page.selected_runs()] == ["finished-run"]  # the selection is kept
    page.select_runs(["new-run"])
    assert not page.chat_button.isEnabled() and "has not written its adapter yet" in page.why_label.text()


def test_another_model_marks_the_runs(page, tmp_path):
    page.set_model_info(None)
    page.project.update(model_path=str(tmp_path / "other.gguf"))
    assert cell(page, "other-model-run", "Model") == "other.gguf"
    assert cell(page, "finished-run", "Model") == "other model: demo.gguf"


def test_status_texts_and_the_adapter_header_check(tmp_path, demo_info):
    rec = RunRecord(name="r", status="paused", steps_done=7)
    assert status_text(rec) == "paused at step 7"
    rec = RunRecord(name="r", kind="rewards", status="finished", steps_done=3)
    assert run_label(rec) == "Reward-tuned: r — 3 steps from your ratings"
    good = demo_adapter(tmp_path / "good.gguf", demo_info)
    assert adapter_problems(good, demo_info) == []
    wider = demo_adapter(tmp_path / "wider.gguf", demo_info, c=256)
    assert "do not fit" in adapter_problems(wider, demo_info)[0]
    qwen = demo_adapter(tmp_path / "qwen.gguf", demo_info, arch="qwen3")
    assert adapter_problems(qwen, demo_info)[0] == "it is for a qwen3 model, the open model is llama"
    assert "not a LoRA adapter" in adapter_problems(str(DEMO_MODEL), demo_info)[0]


def test_the_page_fits_a_small_window(page):
    hint = page.minimumSizeHint()
    assert hint.width() <= SMALL[0] and hint.height() <= SMALL[1], hint


def test_the_adapter_choice_defaults_to_the_latest_finished_run_then_the_reward_tuned_one(
    qtbot, tmp_path, demo_info
):
    out = tmp_path / "out"
    finished = make_run(out, "finished-run", demo_info)
    make_run(out, "stopped-run", demo_info, status="stopped", done=2, planned=150)
    choice = RunChoiceWidget()
    qtbot.addWidget(choice)
    seen = []
    choice.sig_changed.connect(lambda path, label: seen.append(path))
    choice.set_runs(find_runs([str(out)]), demo_info.path)
    assert choice.current_path() == finished.adapter and seen == [finished.adapter]
    # nothing finished: nothing is chosen by itself (a stopped run is listed, not picked)
    choice.set_runs([r for r in find_runs([str(out)]) if r.name == "stopped-run"], demo_info.path)
    assert choice.current_path() is None and choice.current_label().startswith("No finished run yet")
    # rating rounds applied: the newest finished run is the reward-tuned adapter, labelled so
    rewards = make_run(out, "rating rounds 2025-01-01 10:00", demo_info, kind="rewards", done=3, planned=3)
    choice.set_runs(find_runs([str(out)]), demo_info.path)
    assert choice.current_path() == rewards.adapter
    assert (
        choice.current_label() == "Reward-tuned: rating rounds 2025-01-01 10:00 — 3 steps from your ratings"
    )
    # a choice made by hand survives a refresh; another model resets it
    choice.set_path(finished.adapter)
    choice.set_runs(find_runs([str(out)]), demo_info.path)
    assert choice.current_path() == finished.adapter
    choice.set_runs(find_runs([str(out)]), str(tmp_path / "other.gguf"))
    assert choice.current_path() is None and not choice.chosen
