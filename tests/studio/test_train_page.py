"""The Train page with real (tiny) training runs as jobs of the app's engine worker: settings bound to
the project, Start → plots and heatmaps filled, Pause → Resume in memory, Stop, failures in a banner,
the UI's longest stall during a run, and screenshots of the page."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtWidgets import QCheckBox, QComboBox

import engine.train.trainer as trainer_module
from engine import DatasetError, Failed, Finished, MemoryEstimate, Step, TargetSpec, TrainConfig, Trainer
from studio.dataset_document import DatasetDocument
from studio.pages.train.controller import PHASE_DATA, PHASE_FIRST_STEP, PHASE_OPENING, eta_words
from studio.pages.train.page import TrainPage
from studio.pages.train.settings import FIELDS
from studio.paths import latest_checkpoint
from studio.project import ModelInfo, Project, model_runs_folder, preset_settings
from studio.train_probe import StallProbe
from tests.conftest import write_chats

TIMEOUT_MS = 20_000
SHOTS = Path(os.environ.get("TUNE_STUDIO_SHOTS", "")) if os.environ.get("TUNE_STUDIO_SHOTS") else None


@pytest.fixture
def chats(tmp_path):
    return write_chats(
        tmp_path / "chats.jsonl",
        (
            (
                f"What is {i} plus {i}? Answer in one sentence.",
                f"{i} plus {i} is {2 * i}, because doubling {i} gives it.",
            )
            for i in range(12)
        ),
    )


def make_page(qtbot, engine, tmp_path, model: str, chats: str, dataset=None, **config) -> TrainPage:
    project = Project()
    project.update(model_path=model, dataset_path=chats, output_dir=str(tmp_path / "out"))
    settings = dict(steps=6, n_ctx=128, val_split=0.25, eval_every=2, targets=TargetSpec(preset="all"))
    project.update_config(**{**settings, **config})
    page = TrainPage(project, engine, dataset)
    page.check_timer.setInterval(10)  # the check's debounce (400 ms) is not what these tests wait for
    qtbot.addWidget(page)
    page.set_model_info(ModelInfo.read(model))
    page.resize(1280, 820)
    return page


def run(qtbot, page: TrainPage, action=None) -> object:
    """Press Start (or call `action`) and wait for the run's Finished/Failed."""
    with qtbot.waitSignal(page.sig_run_finished, timeout=TIMEOUT_MS) as done:
        assert (action or page.start)()
    return done.args[0]


def settle(qtbot, page: TrainPage) -> None:
    """The engine has no job left and every plot panel is drawn."""
    qtbot.waitUntil(lambda: not page.is_running() and not page.engine.jobs, timeout=TIMEOUT_MS)
    page.plots.flush()


class Gate:
    """Holds the run right after its step `step` until `release()`: a test's way to press Pause or
    Stop at a known step of a run that would otherwise finish in milliseconds."""

    def __init__(self, monkeypatch, step: int):
        self.step = step
        self._reached, self._go = threading.Event(), threading.Event()
        real = Trainer.train_step

        def gated(trainer, on_event=lambda e: None):
            result = real(trainer, on_event)
            if trainer.step == self.step and not self._reached.is_set():
                self._reached.set()
                self._go.wait(TIMEOUT_MS / 1000)
            return result

        monkeypatch.setattr(Trainer, "train_step", gated)

    def reached(self) -> bool:
        return self._reached.is_set()

    def release(self) -> None:
        self._go.set()


# --- settings ---------------------------------------------------------------------------------
def test_settings_edit_the_project_config_and_follow_it(qtbot, engine, tmp_path, synth_model, chats):
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats)
    project, editors = page.project, page.settings.editors
    editors["lr"].setValue(5e-5)
    editors["steps"].setValue(40)
    editors["n_ctx"].setValue(256)
    editors["grad_accum"].setValue(4)
    editors["val_split"].setValue(0.1)
    editors["schedule"].setCurrentIndex(editors["schedule"].findData("linear"))
    editors["train_on_prompt"].setChecked(True)
    editors["checkpoint_layers"].setCurrentIndex(editors["checkpoint_layers"].findData("on"))
    editors["cache_budget"].setCurrentIndex(editors["cache_budget"].findData("off"))
    editors["out_type"].setCurrentIndex(editors["out_type"].findData("Q8_0"))
    cfg = project.config
    assert cfg.lr == pytest.approx(5e-5) and cfg.steps == 40 and cfg.n_ctx == 256 and cfg.grad_accum == 4
    assert cfg.val_split == pytest.approx(0.1) and cfg.schedule == "linear" and cfg.out_type == "Q8_0"
    assert cfg.train_on_prompt and cfg.checkpoint_layers == "on" and cfg.cache_budget == "off"
    assert project.dirty
    # the KL coefficient only means something in group-relative mode
    assert not editors["kl_coef"].isEnabled()
    editors["reward_mode"].setCurrentIndex(editors["reward_mode"].findData("group"))
    assert project.config.reward_mode == "group" and editors["kl_coef"].isEnabled()
    # a change made elsewhere (a loaded project) shows in the form
    project.update_config(lr=3e-4, seed=7, schedule="constant", train_on_prompt=False)
    assert editors["lr"].value() == pytest.approx(3e-4) and editors["lr"].text() == "0.0003"
    assert editors["seed"].value() == 7 and editors["schedule"].currentData() == "constant"
    assert not editors["train_on_prompt"].isChecked()
    # every setting says what it does and its default; the groups are the documented ones
    for name, editor in editors.items():
        assert "Default:" in editor.toolTip() and len(editor.toolTip()) > 30, name
    assert "Default: 0.0002." in editors["lr"].toolTip()
    assert list(page.settings.groups) == ["Basics", "Optimizer", "Data", "Rewards", "Preferences", "Advanced"]
    expected = {"lr", "schedule", "warmup_steps", "epochs", "steps", "n_ctx", "batch_size", "grad_accum",
                "val_split", "eval_every", "weight_decay", "gclip", "max_grad_norm", "seed", "reward_mode",
                "kl_coef", "train_on_prompt", "checkpoint_layers", "cache_budget", "checkpoint_every",
                "out_type"}  # fmt: skip
    assert expected <= set(FIELDS)
    assert isinstance(editors["train_on_prompt"], QCheckBox) and isinstance(editors["schedule"], QComboBox)


