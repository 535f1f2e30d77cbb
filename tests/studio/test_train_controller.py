"""The Train page's decisions without Qt (studio.pages.train.controller and next_run): runs walked
event by event through `TrainController` as the engine sends them, and the decisions made before
Start and before a resume. No QApplication: the page only shows what these answer (the page's own
tests and the journeys walk the same runs on screen)."""

from __future__ import annotations

import os
from types import SimpleNamespace

from engine import (
    Checkpoint,
    Eval,
    Failed,
    Finished,
    Paused,
    Plan,
    PreferenceEval,
    PreferenceStep,
    Started,
    Step,
    TrainConfig,
)
from studio.pages.train import next_run as nr
from studio.pages.train.controller import (
    PHASE_DATA,
    PHASE_FIRST_STEP,
    PHASE_OPENING,
    Phase,
    RunHandle,
    TrainController,
    end_notice,
    eta_words,
    human_duration,
    next_run_progress,
    plain_words,
)
from studio.pages.train.plan import Blocker
from studio.pages.train.run_state import RunState
from studio.project import Project


def plan(total=4, start_step=0, problems=(), ranks=1, **kw) -> Plan:
    return Plan(
        n_train=6, n_val=2, n_windows=3, tokens_per_epoch=1200, label_tokens_per_epoch=800,
        batches_per_epoch=2, total_steps=total, trainable_params=4096, lora_targets=("a", "b"),
        full_tensors=(), memory_bytes={"total": 3 << 30}, problems=tuple(problems), start_step=start_step,
        ranks=ranks, hosts=tuple(f"h{r}" for r in range(ranks)), **kw,
    )  # fmt: skip


def step(n, total=4, tokens=100, eta=30.0) -> Step:
    """Step n of a run taking 2 s a step."""
    return Step(step=n, total_steps=total, epoch=n / total, loss=1.0 / n, mean_ce=1.0 / n, lr=1e-3,
                grad_norm=0.5, tokens=tokens, tokens_per_s=50.0, elapsed_s=2.0 * n, eta_s=eta)  # fmt: skip


def started_run(tmp_path, total=4) -> TrainController:
    """A new run, launched, as the page leaves it before the engine's first event."""
    c = TrainController()
    paths = nr.RunPaths(str(tmp_path / "a.gguf"), str(tmp_path / "a-checkpoints"))
    c.begin(paths, str(tmp_path / "m.gguf"), total, created=[])
    c.states.move(RunState.LOADING)
    c.launched(TrainConfig(n_ctx=256), PHASE_OPENING)
    return c


# --- a run, event by event ------------------------------------------------------------------------
def test_a_run_from_start_to_finish_sets_its_numbers_log_and_stats(tmp_path):
    c = started_run(tmp_path)
    assert c.stats_text() == PHASE_OPENING  # before the first step: what it is doing
    token = object()
    assert not c.on_phase(RunHandle(token)) and c.run is token
    assert c.on_phase(Phase(PHASE_DATA)) and c.stats_text() == PHASE_DATA
    reaction = c.on_started(Started(plan()))
    assert reaction.banner is None and len(reaction.lines) == 1
    assert reaction.lines[0].startswith("Started: 6 training / 2 validation samples, 3 windows of 256 tokens")
    assert "4 steps; 4,096 trainable parameters in 2 LoRA tensors; memory ≈ 3.0 GiB" in reaction.lines[0]
    assert c.phase == PHASE_FIRST_STEP and c.log_every == 1 and c.total_steps == 4
    assert c.states.started() and c.state is RunState.TRAINING
    lines = [c.on_event(step(n)) for n in (1, 2)]
    assert lines[0] == ["step 1/4  loss 1.0000  lr 0.001  ‖g‖ 0.5  50 tok/s"] and len(lines[1]) == 1
    assert not c.on_phase(Phase(PHASE_DATA))  # a late phase never replaces the step's figures
    assert (c.last_step, c.tokens_done, c.elapsed_s) == (2, 200, 4.0)
    assert c.stats_text() == ("Step 2 of 4 · 0:04 elapsed · less than a minute left · 50 tokens/s · "
                              "epoch 0.50 · 200 tokens processed")  # fmt: skip
    assert c.progress().maximum == 4 and c.progress().value == 2 and c.progress().format == "%v / %m steps"
    assert c.on_event(Eval(2, 0.5, 64)) == [
        "eval at step 2: validation loss 0.5000 (perplexity 1.65) over 64 tokens"
    ]
    assert c.on_event(Checkpoint(2, "/ck/ckpt-000002")) == ["checkpoint at step 2: /ck/ckpt-000002"]
    assert c.last_checkpoint == "/ck/ckpt-000002"
    done = Finished(4, False, 0.25, "/o/a.gguf", None, "/ck/ckpt-000004")
    reaction = c.on_result(done)
    assert reaction.state is RunState.FINISHED and reaction.ended and not reaction.tidy
    assert reaction.lines == [
        "Finished at step 4, last loss 0.2500; adapter: /o/a.gguf; checkpoint: /ck/ckpt-000004"
    ]
    c.states.move(reaction.state)
    assert c.last_result is done and c.last_checkpoint == "/ck/ckpt-000004" and c.phase == ""
    assert (
        c.stats_text()
        == "Finished at step 4 of 4 · 0:04 of training · 200 tokens processed · last loss 0.2500"
    )


