"""Training on several processes from the app: the Train page runs a job on 2 local processes
(`tune-engine train --ranks 2` beside the app), shows the ranks, plots the run and stops it with its
checkpoint and adapter; for machines it gives the exact mpiexec command, and the Runs page follows
that run's events file live."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QSettings

from engine import Finished, LoraAdapter, Step, TrainConfig, follow_events
from studio.pages.runs.page import RunsPage
from studio.project import Project
from tests.studio.test_train_page import TIMEOUT_MS, make_page, run

pytest.importorskip("mpi4py", reason="the test extra's mpi4py and MPICH start the processes")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def quiet_processes(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the ranks' model-hash cache
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")


def test_the_train_page_trains_on_two_processes_and_shows_the_ranks(
    qtbot, engine, tmp_path, synth_model, chats
):
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, steps=6, batch_size=2)
    page.processes.setValue(2)
    result = run(qtbot, page)
    assert isinstance(result, Finished) and result.step == 6 and not result.stopped, page.log.toPlainText()
    log = page.log.toPlainText()
    assert "Training on 2 processes" in log and "rank 0 on " in log and "rank 1 on " in log
    assert page.last_step == 6 and page.state == "finished"
    assert "2 processes" in page.state_label.toolTip()
    page.plots.flush()
    x, y = page.plots.curve_data()["loss"]
    assert list(x) == [1, 2, 3, 4, 5, 6] and np.all(np.isfinite(y))
    assert list(page.plots.curve_data()["val"][0]) == [2, 4, 6]  # the ranks' shared evaluation
    adapter = LoraAdapter.load(result.adapter_path)
    assert adapter.pairs and os.path.isdir(result.checkpoint_path)
    # the processes' own events file and settings are beside the adapter, for the Runs page
    stem = result.adapter_path[:-5]
    assert TrainConfig.from_json(json.load(open(stem + "-settings.json"))).steps == 6
    events, _ = follow_events(stem + "-events.jsonl")
    assert sum(isinstance(e, Step) for e in events) == 6


def test_stop_ends_every_process_after_a_step_with_checkpoint_and_adapter(
    qtbot, engine, tmp_path, synth_model, chats
):
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, steps=100000, batch_size=2)
    page.processes.setValue(2)
    with qtbot.waitSignal(page.sig_run_finished, timeout=TIMEOUT_MS) as done:
        assert page.start()
        assert not page.pause_button.isEnabled()  # no Pause with processes
        qtbot.waitUntil(lambda: page.last_step >= 2, timeout=TIMEOUT_MS)
        assert page.state_label.text() == "<b>training</b> on 2 processes"
        page.stop()
        assert page.state == "stopping"
    result = done.args[0]
    assert isinstance(result, Finished) and result.stopped and result.step >= 2
    assert LoraAdapter.load(result.adapter_path).pairs
    assert os.path.basename(result.checkpoint_path) == f"ckpt-{result.step:06d}"


def test_across_machines_gives_the_command_and_the_runs_page_follows_its_events_live(
    qtbot, engine, tmp_path, synth_model, chats
):
    model = synth_model("llama")
    page = make_page(qtbot, engine, tmp_path, model, chats, steps=5, batch_size=2)
    dialog = page.show_machines()
    qtbot.addWidget(dialog)
    dialog.hosts.setText("this-box, other-box")
    dialog.ranks.setValue(4)
    line = dialog.command_line()
    assert line.startswith("mpiexec -n 4 -hosts this-box,other-box tune-engine train ")
    assert f" {model} " in line and " --collective mpi" in line and f"--events {dialog.files.events}" in line
    assert dialog.command_text.toPlainText() == line

    # the command as a person runs it (here: 2 ranks on this machine instead of 4 on two)
    from engine.train.collective import find_mpiexec

    command = dialog.files.command(model, ranks=4, hosts=["this-box", "other-box"])
    at = command.index("tune-engine")
    local = [find_mpiexec(), "-n", "2", sys.executable, "-m", "engine.cli", *command[at + 1 :]]
    done = subprocess.run(local, capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    written = Path(dialog.files.events).read_text().splitlines()
    assert json.loads(written[0])["plan"]["ranks"] == 2

    # the Runs page follows an events file as it grows: replay the run's lines one by one
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    dialog.qsettings = settings
    followed = Path(dialog.files.events)
    followed.write_text("")  # the run starts over, the page follows from the first line
    dialog.follow()
    project = Project()
    project.update(model_path=model, output_dir=str(tmp_path / "elsewhere"))
    runs = RunsPage(project, engine, settings=settings)
    qtbot.addWidget(runs)
    runs.show()
    qtbot.waitExposed(runs)
    assert not runs.runs()  # nothing written yet: no run
    seen_running = []
    with open(followed, "a", encoding="utf-8") as f:
        for line in written:
            f.write(line + "\n")
            f.flush()
            event = json.loads(line)["event"]
            if event == "Step" and json.loads(line)["step"] == 3:
                qtbot.waitUntil(lambda: bool(runs.runs()) and runs.runs()[0].steps_done == 3, timeout=5000)
                seen_running.append(runs.runs()[0].status)
    qtbot.waitUntil(lambda: runs.runs() and runs.runs()[0].status == "finished", timeout=5000)
    rec = runs.runs()[0]
    assert seen_running == ["running"]
    assert rec.steps_done == rec.steps_planned == 5 and len(rec.losses) == 5
    assert rec.adapter == dialog.files.out and rec.model == model
    np.testing.assert_allclose([x[1] for x in rec.losses], [json.loads(x)["mean_ce"] for x in written
                                                           if json.loads(x)["event"] == "Step"])  # fmt: skip


def test_a_run_resumes_from_its_checkpoint_on_two_processes_with_its_plan_tokens_and_time(
    qtbot, engine, tmp_path, synth_model, chats
):
    """A run of the app (one process) resumed from its step-3 checkpoint with Processes at 2: the
    processes continue it with its settings (`--resume`), to its planned step, as the app would have."""
    from tests.studio.test_train_page import settle

    model = synth_model("llama")
    settings = dict(steps=6, batch_size=2, eval_every=0, val_split=0.0, checkpoint_every=3)
    page = make_page(qtbot, engine, tmp_path, model, chats, **settings)
    first = run(qtbot, page)
    settle(qtbot, page)
    assert isinstance(first, Finished) and first.step == 6
    ref_x, ref_y = page.plots.curve_data()["loss"]
    ref_tokens, ref_adapter = page.tokens_done, LoraAdapter.load(first.adapter_path)
    ckpt = Path(first.checkpoint_path).parent / "ckpt-000003"

    other = make_page(qtbot, engine, tmp_path, model, chats, **settings)
    other.processes.setValue(2)
    result = run(qtbot, other, lambda: other.resume_from(str(ckpt)))
    assert isinstance(result, Finished) and result.step == 6 and not result.stopped, other.log.toPlainText()
    log = other.log.toPlainText()
    assert "Training on 2 processes" in log and f"--resume {ckpt}" in log and "rank 1 on " in log
    assert other.tokens_done == ref_tokens  # the checkpoint's tokens, then the new steps'
    other.plots.flush()
    x, y = other.plots.curve_data()["loss"]
    assert list(x) == list(ref_x) == [1, 2, 3, 4, 5, 6]  # the run's curve up to step 3, then 4-6
    np.testing.assert_allclose(y, ref_y, rtol=1e-5)
    assert result.adapter_path == first.adapter_path  # the same run, its own files
    again = LoraAdapter.load(result.adapter_path)
    for name, (a, b) in ref_adapter.pairs.items():
        np.testing.assert_allclose(again.pairs[name][0], a, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(again.pairs[name][1], b, rtol=1e-4, atol=1e-6)