# --- a whole run ------------------------------------------------------------------------------
def test_start_fills_plots_heatmap_progress_and_log(qtbot, engine, tmp_path, synth_model, chats):
    model = synth_model("llama")
    page = make_page(qtbot, engine, tmp_path, model, chats, steps=6)
    states = []
    page.sig_state_changed.connect(states.append)
    result = run(qtbot, page)
    settle(qtbot, page)
    assert isinstance(result, Finished) and result.step == 6 and not result.stopped
    assert states == ["loading", "training", "finished"] and page.state == "finished"
    data = page.plots.curve_data()
    for name in ("loss", "lr", "grad_norm", "tokens_per_s"):
        x, y = data[name]
        assert list(x) == [1, 2, 3, 4, 5, 6], name
        assert np.all(np.isfinite(y)), name
    assert list(data["val"][0]) == [2, 4, 6]  # eval every 2 steps
    norm_curves = {k: v for k, v in data.items() if k.startswith("norm:")}
    kinds = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    assert set(norm_curves) == {f"norm:{k}" for k in kinds}
    assert all(len(x) == 6 for x, _ in norm_curves.values())
    values = page.plots.norm_map.values
    assert values.shape == (2, 7) and np.all(values > 0)  # 2 layers x 7 kinds, every tensor adapted
    assert page.plots.norm_map.y_labels[0] == "attn_q" and page.plots.norm_map.x_labels == ["0", "1"]
    assert page.plots.expert_panel.isHidden()  # a dense model has no expert heatmap
    assert page.progress.value() == 6 and page.progress.maximum() == 6
    stats = page.stats_label.text()
    assert "Finished at step 6 of 6" in stats and "tokens processed" in stats
    log = page.log.toPlainText()
    assert "Started: 9 training / 3 validation samples" in log and "eval at step 2" in log
    assert "checkpoint at step 6" in log and "Finished at step 6" in log
    # default output: <output folder>/<dataset stem>-<time>.gguf, checkpoints in a sibling folder
    out = Path(result.adapter_path)
    assert out.parent == tmp_path / "out" and out.name.startswith("chats-") and out.exists()
    assert Path(result.checkpoint_path).parent == out.with_name(out.stem + "-checkpoints")
    assert str(out) in page.paths_label.full_text()
    assert page.banner_text() == ""
    # finished runs offer a new Start, not Resume
    assert page.start_button.isEnabled() and not page.resume_button.isEnabled()
    assert not page.pause_button.isEnabled() and not page.stop_button.isEnabled()


def test_moe_run_shows_the_layers_by_experts_heatmap(qtbot, engine, tmp_path, synth_model, chats):
    model = synth_model("qwen3moe")
    page = make_page(qtbot, engine, tmp_path, model, chats, steps=4, val_split=0.0)
    counts = []
    real = page.plots.add_event

    def spy(event):
        if type(event).__name__ == "ExpertUsage":
            counts.append(np.array(event.counts))
        real(event)

    page.plots.add_event = spy
    run(qtbot, page)
    settle(qtbot, page)
    info = ModelInfo.read(model)
    L, E = info.summary.config.L, info.summary.config.E
    assert len(counts) == 4
    shown = page.plots.expert_map.values
    assert shown.shape == (L, E) == (2, 4)
    np.testing.assert_array_equal(shown, np.sum(counts, axis=0))  # summed since the start
    assert "summed over steps 1–4" in page.plots.expert_map.caption.text()
    page.plots.expert_latest_box.setChecked(True)
    np.testing.assert_array_equal(page.plots.expert_map.values, counts[-1])
    assert "during step 4" in page.plots.expert_map.caption.text()
    assert not page.plots.expert_panel.isHidden()
    assert "ffn_gate_exps" in page.plots.norm_map.y_labels and "ffn_gate_inp" in page.plots.norm_map.y_labels