def test_steps_are_logged_once_in_fifty_and_a_resumed_run_goes_on_from_its_checkpoint(tmp_path):
    c = started_run(tmp_path, total=200)
    reaction = c.on_started(Started(plan(total=200, start_step=100, start_tokens=5000, start_seconds=60.0)))
    assert ", resuming at step 100;" in reaction.lines[0]
    assert (c.last_step, c.tokens_done, c.elapsed_s, c.log_every) == (100, 5000, 60.0, 4)
    logged = [n for n in range(101, 110) if c.on_event(step(n, total=200))]
    assert logged == [104, 108]
    assert c.on_preference(PreferenceStep(108, "dpo", 0.6, -1, -2, 0.1, -0.1, 0.2, 0.75, 4)) == [
        "  pairs: accuracy 75%, margin +0.2000, log p chosen -1.000, rejected -2.000"
    ]
    assert c.on_preference(PreferenceStep(109, "dpo", 0.6, -1, -2, 0.1, -0.1, 0.2, 0.75, 4)) == []
    held_out = PreferenceEval(109, "dpo", 0.5, -1, -2, 0.1, -0.1, 0.3, 1.0, 2)
    assert c.on_preference(held_out) == [
        "held-out pairs at step 109: accuracy 100%, margin +0.3000, DPO loss 0.5000 (2 pairs)"
    ]


def test_a_resumed_run_keeps_saying_resuming_until_its_first_step(tmp_path):
    c = started_run(tmp_path)
    c.launched(TrainConfig(), "Resuming at step 3…")
    assert not c.on_phase(Phase(PHASE_DATA)) and c.stats_text() == "Resuming at step 3…"


def test_dataset_problems_and_processes_are_said(tmp_path):
    c = started_run(tmp_path)
    reaction = c.on_started(Started(plan(problems=[f"line {i}: bad" for i in range(5)], ranks=2)))
    assert "; 5 dataset problems: line 0: bad; line 1: bad; line 2: bad; …" in reaction.lines[0]
    assert (
        reaction.lines[1]
        == "2 processes, each with a share of every step's windows: rank 0 on h0, rank 1 on h1"
    )
    text, level, page = reaction.banner
    assert text.startswith("The dataset has 5 problems") and (level, page) == ("warning", "Dataset")
    assert c.ranks == 2


def test_pause_keeps_the_run_and_a_paused_run_whose_model_closed_ends(tmp_path):
    c = started_run(tmp_path)
    c.on_started(Started(plan()))
    c.states.started()
    c.on_event(step(1))
    reaction = c.on_result(Paused(1))
    assert (
        reaction.state is RunState.PAUSED
        and not reaction.ended
        and reaction.lines == ["Paused at step 1. Press Resume to go on from here."]
    )
    c.states.move(RunState.PAUSING)
    c.states.move(reaction.state)
    assert c.stats_text() == "Paused at step 1 of 4 · 0:02 of training so far."
    assert c.can_resume(c.run_model, None)  # in memory
    assert not c.can_resume(str(tmp_path / "other.gguf"), None)  # not with another model
    reaction = c.on_result(None)
    assert reaction.state is RunState.FINISHED and not reaction.ended
    assert "already closed with its model" in reaction.lines[0]
    assert c.forget() == [
        "The run paused at step 1 ended with its model (its checkpoints, if any, are kept on disk)."
    ]
    assert (c.run, c.paths, c.last_step, c.tokens_done) == (None, None, 0, 0)


