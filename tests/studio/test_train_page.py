"""The Train page with real (tiny) training runs as jobs of the app's engine worker: settings bound to
the project, Start → plots and heatmaps filled, Pause → Resume in memory, Stop, failures in a banner,
the UI's longest stall during a run, and screenshots of the page."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtWidgets import QCheckBox, QComboBox

import engine.train.trainer as trainer_module
from engine import Failed, Finished, TargetSpec, Trainer
from studio.pages.train.page import TrainPage
from studio.pages.train.settings import FIELDS
from studio.paths import latest_checkpoint
from studio.project import ModelInfo, Project
from studio.train_probe import StallProbe

TIMEOUT_MS = 20_000
SHOTS = Path(os.environ.get("TUNE_STUDIO_SHOTS", "")) if os.environ.get("TUNE_STUDIO_SHOTS") else None


@pytest.fixture
def chats(tmp_path):
    path = tmp_path / "chats.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(12):
            turns = [
                {"role": "user", "content": f"What is {i} plus {i}? Answer in one sentence."},
                {"role": "assistant", "content": f"{i} plus {i} is {2 * i}, because doubling {i} gives it."},
            ]
            f.write(json.dumps({"messages": turns}) + "\n")
    return str(path)


def make_page(qtbot, engine, tmp_path, model: str, chats: str, **config) -> TrainPage:
    project = Project()
    project.update(model_path=model, dataset_path=chats, output_dir=str(tmp_path / "out"))
    settings = dict(steps=6, n_ctx=128, val_split=0.25, eval_every=2, targets=TargetSpec(preset="all"))
    project.update_config(**{**settings, **config})
    page = TrainPage(project, engine)
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
    assert list(page.settings.groups) == ["Basics", "Optimizer", "Data", "Rewards", "Advanced"]
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
    assert "tokens processed" in page.stats_label.text() and "tokens/s" in page.stats_label.text()
    log = page.log.toPlainText()
    assert "Started: 9 training / 3 validation samples" in log and "eval at step 2" in log
    assert "checkpoint at step 6" in log and "Finished at step 6" in log
    # default output: <output folder>/<dataset stem>-<time>.gguf, checkpoints in a sibling folder
    out = Path(result.adapter_path)
    assert out.parent == tmp_path / "out" and out.name.startswith("chats-") and out.exists()
    assert Path(result.checkpoint_path).parent == out.with_name(out.stem + "-checkpoints")
    assert str(out) in page.paths_label.text()
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
    session = engine.session
    out = page.paths.out
    result = run(qtbot, page, page.resume)
    settle(qtbot, page)
    assert engine.session is session  # the same model: nothing reloaded
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
    result = run(qtbot, other, lambda: other.resume_from(str(ckpt_dir)))  # the folder: newest inside
    settle(qtbot, other)
    assert isinstance(result, Finished) and result.step == 8
    assert list(other.plots.curve_data()["loss"][0]) == [7, 8]
    assert other.paths.checkpoint_dir == str(ckpt_dir)
    assert other.paths.out == str(ckpt_dir)[: -len("-checkpoints")] + ".gguf"
    assert not other.resume_from(str(tmp_path))  # not a checkpoint: a banner, no run
    assert "is not a checkpoint" in other.banner_text()


# --- errors -----------------------------------------------------------------------------------
def test_failed_run_shows_a_banner_with_what_to_do(qtbot, engine, tmp_path, synth_model):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nothing": "useful"}\nnot json\n', encoding="utf-8")
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), str(bad))
    assert page.banner.isHidden()
    result = run(qtbot, page)
    settle(qtbot, page)
    assert isinstance(result, Failed)
    assert page.state == "failed" and not page.banner.isHidden()
    text = page.banner_text()
    assert "Training failed before training started" in text and "no usable sample" in text
    assert "Dataset page" in text
    assert "FAILED" in page.log.toPlainText()
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


# --- responsiveness and looks -----------------------------------------------------------------
def test_ui_stall_during_a_tiny_run_is_reported(qtbot, engine, tmp_path, synth_model, chats):
    """A 5 ms timer on the UI thread while a 30-step run trains and the plots draw: its longest gap
    is the longest time the UI could not respond (typically 30-50 ms here; bench/ui_stall.py has the
    figures). On a shared, loaded CI machine another process can steal the CPU at the wrong moment,
    so a run over the limit is measured once more before the test fails."""
    import gc

    model = synth_model("llama")
    summaries = []
    for attempt in range(2):
        page = make_page(qtbot, engine, tmp_path / f"try{attempt}", model, chats, steps=30, eval_every=5)
        page.show()
        qtbot.waitExposed(page)
        gc.collect()  # not the test suite's garbage: a full collection holds the GIL for its length
        probe = StallProbe(5)
        probe.start("loading")
        page.sig_state_changed.connect(lambda s, probe=probe: probe.mark(s))
        run(qtbot, page)
        settle(qtbot, page)
        qtbot.wait(100)
        probe.stop()
        summaries.append(probe.summary())
        print(f"\nUI stall during a 30-step tiny-llama run with the page shown: {probe.summary()}")
        assert probe.n_ticks > 10
        if probe.max_gap_ms < 200:
            break
    assert probe.max_gap_ms < 200, summaries


@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
def test_screenshots_mid_run_and_finished(qtbot, engine, monkeypatch, tmp_path, synth_model, chats, arch):
    shots = SHOTS or tmp_path / "shots"
    shots.mkdir(parents=True, exist_ok=True)
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