# --- pause, resume, stop ----------------------------------------------------------------------
def test_pause_then_resume_in_memory_continues_the_run(
    qtbot, engine, monkeypatch, tmp_path, synth_model, chats
):
    page = make_page(
        qtbot, engine, tmp_path, synth_model("llama"), chats, steps=10, eval_every=0, val_split=0.0
    )
    gate = Gate(monkeypatch, step=4)
    states = []
    page.sig_state_changed.connect(states.append)
    page.start()
    qtbot.waitUntil(lambda: page.last_step == 4, timeout=TIMEOUT_MS)  # the UI saw step 4
    assert page.state == "training" and page.pause_button.isEnabled()
    page.pause()
    assert page.state == "pausing" and not page.pause_button.isEnabled()
    gate.release()
    qtbot.waitUntil(lambda: page.state == "paused", timeout=TIMEOUT_MS)
    assert page.resume_button.isEnabled() and page.stop_button.isEnabled() and not page.is_running()
    assert latest_checkpoint(page.paths.checkpoint_dir) is None  # nothing written: the run is in memory
    opened = engine.model
    out = page.paths.out
    result = run(qtbot, page, page.resume)
    settle(qtbot, page)
    assert engine.model is opened  # the same model: nothing reloaded
    assert isinstance(result, Finished) and not result.stopped and result.step == 10
    assert page.paths.out == out == result.adapter_path  # the same run, the same files
    x, _ = page.plots.curve_data()["loss"]
    assert list(x) == list(range(1, 11))  # steps continue from 5: no gap, no repeat
    assert states == ["loading", "training", "pausing", "paused", "training", "finished"]
    assert "Resuming at step 4" in page.log.toPlainText()
    assert page.progress.value() == 10
    assert not page.resume_button.isEnabled()  # nothing left to resume


def test_stop_while_paused_ends_the_run_with_its_checkpoint(
    qtbot, engine, monkeypatch, tmp_path, synth_model, chats
):
    page = make_page(
        qtbot, engine, tmp_path, synth_model("llama"), chats, steps=10, eval_every=0, val_split=0.0
    )
    gate = Gate(monkeypatch, step=3)
    page.start()
    qtbot.waitUntil(lambda: page.last_step == 3, timeout=TIMEOUT_MS)
    page.pause()
    gate.release()
    qtbot.waitUntil(lambda: page.state == "paused", timeout=TIMEOUT_MS)
    result = run(qtbot, page, lambda: page.stop() or True)
    settle(qtbot, page)
    assert isinstance(result, Finished) and result.stopped and result.step == 3
    assert result.checkpoint_path.endswith("ckpt-000003") and Path(result.adapter_path).exists()
    assert page.state == "finished" and page.resume_button.isEnabled()  # from the checkpoint now


def test_stop_ends_gracefully_without_asking(qtbot, engine, monkeypatch, tmp_path, synth_model, chats):
    page = make_page(
        qtbot, engine, tmp_path, synth_model("llama"), chats, steps=50, eval_every=0, val_split=0.0
    )
    gate = Gate(monkeypatch, step=2)
    with qtbot.waitSignal(page.sig_run_finished, timeout=TIMEOUT_MS) as stopped:
        page.start()
        qtbot.waitUntil(lambda: page.last_step == 2, timeout=TIMEOUT_MS)
        page.stop_button.click()  # no dialog: the test would hang on one
        assert page.state == "stopping"
        gate.release()
    result = stopped.args[0]
    assert isinstance(result, Finished) and result.stopped and result.step == 2
    assert Path(result.adapter_path).exists() and result.checkpoint_path.endswith("ckpt-000002")
    assert page.state == "finished" and "Stopped at step 2" in page.log.toPlainText()
    assert page.resume_button.isEnabled()  # a stopped run can still be continued
    settle(qtbot, page)


def test_resume_from_a_chosen_checkpoint_folder(qtbot, engine, monkeypatch, tmp_path, synth_model, chats):
    model = synth_model("llama")
    page = make_page(
        qtbot, engine, tmp_path, model, chats, steps=6, eval_every=0, val_split=0.0, checkpoint_every=3
    )
    first = run(qtbot, page)
    settle(qtbot, page)
    ckpt_dir = Path(first.checkpoint_path).parent
    other = make_page(qtbot, engine, tmp_path, model, chats, steps=8, eval_every=0, val_split=0.0)
    asked = []
    other.ask_resume = lambda text, run_data: asked.append(text) or "cancel"
    assert not other.resume_from(str(ckpt_dir))  # its settings differ from the run's: asked, cancelled
    assert "steps 6 -> 8" in asked[0] and other.state == "idle"
    other.ask_resume = lambda text, run_data: "page"  # the page's settings: 8 steps, a new trajectory
    result = run(qtbot, other, lambda: other.resume_from(str(ckpt_dir)))  # the folder: newest inside
    settle(qtbot, other)
    assert isinstance(result, Finished) and result.step == 8
    assert list(other.plots.curve_data()["loss"][0]) == list(range(1, 9))  # the run's curve, then 7, 8
    assert other.paths.checkpoint_dir == str(ckpt_dir)
    assert other.paths.out == str(ckpt_dir)[: -len("-checkpoints")] + ".gguf"
    assert not other.resume_from(str(tmp_path))  # not a checkpoint: a banner, no run
    assert "is not a checkpoint" in other.banner_text()