def test_a_failure_says_what_to_do_and_tidies_a_run_without_checkpoint(tmp_path):
    c = started_run(tmp_path)
    reaction = c.on_result(Failed(0, "no sample has a token to learn from: b'x'", None))
    assert reaction.state is RunState.FAILED and reaction.ended and reaction.tidy
    assert reaction.lines == ["FAILED before training started: no sample has a token to learn from: b'x'"]
    text, level, page = reaction.banner
    assert text.startswith(
        'Training failed before training started: no sample has a token to learn from: "x". '
    )
    assert "Nothing was trained" in text and (level, page) == ("error", "Dataset")
    c = started_run(tmp_path)
    reaction = c.on_result(Failed(7, "out of memory", "/ck/ckpt-000005"))
    c.states.move(reaction.state)
    assert reaction.banner[0] == ("Training failed at step 7: out of memory. The last good checkpoint is "
                                  "/ck/ckpt-000005: fix the cause, then Resume.")  # fmt: skip
    assert c.last_checkpoint == "/ck/ckpt-000005" and c.stats_text() == "Failed at step 7 · 0:00 of training."


def test_a_job_that_raised_becomes_a_failed_run_with_its_traceback(tmp_path):
    c = started_run(tmp_path)
    c.on_event(step(1))
    c.on_event(Checkpoint(1, "/ck/ckpt-000001"))
    failed, reaction = c.on_job_failed("bad bytes b'\\xff'", "Traceback:\n  File x\nValueError\n")
    assert failed == Failed(2, 'bad bytes "\\xff"', "/ck/ckpt-000001") and c.last_result is failed
    assert reaction.lines == ['ERROR: bad bytes "\\xff"'] and reaction.unstamped == [
        "    Traceback:", "      File x", "    ValueError"
    ]  # fmt: skip
    assert reaction.state is RunState.FAILED and reaction.tidy and reaction.ended


# --- resume -------------------------------------------------------------------------------------
def test_resume_offers_the_runs_own_checkpoint_until_it_finished_its_plan(tmp_path):
    c = started_run(tmp_path)
    history = ("/old/ckpt-000009", "old run")
    assert not c.can_resume(c.run_model, None) and c.resume_checkpoint(None) is None  # nothing on disk
    assert c.can_resume(c.run_model, history) and c.resume_checkpoint(history) == (history[0], False)
    own = os.path.join(c.paths.checkpoint_dir, "ckpt-000002")
    os.makedirs(own)
    c.on_result(Finished(2, True, 0.5, None, None, own))  # stopped: steps left
    assert c.can_resume(c.run_model, None) and c.resume_checkpoint(history) == (own, True)
    c.on_result(Finished(4, False, 0.5, None, None, own))  # its plan is done: only the history's
    assert not c.can_resume(c.run_model, None) and c.resume_checkpoint(history) == (history[0], False)
    assert c.is_same_run(c.paths.checkpoint_dir) and not c.is_same_run(str(tmp_path))


def checkpoint_info(tmp_path, config: TrainConfig, data="/d/run.jsonl", knows_data=True):
    """What resume_question reads of a CheckpointInfo."""
    return SimpleNamespace(
        config=config, step=3, total_steps=10, run_dir=str(tmp_path / "r-checkpoints"), dataset=data or "",
        data=lambda: data, describe_data=lambda: data or "the run's samples", knows_data=knows_data,
        same_data=lambda path: path == data,
    )  # fmt: skip


