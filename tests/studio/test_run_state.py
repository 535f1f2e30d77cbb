"""The Train page's run states and moves, without Qt (studio.pages.train.run_state)."""

from __future__ import annotations

import pytest

from studio.pages.train.run_state import ACTIVE, MOVES, RunState, RunStates, controls

S = RunState


def walk(*states: RunState) -> RunStates:
    runs = RunStates()
    for s in states:
        runs.move(s)
    return runs


def test_a_run_goes_idle_loading_training_finished_and_can_start_again():
    runs = walk(S.LOADING, S.TRAINING, S.FINISHED)
    assert runs.state is S.FINISHED and not runs.state.active
    assert runs.move(S.LOADING) and runs.state.active


def test_pause_resume_stop_and_forget_a_paused_run():
    runs = walk(S.LOADING, S.TRAINING, S.PAUSING, S.PAUSED)
    assert not runs.state.active  # waits in memory
    assert runs.move(S.TRAINING)  # Resume
    runs = walk(S.LOADING, S.TRAINING, S.PAUSING, S.PAUSED, S.STOPPING, S.FINISHED)
    assert runs.state is S.FINISHED
    assert walk(S.LOADING, S.TRAINING, S.PAUSING, S.PAUSED, S.IDLE).state is S.IDLE  # another model


@pytest.mark.parametrize(
    "path, refused",
    [
        ((), S.TRAINING),  # a run starts by loading
        ((), S.PAUSED),
        ((S.LOADING,), S.IDLE),  # an active run is ended, never dropped
        ((S.LOADING, S.TRAINING), S.LOADING),
        ((S.LOADING, S.TRAINING, S.PAUSING), S.TRAINING),  # a pause is not taken back mid-step
        ((S.LOADING, S.STOPPING), S.TRAINING),  # nor a stop
        ((S.LOADING, S.FAILED), S.TRAINING),
        ((S.LOADING, S.FINISHED), S.PAUSED),
    ],
)
def test_moves_the_page_must_never_make_are_refused_by_name(path, refused):
    runs = walk(*path)
    before = runs.state
    with pytest.raises(ValueError, match=f"from {before.value} to {refused.value}"):
        runs.move(refused)
    assert runs.state is before


def test_staying_put_is_no_change_and_every_state_is_reachable_from_idle():
    runs = walk(S.LOADING)
    assert runs.move("loading") is False
    seen, todo = {S.IDLE}, [S.IDLE]
    while todo:
        for nxt in MOVES[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(RunState)
    assert ACTIVE == {s for s in RunState if s.active}


def test_a_started_event_after_stop_leaves_the_run_stopping():
    runs = walk(S.LOADING, S.STOPPING)
    assert runs.started() is False and runs.state is S.STOPPING
    runs = walk(S.LOADING)
    assert runs.started() is True and runs.state is S.TRAINING
    runs = walk(S.LOADING, S.TRAINING, S.PAUSING, S.PAUSED, S.TRAINING)  # a resumed segment starts again
    assert runs.started() is False and runs.state is S.TRAINING


def test_pause_needs_a_training_run_in_this_process_and_stop_ends_a_paused_one():
    assert walk(S.LOADING, S.TRAINING).can_pause(in_process=True)
    assert not walk(S.LOADING, S.TRAINING).can_pause(in_process=False)  # processes beside the app
    assert not walk(S.LOADING).can_pause(in_process=True)
    assert walk(S.LOADING, S.TRAINING, S.PAUSING, S.PAUSED).can_stop()
    assert not walk(S.LOADING, S.TRAINING, S.PAUSING).can_stop()
    assert not RunStates().can_stop()


def test_controls_of_each_state():
    c = controls(S.TRAINING, can_resume=True, in_process=True)
    assert (c.pause, c.resume, c.stop, c.locked) == (True, False, True, True)
    assert not controls(S.TRAINING, can_resume=True, in_process=False).pause
    c = controls(S.PAUSED, can_resume=True, in_process=True)
    assert (c.pause, c.resume, c.stop, c.locked) == (False, True, True, False)
    c = controls(S.FINISHED, can_resume=False, in_process=True)
    assert (c.pause, c.resume, c.stop, c.locked) == (False, False, False, False)
    for s in (S.PAUSING, S.STOPPING):
        c = controls(s, can_resume=True, in_process=True)
        assert (c.pause, c.resume, c.stop, c.locked) == (False, False, False, True)


def test_a_state_reads_and_formats_as_its_name():
    assert S.TRAINING == "training" and f"<b>{S.PAUSED}</b>" == "<b>paused</b>" and str(S.IDLE) == "idle"
    assert "training" in ACTIVE