# --- errors -----------------------------------------------------------------------------------
def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_folder(
    qtbot, engine, monkeypatch, tmp_path, synth_model, chats
):
    """The engine refuses the data at start: a banner says what to do, with a link to the page that
    fixes it; neither the checkpoint folder nor the output folder the run would have made is left."""

    def refuse(trainer):
        raise DatasetError("the dataset has no usable sample (2 problems)")

    monkeypatch.setattr(Trainer, "_prepare", refuse)
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats)
    out = tmp_path / "out"
    assert not out.exists()
    assert page.banner.isHidden()
    result = run(qtbot, page)
    settle(qtbot, page)
    assert isinstance(result, Failed) and result.step == 0
    assert page.state == "failed" and not page.banner.isHidden()
    text = page.banner_text()
    assert "Training failed before training started: the dataset has no usable sample" in text
    assert "Go to the Dataset page" in text and "'" not in text
    with qtbot.waitSignal(page.sig_go_to_page) as go:
        page.banner.label.linkActivated.emit("page:Dataset")
    assert go.args == ["Dataset"]
    assert "FAILED" in page.log.toPlainText()
    assert not out.exists(), list(out.rglob("*"))  # no empty checkpoint folder, no output folder
    assert page.start_button.isEnabled()


def test_unexpected_error_in_the_worker_reaches_the_banner(
    qtbot, engine, monkeypatch, tmp_path, synth_model, chats
):
    def broken(*args, **kwargs):
        raise ValueError("shapes do not match")

    monkeypatch.setattr(trainer_module, "loss_and_grads", broken)
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats)
    result = run(qtbot, page)
    settle(qtbot, page)
    assert isinstance(result, Failed) and page.state == "failed"
    assert "ValueError: shapes do not match" in page.banner_text() and "bug" in page.banner_text()
    log = page.log.toPlainText()
    assert "ERROR:" in log and "Traceback" in log and "shapes do not match" in log
    monkeypatch.undo()
    assert isinstance(run(qtbot, page), Finished)  # the same window and engine train again
    settle(qtbot, page)


def test_a_model_file_that_is_not_gguf_fails_in_plain_words(qtbot, engine, tmp_path, synth_model, chats):
    fake = tmp_path / "notes.gguf"
    fake.write_text("hello, this is not a model", encoding="utf-8")
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats)
    page.project.update(model_path=str(fake))
    result = run(qtbot, page)
    settle(qtbot, page)
    assert isinstance(result, Failed) and page.state == "failed"
    text = page.banner_text()
    assert "not a GGUF file" in text and '"hell"' in text and "b'" not in text, text
    assert not (tmp_path / "out").exists()


def test_missing_model_dataset_or_output_folder_shows_a_banner(qtbot, engine, tmp_path, synth_model, chats):
    project = Project()
    page = TrainPage(project, engine)
    qtbot.addWidget(page)
    assert (
        not page.start() and "No model is chosen" in page.banner_text() and "Model page" in page.banner_text()
    )
    assert page.state == "idle"
    project.update(model_path=synth_model("llama"))
    assert not page.start() and "No dataset is chosen" in page.banner_text()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    project.update(dataset_path=chats, output_dir=str(blocker / "out"))
    assert not page.start()
    assert "cannot be written" in page.banner_text() and "Output folder" in page.banner_text()
    assert page.state == "idle" and not page.is_running()
    page.hide_banner()
    assert page.banner_text() == ""


# --- before Start: the planned steps, and what stops a run from starting ----------------------------
def checked(qtbot, page: TrainPage) -> None:
    """The check of the next run (an engine job, debounced) is done and shown."""
    qtbot.waitUntil(lambda: not page.check_timer.isActive() and page.checker.job is None, timeout=TIMEOUT_MS)