def test_resume_asks_only_when_data_or_hand_made_settings_differ(tmp_path):
    p = Project()
    p.update(dataset_path="/d/run.jsonl")
    same = checkpoint_info(tmp_path, p.config)
    q = nr.resume_question(same, p, None, custom=True)
    assert q.text == "" and q.differences == [] and q.run_data == "/d/run.jsonl"
    other = checkpoint_info(tmp_path, TrainConfig(lr=p.config.lr * 2))
    assert nr.resume_question(other, p, None, custom=False).text == ""  # a preset: the run's settings go on
    q = nr.resume_question(other, p, None, custom=True)
    assert q.text.startswith("The page's settings differ from the run's (step 3 of 10):\n• learning rate ")
    q = nr.resume_question(same, p, ["s1", "s2"], custom=False)  # the editor's samples
    assert q.differences == ["dataset /d/run.jsonl -> the 2 samples in the editor"] and q.text
    assert q.page_data == ["s1", "s2"]
    gone = checkpoint_info(tmp_path, p.config, data=None)
    q = nr.resume_question(gone, p, None, custom=False)
    assert q.run_data is None and q.text.startswith("The data this run trained on is gone")
    p.update(dataset_path=None)
    assert nr.resume_question(gone, p, None, custom=False).impossible.startswith("The data this run")


def test_resume_paths_follow_the_checkpoint_folder(tmp_path):
    info = checkpoint_info(tmp_path, TrainConfig())
    assert nr.resume_paths(info, TrainConfig(), "/x/new.gguf") == nr.RunPaths(
        str(tmp_path / "r.gguf"), str(tmp_path / "r-checkpoints")
    )
    info.run_dir = str(tmp_path / "elsewhere")
    assert nr.resume_paths(info, TrainConfig(), "/x/new.gguf").out == "/x/new.gguf"
    assert nr.resume_paths(info, TrainConfig(out="/y/own.gguf"), "/x/new.gguf").out == "/y/own.gguf"


# --- before Start ---------------------------------------------------------------------------------
def test_what_is_missing_before_start_is_said_with_the_page_that_fixes_it(tmp_path):
    p = Project()
    assert nr.input_blocker(p, edited=False) == Blocker(
        "No model is chosen. Open a .gguf model on the Model page.", "Model"
    )
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    p.update(model_path=str(model))
    assert nr.input_blocker(p, edited=False).page == "Dataset"
    assert nr.input_blocker(p, edited=True) is None  # the editor's samples
    p.update(dataset_path=str(tmp_path / "gone.jsonl"))
    assert "does not exist" in nr.input_blocker(p, edited=False).reason
    assert nr.processes_blocker(TrainConfig(objective="dpo"), 2).reason.startswith(
        "DPO trains in one process"
    )
    assert nr.processes_blocker(TrainConfig(objective="dpo"), 1) is None
    assert nr.processes_blocker(TrainConfig(), 4) is None


def test_the_next_runs_paths_progress_and_start_hint(tmp_path):
    p = Project()
    p.update(output_dir=str(tmp_path), dataset_path=str(tmp_path / "chats.jsonl"))
    paths = nr.default_paths(p, stamp="T")
    assert paths == nr.RunPaths(str(tmp_path / "chats-T.gguf"), str(tmp_path / "chats-T-checkpoints"))
    assert next_run_progress(None, True, p.config).format == "steps: waiting for a model and a dataset"
    assert next_run_progress(None, False, p.config).format == "steps: counting…"
    hint = nr.start_hint(False, Blocker("No model <b>", "Model"), None)
    assert not hint.enabled and hint.tooltip == "Start is unavailable: No model <b>"
    assert hint.reason == ('<b>Start is unavailable:</b> No model &lt;b&gt; <a href="page:Model">Go to the '
                           "Model page</a>")  # fmt: skip
    hint = nr.start_hint(False, None, "too few steps")
    assert hint.enabled and hint.reason.endswith("too few steps") and hint.tooltip.endswith("too few steps")
    assert nr.start_hint(True, None, None) == nr.StartHint(False, "", nr.START_TIP)
    look = nr.first_look(p, None, ["a", "b", "c"], "")
    assert "○&nbsp;</td><td>A model" in look and "A dataset: 3 samples in the editor" in look


def test_words_for_people():
    assert human_duration(68) == "1:08" and human_duration(3723) == "1:02:03"
    assert human_duration(float("nan")) == "–"
    assert eta_words(30) == "less than a minute left" and eta_words(7800) == "about 2 h 10 min left"
    assert plain_words("bad b'hell' and b\"o\"") == 'bad "hell" and "o"'
    finished = Finished(4, True, 0.1, "/o/a.gguf", None, None)
    assert end_notice(finished, 75) == "Training stopped at step 4 after 1:15; adapter written: /o/a.gguf"
    assert end_notice(Failed(2, "boom", None), 61) == "Training failed after 1:01: boom"
