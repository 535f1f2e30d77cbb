"""BLAS threads before each training step: the usable cores minus the runnable threads of other
processes, from /proc (here fake /proc files), the median of the last three samples."""

from __future__ import annotations

import os

import pytest

from engine.train import threads
from engine.train.threads import BlasThreads, own_running, procs_running


def fake_proc(tmp_path, running: int, own_states: str):
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  1 2 3 4\nctxt 99\nprocs_running {running}\nprocs_blocked 0\n", encoding="ascii")
    tasks = tmp_path / "task"
    if tasks.exists():
        for d in tasks.iterdir():
            (d / "stat").unlink()
            d.rmdir()
    tasks.mkdir(exist_ok=True)
    for i, state in enumerate(own_states):
        (tasks / str(100 + i)).mkdir()
        # a thread name with a space and a parenthesis, as /proc allows
        line = f"{100 + i} (py (worker) x) {state} 1 2 3\n"
        (tasks / str(100 + i) / "stat").write_text(line, encoding="ascii")
    return str(stat), str(tasks)


@pytest.fixture
def no_user_setting(monkeypatch):
    for key in threads.USER_SETTINGS:
        monkeypatch.delenv(key, raising=False)


def test_counts_come_from_proc(tmp_path):
    stat, tasks = fake_proc(tmp_path, 5, "RRSR")
    assert procs_running(stat) == 5 and own_running(tasks) == 3
    assert procs_running(str(tmp_path / "missing")) is None and own_running(str(tmp_path / "none")) == 0


def test_a_busy_core_takes_a_thread_away_and_gives_it_back(tmp_path, no_user_setting, monkeypatch):
    set_to = []
    monkeypatch.setattr("threadpoolctl.threadpool_limits", lambda limits, user_api: set_to.append(limits))
    stat, tasks = fake_proc(tmp_path, 1, "RS")  # only our worker runs
    b = BlasThreads(cores=2, stat=stat, task_dir=tasks)
    assert b.adjust() == 2 and set_to == [2]
    fake_proc(tmp_path, 3, "RSS")  # our worker and two threads of other programs
    assert b.adjust() == 2  # one sample of three: the median still says free
    assert b.adjust() == 1 and set_to == [2, 1]
    fake_proc(tmp_path, 3, "RRR")  # three runnable threads, all ours: nobody else is busy
    b.adjust()
    assert b.adjust() == 2 and set_to == [2, 1, 2]


def test_a_thread_count_the_user_chose_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setattr("threadpoolctl.threadpool_limits", lambda **kw: pytest.fail("changed"))
    stat, tasks = fake_proc(tmp_path, 4, "R")
    assert BlasThreads(cores=2, stat=stat, task_dir=tasks).adjust() is None


def test_without_proc_or_with_one_core_nothing_changes(tmp_path, no_user_setting, monkeypatch):
    monkeypatch.setattr("threadpoolctl.threadpool_limits", lambda **kw: pytest.fail("changed"))
    assert BlasThreads(cores=2, stat=str(tmp_path / "missing")).adjust() is None
    stat, tasks = fake_proc(tmp_path, 4, "R")
    assert BlasThreads(cores=1, stat=stat, task_dir=tasks).adjust() is None


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc")
def test_the_real_proc_gives_a_count(no_user_setting):
    b = BlasThreads(cores=2)
    busy = b.others_busy()
    assert busy is not None and busy >= 0
    assert b.choose() in (1, 2)


def test_every_engine_job_and_every_training_step_adjusts_the_process_controller(
    monkeypatch, tmp_path, synth_model
):
    """One controller for the process (BLAS threads are process-wide): the session's jobs ask it at
    their start, a training run before each of its steps."""
    import json

    from engine import TargetSpec, TrainConfig
    from engine.session import EngineSession

    calls = []
    monkeypatch.setattr(threads.BlasThreads, "adjust", lambda self: calls.append(self))
    monkeypatch.setattr(threads, "_PROCESS", None)
    session = EngineSession(synth_model("llama"))
    session.logits([1, 2, 3])
    assert len(calls) == 1
    session.generate("hi", n=1)
    assert len(calls) == 2
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "a b", "response": "c d"}) + "\n", encoding="utf-8")
    cfg = TrainConfig(targets=TargetSpec(preset="attention"), rank=2, steps=3, n_ctx=32,
                      checkpoint_every=0, out=str(tmp_path / "a.gguf"))  # fmt: skip
    session.new_run(str(data), cfg)
    session.train(lambda e: None, lambda: False)
    assert len(calls) == 2 + 1 + 3  # the training job at its start, then before each of its 3 steps
    assert all(c is calls[0] for c in calls)  # the same controller throughout


def test_our_thread_going_to_sleep_between_the_counts_is_not_another_program(monkeypatch):
    """The system's count includes a thread of ours that runs at that moment; counted just after, it
    may already sleep. Ours are counted before and after, and the larger count is taken off."""
    reads = iter([1, 0] * 3)  # own_running before, then after, at each of the three reads
    monkeypatch.setattr(threads, "own_running", lambda task_dir: next(reads))
    monkeypatch.setattr(threads, "procs_running", lambda stat: 1)  # that thread of ours, running
    assert BlasThreads(cores=2).others_busy() == 0


@pytest.mark.parametrize("totals, busy", [([1, 0, 0], 0), ([0, 0, 1], 0), ([1, 1, 1], 1), ([2, 1, 2], 1)])
def test_a_sample_is_the_fewest_of_three_reads(monkeypatch, totals, busy):
    """A kernel thread runnable at one read is a moment's work; a busy program is there every time."""
    monkeypatch.setattr(threads, "own_running", lambda task_dir: 0)
    reads = iter(totals)
    monkeypatch.setattr(threads, "procs_running", lambda stat: next(reads))
    assert BlasThreads(cores=2).others_busy() == busy