def test_the_progress_bar_shows_the_planned_steps_before_start_and_they_are_the_runs(
    qtbot, engine, tmp_path, synth_model, chats
):
    doc = DatasetDocument()
    doc.open(chats)
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, dataset=doc, steps=0, epochs=2,
                     val_split=0.25, eval_every=0)  # fmt: skip
    checked(qtbot, page)
    plan = page.check.plan
    assert plan.total_steps > 1 and (plan.n_train, plan.n_val) == (9, 3)
    assert page.progress.maximum() == plan.total_steps and page.progress.value() == 0
    assert page.progress.text() == f"0 / {plan.total_steps} steps"
    assert page.stats_label.text().startswith(f"Next run: {plan.total_steps} steps (2 epochs of ")
    assert page.plots.placeholder_shown and "Train a LoRA adapter" in page.plots.placeholder.text()
    # a setting that changes the count is checked again
    page.settings.editors["batch_size"].setValue(2)
    checked(qtbot, page)
    assert page.check.plan.batches_per_epoch == -(-plan.n_windows // 2)
    assert page.progress.maximum() == page.check.plan.total_steps < plan.total_steps
    # the samples the editor shows, unsaved edits included, are what is counted
    doc.remove([0, 1, 2, 3], "delete 4 samples")
    checked(qtbot, page)
    assert page.check.plan.n_samples == 8 and page.check.plan.n_train == 6
    expected = page.check.plan
    starts = []
    real = page.plots.add_event
    page.plots.add_event = lambda e: (starts.append(e) if type(e).__name__ == "Started" else None, real(e))
    with qtbot.waitSignal(page.sig_run_finished, timeout=TIMEOUT_MS):
        assert page.start()
        assert page.progress.maximum() == expected.total_steps and page.progress.value() == 0
        assert not page.plots.placeholder_shown
        # the step axes have their final range before the engine starts, and the run's Started event
        # and steps do not move them again (each move repaints every shown panel's axes)
        assert {k.x_hi for k in page.plots.ranges.values()} == {expected.total_steps}
        moved = []
        for name, keeper in page.plots.ranges.items():
            keeper.plot.sigXRangeChanged.connect(lambda *_, n=name: moved.append(n))
    settle(qtbot, page)
    assert moved == []
    got = starts[0].plan
    assert (got.total_steps, got.n_windows, got.n_train, got.n_val) == (
        expected.total_steps, expected.n_windows, expected.n_train, expected.n_val)  # fmt: skip
    assert got.tokens_per_epoch == expected.tokens_per_epoch
    assert page.progress.value() == page.progress.maximum() == expected.total_steps
    # Start again: the previous run's numbers and plots are cleared at once
    with qtbot.waitSignal(page.sig_run_finished, timeout=TIMEOUT_MS):
        assert page.start()
        assert page.progress.value() == 0 and "Finished" not in page.stats_label.text()
        assert len(page.plots.curve_data()["loss"][0]) == 0 and page.tokens_done == 0
    settle(qtbot, page)


def test_a_plan_unlikely_to_change_the_model_is_named_before_start_with_its_numbers(
    qtbot, engine, tmp_path, synth_model, chats
):
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, steps=3, lr=2e-4, val_split=0.0)
    checked(qtbot, page)
    text = page.reason_label.text()
    assert page.start_button.isEnabled() and page.reason_label.isVisibleTo(page)
    assert "unlikely to change the model" in text and "3 optimizer steps" in text
    assert "0.0002 × 3 = 0.0006" in text
    page.settings.preset_combo.activated.emit(page.settings.preset_combo.findText("balanced"))
    checked(qtbot, page)
    assert page.reason_label.isHidden() and page.check.plan.total_steps >= 60


def test_start_is_disabled_with_the_reason_and_a_link_to_the_page_that_fixes_it(
    qtbot, engine, monkeypatch, tmp_path, synth_model, chats
):
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, targets=TargetSpec(preset="none"))
    checked(qtbot, page)
    assert not page.start_button.isEnabled() and page.reason_label.isVisibleTo(page)
    reason = page.reason_label.text()
    assert "nothing is chosen to train" in reason and 'href="page:Targets"' in reason
    with qtbot.waitSignal(page.sig_go_to_page) as go:
        page.reason_label.linkActivated.emit("page:Targets")
    assert go.args == ["Targets"]
    assert not page.start() and "Go to the Targets page" in page.banner_text()
    assert page.state == "idle" and not engine.jobs
    page.project.update_config(targets=TargetSpec(preset="attention"))
    checked(qtbot, page)
    assert page.start_button.isEnabled() and "Start is unavailable" not in page.reason_label.text()
    # a run that would not fit in memory: the engine's advice
    monkeypatch.setattr(MemoryEstimate, "fits", lambda self, available=None: False)
    page.project.update_config(n_ctx=256)
    checked(qtbot, page)
    assert not page.start_button.isEnabled()
    assert "would not fit in memory" in page.reason_label.text() and "GiB is free" in page.reason_label.text()
    monkeypatch.undo()
    # no sample with a token to learn from
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nothing": "useful"}\nnot json\n', encoding="utf-8")
    page.project.update(dataset_path=str(bad))
    checked(qtbot, page)
    reason = page.reason_label.text()
    assert (
        not page.start_button.isEnabled() and "no usable sample" in reason and 'href="page:Dataset"' in reason
    )
    assert "b'" not in reason and "Problem(" not in reason
    page.project.update(dataset_path=chats)
    checked(qtbot, page)
    assert page.start_button.isEnabled()


