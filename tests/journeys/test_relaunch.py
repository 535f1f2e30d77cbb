"""Journeys across a relaunch of the app.

(b) Train, close the window mid-run (training stops first, with its checkpoint, before any other
question, and the window is gone within 2 s of it), open a new window, resume the stopped run from
the Runs page: it finishes at its planned step with its own settings, the steps, the training time
and the tokens go on from the checkpoint's, and the adapter equals an uninterrupted run's.

(e) A finished run is found again after a relaunch: on the Runs page, and as the adapter Chat,
Export and Rewards start from.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine import Finished, LoraAdapter, Model, Step, Trainer
from engine.train import trainer as trainer_module

from .conftest import TIMEOUT_MS, checked, open_model, open_model_and_dataset, train_with


@pytest.fixture
def slow_steps(monkeypatch):
    """Each optimizer step takes 20 ms longer: a person can close the window between two of them."""
    step = trainer_module.Trainer.train_step

    def slow(self, on_event=lambda e: None):
        time.sleep(0.02)
        return step(self, on_event)

    monkeypatch.setattr(trainer_module.Trainer, "train_step", slow)


def test_close_mid_run_relaunch_and_resume_from_runs_finishes_the_same_run(
    qtbot, app, tiny_q4, facts, slow_steps
):
    window = app.launch()
    open_model_and_dataset(qtbot, window, tiny_q4, facts)
    window.project.update_config(steps=24, warmup_steps=2)  # a short run: what matters is its middle
    checked(qtbot, window)
    page = window.train_page
    planned = page.check.plan.total_steps
    assert planned == 24
    config = window.project.config
    asked = {}

    def ask_unsaved(text: str) -> str:  # what the person sees when asked about unsaved changes
        asked["training"] = page.is_running()
        asked["checkpoint"] = page.last_checkpoint
        return "discard"

    window.ask_unsaved = ask_unsaved
    window.project.dirty = True  # there is something unsaved to ask about
    window.show_page_named("Train")
    ended = []
    page.sig_run_finished.connect(lambda result: ended.append((time.monotonic(), result)))
    assert page.start()
    qtbot.waitUntil(lambda: page.last_step >= 5, timeout=TIMEOUT_MS)
    assert window.close()  # "Stop training and quit?": yes; then the unsaved changes: discard
    closed_at = time.monotonic()
    assert asked["training"] is False  # training had stopped before the question about unsaved changes
    [(stopped_at, stopped)] = ended
    assert isinstance(stopped, Finished) and stopped.stopped and 5 <= stopped.step < planned
    assert asked["checkpoint"] == stopped.checkpoint_path  # ...and its checkpoint was written
    assert closed_at - stopped_at < 2.0, closed_at - stopped_at
    assert not window.isVisible() and window.engine._thread.isFinished()
    from engine import read_checkpoint_info  # (imported here: the code before this issue has none)

    info = read_checkpoint_info(stopped.checkpoint_path)
    assert (info.step, info.total_steps) == (stopped.step, planned)
    elapsed, tokens = info.seconds, info.tokens
    assert tokens > 0 and elapsed > 0

    # a new window: nothing open; the Runs page lists the stopped run of the model and offers Resume
    again = app.launch()
    again.train_page.ask_resume = lambda text, run_data: pytest.fail(f"asked: {text}")
    runs = again.runs_page
    again.show_page_named("Runs")
    runs.refresh()
    [run] = [r for r in runs.runs() if r.status == "stopped"]
    assert run.steps_done == stopped.step and run.steps_planned == planned and run.model == tiny_q4
    runs.select_runs([run.name])
    assert runs.resume_button.isEnabled()
    resumed = []
    again.train_page.sig_run_finished.connect(resumed.append)
    events = []
    again.train_page.plots.add_event = lambda e, add=again.train_page.plots.add_event: (
        events.append(e),
        add(e),
    )
    runs.resume_button.click()  # opens the run's model, then continues the run on the Train page
    qtbot.waitUntil(lambda: bool(resumed), timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: not again.engine.jobs, timeout=TIMEOUT_MS)
    [result] = resumed
    assert isinstance(result, Finished) and not result.stopped and result.step == planned
    assert again.current_page() is again.train_page
    shown = again.project.config  # the run's settings are what the page shows
    for name in ("n_ctx", "batch_size", "lr", "steps", "seed", "targets", "rank"):
        assert getattr(shown, name) == getattr(config, name), name
    steps = [e for e in events if isinstance(e, Step)]
    assert [s.step for s in steps] == list(range(stopped.step + 1, planned + 1))  # the count goes on
    assert steps[0].elapsed_s > elapsed
    again.train_page.plots.flush()
    x, _ = again.train_page.plots.curve_data()["loss"]
    assert list(x) == list(range(1, planned + 1))  # the whole curve: the first window's steps too
    reference = Trainer(tiny_q4, facts, config.__class__(**{**config.__dict__, "out": None}))
    reference_events = []
    reference.run(reference_events.append)
    all_tokens = sum(e.tokens for e in reference_events if isinstance(e, Step))
    assert again.train_page.tokens_done == all_tokens
    assert f"{all_tokens:,} tokens processed" in again.train_page.stats_label.text()
    # the adapter is the uninterrupted run's
    model = Model.load(tiny_q4)
    got = LoraAdapter.load(result.adapter_path, model)
    want = reference.trainable.to_adapter(model.config.arch)
    assert set(got.pairs) == set(want.pairs)
    for name, (a, b) in want.pairs.items():
        np.testing.assert_array_equal(got.pairs[name][0], a)
        np.testing.assert_array_equal(got.pairs[name][1], b)
    runs.refresh()
    assert [r.status for r in runs.runs() if r.name == run.name] == ["finished"]


def test_a_finished_run_is_offered_everywhere_after_a_relaunch(qtbot, app, tiny_q4, facts):
    window = app.launch()
    open_model_and_dataset(qtbot, window, tiny_q4, facts)
    result = train_with(qtbot, window, steps=8)
    assert result.adapter_path
    assert window.close()

    again = app.launch()  # the same model, opened again (its dataset is not opened this time)
    open_model(qtbot, again, tiny_q4)
    again.runs_page.refresh()
    [run] = again.runs_page.runs()
    assert run.status == "finished" and run.adapter == result.adapter_path and run.steps_done == 8
    assert again.chat_page.adapter_choice.current_path() == result.adapter_path
    assert again.export_page.adapter_path() == result.adapter_path
    rewards = [data for _, data, ok in again.rewards_page.adapter_choice.entries() if ok]
    assert result.adapter_path in rewards
    again.runs_page.select_runs([run.name])
    assert again.runs_page.chat_button.isEnabled() and again.runs_page.export_button.isEnabled()