def test_the_stats_line_shows_the_run_time_once_and_the_time_left_in_words(
    qtbot, engine, tmp_path, synth_model, chats
):
    assert eta_words(30) == "less than a minute left" and eta_words(540) == "about 9 min left"
    assert eta_words(7800) == "about 2 h 10 min left" and eta_words(3600) == "about 1 h left"
    assert eta_words(float("nan")).startswith("estimating")
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats)
    page._set_state("loading")
    page._set_state("training")
    page._on_event(Step(4, 24, 0.5, 2.0, 2.0, 1e-4, 1.0, 100, 900.0, 125.0, 540.0))
    page._refresh_progress()
    text = page.stats_label.text()
    assert "Step 4 of 24" in text and "2:05 elapsed" in text and "about 9 min left" in text
    # after a pause (or a resume from a checkpoint) the engine's figure goes on: it is shown, not added up
    page._on_event(Step(5, 24, 0.6, 2.0, 2.0, 1e-4, 1.0, 100, 900.0, 200.0, 480.0))
    page._refresh_progress()
    assert "3:20 elapsed" in page.stats_label.text() and "about 8 min left" in page.stats_label.text()
    page._set_state("finished")


def test_a_starting_run_says_what_it_does_and_a_long_run_alerts_when_it_ends(
    qtbot, engine, monkeypatch, tmp_path, synth_model, chats
):
    from PySide6.QtWidgets import QApplication, QMainWindow

    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, steps=3)
    window = QMainWindow()
    qtbot.addWidget(window)
    window.setCentralWidget(page)
    shown = []
    real_set = page.stats_label.setText
    page.stats_label.setText = lambda text: (shown.append(text), real_set(text))
    alerts = []
    monkeypatch.setattr(QApplication, "alert", staticmethod(lambda widget, ms=0: alerts.append(widget)))
    page.notify_after_s = 0.0  # every run is "long" here
    assert engine.model is None  # the model opens with the run
    gate = Gate(monkeypatch, step=1)  # held after step 1 until the page has shown it (3 steps take ms)

    def start() -> bool:
        ok = page.start()
        qtbot.waitUntil(gate.reached, timeout=TIMEOUT_MS)
        qtbot.waitUntil(lambda: any(t.startswith("Step ") for t in shown), timeout=TIMEOUT_MS)
        gate.release()
        return ok

    run(qtbot, page, start)
    settle(qtbot, page)
    phases = [t for t in shown if t in (PHASE_OPENING, PHASE_DATA, PHASE_FIRST_STEP)]
    assert phases[:3] == [PHASE_OPENING, PHASE_DATA, PHASE_FIRST_STEP], shown
    first_step = next(i for i, t in enumerate(shown) if t.startswith("Step "))
    assert shown.index(PHASE_FIRST_STEP) < first_step
    assert alerts == [window]
    assert window.statusBar().currentMessage().startswith("Training finished at step 3 after ")
    # a short run does not
    page.notify_after_s = 3600.0
    page._segment_t0 = time.monotonic() - 5
    page._notify_end(page.last_result)
    assert alerts == [window]


def test_the_event_log_follows_new_lines_unless_scrolled_up(qtbot, engine, tmp_path, synth_model, chats):
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats)
    page.show()
    qtbot.waitExposed(page)
    for i in range(200):
        page._log(f"line {i}")
    bar = page.log.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() == bar.maximum()
    bar.setValue(10)  # the person scrolled up to read
    for i in range(50):
        page._log(f"more {i}")
    assert bar.value() == 10
    bar.setValue(bar.maximum())
    page._log("last")
    assert bar.value() == bar.maximum()


# --- the model changes ----------------------------------------------------------------------------
def test_a_new_model_resets_resume_and_settings_and_refuses_old_checkpoints(
    qtbot, engine, tmp_path, synth_model, chats
):
    llama, qwen = synth_model("llama"), synth_model("qwen3")
    page = make_page(
        qtbot, engine, tmp_path, llama, chats, lr=1e-3, steps=40, targets=TargetSpec(preset="mlp")
    )
    # a run of llama, paused in memory
    page.run_model, page.paths, page.last_step = llama, page.default_paths(), 3
    for state in ("loading", "training", "pausing", "paused"):
        page._set_state(state)
    assert page.resume_button.isEnabled()
    page.project.update(model_path=qwen)  # the Model page opens another model...
    page.set_model_info(ModelInfo.read(qwen))  # ...and the window tells the pages when it is open
    assert page.state == "idle" and not page.resume_button.isEnabled() and not page.resume()
    assert "ended with its model" in page.log.toPlainText()
    cfg = page.project.config
    n_params = ModelInfo.read(qwen).summary.n_params
    want = preset_settings("balanced", n_params, page.settings.data)  # the default preset, for its size
    assert {k: getattr(cfg, k) for k in want} == want and cfg.lr != 1e-3
    assert cfg.targets == TargetSpec(preset="mlp")  # the Targets page's choice stays
    assert "new model" in page.banner_text() and page.banner_level == "info"
    assert page.settings.preset_combo.currentText() == "balanced"
    # a checkpoint of the other model is not continued on this one
    ckpt = tmp_path / "old-checkpoints" / "ckpt-000002"
    ckpt.mkdir(parents=True)
    (ckpt / "state.npz").write_bytes(b"")
    meta = {"step": 2, "model": llama, "config": TrainConfig().to_json()}
    (ckpt / "trainer.json").write_text(json.dumps(meta))
    assert not page.resume_from(str(ckpt.parent))
    assert (
        f"trained on {Path(llama).name}" in page.banner_text()
        and "Go to the Model page" in page.banner_text()
    )
    assert page.state == "idle" and not engine.jobs
    # a project opened with its model keeps its own settings
    saved = page.project.to_json()
    saved["config"]["lr"] = 5e-4
    page.project.restore(saved, None)
    page.set_model_info(ModelInfo.read(qwen))
    assert page.project.config.lr == 5e-4
    # the default output folder is the model's runs home in the app's data folder, never beside an input
    page.project.update(output_dir=None)
    assert model_runs_folder(qwen) in page.paths_label.full_text()
    assert str(Path(chats).parent) not in page.paths_label.full_text()


def test_presets_set_the_settings_for_the_model_size_and_say_what_they_set(
    qtbot, engine, tmp_path, synth_model, chats
):
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats)
    combo = page.settings.preset_combo
    n = page.info.summary.n_params
    assert page.settings.n_params == n
    assert [combo.itemText(i) for i in range(combo.count())] == [
        "quick",
        "balanced",
        "thorough",
        "engine defaults",
        "custom",
    ]
    assert combo.currentText() == "custom"  # make_page's own settings
    qtbot.waitUntil(lambda: page.settings.data is not None, timeout=30_000)  # the check measured the data
    combo.activated.emit(combo.findText("quick"))
    cfg = page.project.config
    for name, value in preset_settings("quick", n, page.settings.data).items():
        assert getattr(cfg, name) == pytest.approx(value), name
    assert combo.currentText() == "quick" and page.settings.editors["steps"].value() == 30
    tip = combo.toolTip()
    for name in ("quick", "balanced", "thorough"):
        assert f"{name}: " in tip
    n_samples = page.settings.data.n_samples
    assert "learning rate 0.002" in tip and "tiny" in tip and f"for {n_samples} samples" in tip
    page.settings.editors["lr"].setValue(0.05)
    assert combo.currentText() == "custom"
    combo.activated.emit(combo.findText("engine defaults"))
    assert page.project.config.lr == TrainConfig().lr and page.project.config.targets == TargetSpec(
        preset="all"
    )


# --- first look and fit ----------------------------------------------------------------------------
def test_first_look_says_what_to_do_and_start_is_the_primary_button(qtbot, engine):
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QApplication

    page = TrainPage(Project(), engine)
    qtbot.addWidget(page)
    assert page.plots.placeholder_shown
    first = page.plots.placeholder.text()
    assert "Train a LoRA adapter" in first and 'href="page:Model"' in first and 'href="page:Dataset"' in first
    assert "Start" in first and "Ctrl+Enter" in first
    with qtbot.waitSignal(page.sig_go_to_page) as go:
        page.plots.placeholder.linkActivated.emit("page:Model")
    assert go.args == ["Model"]
    assert not page.start_button.isEnabled() and "No model is chosen" in page.reason_label.text()
    b = page.start_button
    assert b.isDefault() and b.font().bold()
    app = QApplication.palette()
    assert b.palette().color(QPalette.Active, QPalette.Button) == app.color(QPalette.Highlight)
    assert b.palette().color(QPalette.Active, QPalette.ButtonText) == app.color(QPalette.HighlightedText)
    assert not page.pause_button.isDefault() and not page.pause_button.font().bold()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_page_fits_a_1024x640_window_without_cutting_a_control(
    qtbot, engine, tmp_path, synth_model, chats, theme
):
    """The page's share of a 1024x640 window (less the navigation, menu and status bars): nothing
    needs more, no button is narrower than its text, the settings column scrolls, and the texts
    keep their contrast in both palettes."""
    from PySide6.QtCore import QPoint
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QApplication, QPushButton

    from studio.widgets.theme import apply_theme

    app = QApplication.instance()
    old_palette, old_style = app.palette(), app.style().name()
    apply_theme(app, theme)
    try:
        page = make_page(
            qtbot, engine, tmp_path, synth_model("llama"), chats, targets=TargetSpec(preset="none")
        )
        checked(qtbot, page)  # a reason under the buttons: the tallest state of the header
        size = (1024 - 170, 640 - 100)
        hint = page.minimumSizeHint()
        assert hint.width() <= size[0] and hint.height() <= size[1], hint
        page.resize(*size)
        page.show()
        qtbot.waitExposed(page)
        qtbot.wait(20)
        assert (page.width(), page.height()) == size
        buttons = [*page.findChildren(QPushButton), page.settings.preset_combo]
        for b in buttons:
            if not b.isVisibleTo(page):
                continue
            assert b.width() >= b.sizeHint().width() or b.width() >= b.minimumSizeHint().width(), b.text()
            right = b.mapTo(page, QPoint(b.width(), b.height()))
            assert right.x() <= page.width() and right.y() <= page.height(), b.text()
        assert page.settings_scroll.verticalScrollBar().isVisible()  # the column scrolls
        assert (
            page.reason_label.isVisible()
            and page.reason_label.height() >= page.reason_label.heightForWidth(page.reason_label.width())
        )
        pal = page.palette()
        for widget in (page.reason_label, page.plots.placeholder, page.stats_label):
            fg = widget.palette().color(QPalette.WindowText)
            assert abs(fg.lightness() - pal.color(QPalette.Window).lightness()) > 120, (theme, widget)
        hint_colour = page.log.palette().color(QPalette.PlaceholderText)
        assert abs(hint_colour.lightness() - page.log.palette().color(QPalette.Base).lightness()) > 70, theme
        if SHOTS:
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.grab().save(str(SHOTS / f"train-1024x640-{theme}.png"))
    finally:
        app.setPalette(old_palette)
        app.setStyle(old_style)


# --- responsiveness and looks -----------------------------------------------------------------
def test_stall_probe_sees_every_phase_of_a_run(qtbot, engine, tmp_path, synth_model, chats):
    """bench/ui_stall.py's probe (a 5 ms timer on the UI thread, gaps between its timeouts) follows
    a real run through its phases; the figures themselves are the bench's (timings are not tests)."""
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), chats, steps=30)
    page.show()
    qtbot.waitExposed(page)
    probe = StallProbe(5)
    probe.start("loading")
    page.sig_state_changed.connect(probe.mark)
    run(qtbot, page)
    settle(qtbot, page)
    qtbot.wait(50)
    probe.stop()
    assert probe.n_ticks > 10
    phases = probe.phase_max_ms()
    assert {"loading", "training"} <= set(phases), phases  # marked by the page's own state changes
    assert all(gap >= 0 for gap in phases.values())
    assert probe.max_gap_ms == max(phases.values())
    assert probe.percentile(99) <= probe.max_gap_ms
    assert "max" in probe.summary()


@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
def test_screenshots_mid_run_and_finished(
    qtbot, engine, monkeypatch, tmp_path, synth_model, chats, arch, shots
):
    page = make_page(qtbot, engine, tmp_path, synth_model(arch), chats, steps=24, eval_every=4)
    page.show()
    qtbot.waitExposed(page)
    gate = Gate(monkeypatch, step=12)
    with qtbot.waitSignal(page.sig_run_finished, timeout=TIMEOUT_MS):
        page.start()
        qtbot.waitUntil(lambda: page.last_step == 12, timeout=TIMEOUT_MS)
        page.plots.flush()
        page._refresh_progress(force=True)
        qtbot.wait(50)
        assert page.state == "training"
        for i, tab in enumerate(("curves", "layers")):
            page.plots.tabs.setCurrentIndex(i)
            page.plots.flush()
            assert page.grab().save(str(shots / f"{arch}-mid-run-{tab}.png"))
        page.plots.tabs.setCurrentIndex(0)
        gate.release()
    settle(qtbot, page)
    for i, tab in enumerate(("curves", "layers")):
        page.plots.tabs.setCurrentIndex(i)
        page.plots.flush()
        pixmap = page.grab()
        assert pixmap.width() >= 1200 and pixmap.height() >= 800
        assert pixmap.save(str(shots / f"{arch}-finished-{tab}.png"))
    assert len(list(shots.glob(f"{arch}-*.png"))) == 4


def test_a_stop_pressed_while_the_model_loads_is_not_undone_by_the_run_starting(
    qtbot, engine, monkeypatch, tmp_path, synth_model, chats
):
    page = make_page(
        qtbot, engine, tmp_path, synth_model("llama"), chats, steps=50, eval_every=0, val_split=0.0
    )
    loading, go = threading.Event(), threading.Event()
    real_init = Trainer.__init__

    def held_init(trainer, *args, **kwargs):  # the engine is still opening the run when Stop is pressed
        loading.set()
        go.wait(TIMEOUT_MS / 1000)
        real_init(trainer, *args, **kwargs)

    monkeypatch.setattr(Trainer, "__init__", held_init)
    states: list[str] = []
    page.sig_state_changed.connect(states.append)
    with qtbot.waitSignal(page.sig_run_finished, timeout=TIMEOUT_MS) as ended:
        page.start()
        qtbot.waitUntil(loading.is_set, timeout=TIMEOUT_MS)
        assert page.state == "loading"
        page.stop_button.click()
        assert page.state == "stopping"
        go.set()
    assert isinstance(ended.args[0], Finished) and ended.args[0].stopped
    assert states[states.index("stopping") :] == ["stopping", "finished"]  # never back to "training"
    assert page.state == "finished"
    settle(qtbot, page)
