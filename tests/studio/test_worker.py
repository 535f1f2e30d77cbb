"""The training worker's lifecycle in a real QThread, with the trainer in a child process (the
default) and in the thread itself: events in order, graceful stop, failures that always reach the
UI (as sig_finished(Failed), plus sig_failed for unexpected exceptions and a killed child), and a
thread that ends and is deleted (never destroyed while running).

Faults in the child come from tests/child_trainers.py (a child does not see monkeypatching)."""

from __future__ import annotations

import os
import threading

import pytest
import shiboken6
from PySide6.QtCore import QObject, Signal, Slot

import engine
import studio.worker as worker_module
from engine import Checkpoint, Failed, Finished, Started, Step, TrainConfig
from studio import tasks
from studio.project import Project
from studio.worker import OUT_OF_MEMORY, TrainWorker, start_training
from tests import child_trainers

TIMEOUT_MS = 30_000
MODES = [pytest.param(True, id="child-process"), pytest.param(False, id="thread")]


def child_trainer(monkeypatch, name: str, **kwargs) -> None:
    monkeypatch.setattr(worker_module, "CHILD_TRAINER", (f"tests.child_trainers:{name}", kwargs))


@pytest.fixture
def llama(synth_model):
    return synth_model("llama")


def config(tmp_path, **kw) -> TrainConfig:
    base = dict(steps=3, n_ctx=64, checkpoint_dir=str(tmp_path / "ckpt"), out=str(tmp_path / "a.gguf"))
    return TrainConfig(**{**base, **kw})


def record(worker: TrainWorker) -> dict[str, list]:
    """Everything the worker emits, in emission order (direct connections: recorded in its thread)."""
    seen: dict[str, list] = {"events": [], "finished": [], "failed": []}
    worker.sig_event.connect(seen["events"].append)
    worker.sig_finished.connect(seen["finished"].append)
    worker.sig_failed.connect(seen["failed"].append)
    return seen


class ThreadRelay(QObject):
    """Re-emits thread.finished from a QObject slot. pytest-qt's own slots are plain callables, which
    PySide queues with the QThread as their context, so the thread's deleteLater (connected first)
    drops them; a QObject receiver gets the call."""

    sig_thread_finished = Signal()

    @Slot()
    def on_thread_finished(self) -> None:
        self.sig_thread_finished.emit()


def run_to_end(qtbot, thread, worker) -> None:
    """Start the thread; wait for sig_finished, then the thread's end, in that order.
    (thread.started cannot be in a strict list: the worker's run, connected first, emits its signals
    from inside thread.started's emission, before pytest-qt's slot hears `started`.)"""
    relay = ThreadRelay()
    thread.finished.connect(relay.on_thread_finished)
    with qtbot.waitSignals(
        [(worker.sig_finished, "sig_finished"), (relay.sig_thread_finished, "thread finished")],
        order="strict",
        timeout=TIMEOUT_MS,
    ):
        thread.start()


def assert_thread_gone(qtbot, thread) -> None:
    """The QThread stopped running and Qt deleted it (thread.finished -> deleteLater)."""
    qtbot.waitUntil(lambda: not shiboken6.isValid(thread) or thread.isFinished(), timeout=TIMEOUT_MS)
    if shiboken6.isValid(thread):
        assert not thread.isRunning()
    qtbot.waitUntil(lambda: not shiboken6.isValid(thread), timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: not tasks.running_threads(), timeout=TIMEOUT_MS)


@pytest.mark.parametrize("isolate", MODES)
def test_three_steps_started_first_then_finished(qtbot, qtlog, tmp_path, llama, chats, isolate):
    thread, worker = start_training(
        model=llama, data=chats, config=config(tmp_path), isolate=isolate, start=False
    )
    assert worker.isolate is isolate
    seen = record(worker)
    run_to_end(qtbot, thread, worker)
    kinds = [type(e) for e in seen["events"]]
    assert kinds[0] is Started
    assert [e.step for e in seen["events"] if isinstance(e, Step)] == [1, 2, 3]
    assert isinstance(seen["events"][-1], Finished)  # the engine's own Finished, as emitted
    assert Checkpoint in kinds
    [result] = seen["finished"]
    assert isinstance(result, Finished) and result.step == 3 and not result.stopped
    assert result.adapter_path == str(tmp_path / "a.gguf") and (tmp_path / "a.gguf").exists()
    assert seen["failed"] == []
    assert worker.result is result
    assert_thread_gone(qtbot, thread)
    assert not [r for r in qtlog.records if "QThread" in r.message]
    if isolate:  # the run happened in another process, which has ended
        assert worker.process.pid != os.getpid() and worker.process.exitcode == 0


def test_a_model_object_trains_in_the_thread(qtbot, tmp_path, llama, chats):
    model = engine.Model.load(llama)
    thread, worker = start_training(model=model, data=chats, config=config(tmp_path, steps=1), start=False)
    assert not worker.isolate  # a loaded model does not cross to a child process
    seen = record(worker)
    run_to_end(qtbot, thread, worker)
    assert isinstance(seen["finished"][0], Finished) and worker.process is None


def test_request_stop_mid_run_ends_gracefully(qtbot, tmp_path, llama, chats):
    thread, worker = start_training(
        model=llama, data=chats, config=config(tmp_path, steps=500), isolate=False, start=False
    )
    seen = record(worker)
    at_step_2 = threading.Event()
    go_on = threading.Event()

    def hold(event):  # runs in the worker thread: hold it after step 2 until the UI asked to stop
        if isinstance(event, Step) and event.step == 2:
            at_step_2.set()
            go_on.wait(10)

    worker.sig_event.connect(hold)
    with qtbot.waitSignal(worker.sig_finished, timeout=TIMEOUT_MS):
        thread.start()
        qtbot.waitUntil(at_step_2.is_set, timeout=TIMEOUT_MS)
        worker.request_stop()  # from the UI thread
        assert worker.stop_requested()
        go_on.set()
    [result] = seen["finished"]
    assert isinstance(result, Finished) and result.stopped and result.step == 2
    assert result.checkpoint_path.endswith("ckpt-000002")  # stopping writes a checkpoint
    assert_thread_gone(qtbot, thread)


def test_request_stop_reaches_the_child_process(qtbot, monkeypatch, tmp_path, llama, chats):
    gate = str(tmp_path)
    child_trainer(monkeypatch, "gated", gate=gate, step=2)
    thread, worker = start_training(model=llama, data=chats, config=config(tmp_path, steps=500), start=False)
    seen = record(worker)
    with qtbot.waitSignal(worker.sig_finished, timeout=TIMEOUT_MS):
        thread.start()
        qtbot.waitUntil(lambda: child_trainers.reached(gate), timeout=TIMEOUT_MS)
        worker.request_stop()  # from the UI thread, while the child is held after step 2
        child_trainers.release(gate, stopping=True)
    [result] = seen["finished"]
    assert isinstance(result, Finished) and result.stopped and result.step == 2
    assert result.checkpoint_path.endswith("ckpt-000002")  # stopping writes a checkpoint
    assert_thread_gone(qtbot, thread)


@pytest.mark.parametrize("isolate", MODES)
def test_bad_dataset_finishes_with_a_readable_failure(qtbot, tmp_path, llama, isolate):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('not json at all\n{"neither": "a sample"}\n', encoding="utf-8")
    thread, worker = start_training(
        model=llama, data=str(bad), config=config(tmp_path), isolate=isolate, start=False
    )
    seen = record(worker)
    run_to_end(qtbot, thread, worker)
    [result] = seen["finished"]
    assert isinstance(result, Failed) and result.step == 0
    assert "no usable sample" in result.message and "2 problems" in result.message
    assert seen["failed"] == []  # an expected failure: the engine reported it as an event
    assert_thread_gone(qtbot, thread)


@pytest.mark.parametrize("isolate", MODES)
def test_model_that_cannot_load_fails_without_sig_failed(qtbot, tmp_path, chats, isolate):
    missing = str(tmp_path / "missing.gguf")
    thread, worker = start_training(
        model=missing, data=chats, config=config(tmp_path), isolate=isolate, start=False
    )
    seen = record(worker)
    run_to_end(qtbot, thread, worker)
    [result] = seen["finished"]
    assert (
        isinstance(result, Failed) and "missing.gguf" in result.message and "no such file" in result.message
    )
    assert seen["events"] == [result]
    assert seen["failed"] == []
    assert_thread_gone(qtbot, thread)


def fail_at(monkeypatch, isolate: bool, step: int, error: str, message: str = "") -> None:
    """The loss of call `step` raises `error(message)`, in the child process or in this one."""
    if isolate:
        child_trainer(monkeypatch, "failing_at", step=step, error=error, message=message)
    else:
        failing = child_trainers.failing_loss(step, child_trainers.raiser(error, message))
        monkeypatch.setattr(engine.train.trainer, "loss_and_grads", failing)


@pytest.mark.parametrize("isolate", MODES)
def test_exception_inside_the_trainer_becomes_sig_failed(qtbot, monkeypatch, tmp_path, llama, chats, isolate):
    fail_at(monkeypatch, isolate, 2, "RuntimeError", "boom in step two")
    thread, worker = start_training(
        model=llama, data=chats, config=config(tmp_path, steps=5), isolate=isolate, start=False
    )
    seen = record(worker)
    with qtbot.waitSignals([worker.sig_failed, worker.sig_finished], order="strict", timeout=TIMEOUT_MS):
        thread.start()
    [message] = seen["failed"]
    assert "RuntimeError: boom in step two" in message and "at step 2" in message and "report" in message
    [result] = seen["finished"]
    assert isinstance(result, Failed) and result.step == 2 and result.message == message
    # the traceback of where it was raised, in whichever process that was
    assert "boom in step two" in worker.traceback and "child_trainers.py" in worker.traceback
    assert [e.step for e in seen["events"] if isinstance(e, Step)] == [1]
    assert_thread_gone(qtbot, thread)


@pytest.mark.parametrize("isolate", MODES)
def test_out_of_memory_says_what_to_do(qtbot, monkeypatch, tmp_path, llama, chats, isolate):
    fail_at(monkeypatch, isolate, 1, "MemoryError")
    thread, worker = start_training(
        model=llama, data=chats, config=config(tmp_path), isolate=isolate, start=False
    )
    seen = record(worker)
    run_to_end(qtbot, thread, worker)
    assert seen["failed"] == [OUT_OF_MEMORY]
    assert "lower the context length or batch size, or enable layer checkpointing" in OUT_OF_MEMORY
    [result] = seen["finished"]
    assert isinstance(result, Failed) and result.message == OUT_OF_MEMORY and result.step == 1
    assert_thread_gone(qtbot, thread)


@pytest.mark.skipif(not hasattr(os, "kill") or os.name == "nt", reason="SIGKILL is POSIX")
def test_a_killed_child_is_reported_and_the_checkpoint_kept(qtbot, monkeypatch, tmp_path, llama, chats):
    """The kernel's out-of-memory killer ends the child with SIGKILL: the window survives, says so,
    and points at the last checkpoint."""
    child_trainer(monkeypatch, "dying_at", step=3)
    cfg = config(tmp_path, steps=5, checkpoint_every=1)
    thread, worker = start_training(model=llama, data=chats, config=cfg, start=False)
    seen = record(worker)
    run_to_end(qtbot, thread, worker)
    [message] = seen["failed"]
    assert "killed (SIGKILL)" in message and "memory runs out" in message and "at step 3" in message
    assert "resume from it" in message
    [result] = seen["finished"]
    assert isinstance(result, Failed) and result.step == 3
    assert result.checkpoint_path.endswith("ckpt-000002")
    assert worker.process.exitcode == -9
    assert_thread_gone(qtbot, thread)


def test_start_training_takes_the_project_and_starts(qtbot, tmp_path, llama, chats):
    project = Project()
    project.update(model_path=llama, dataset_path=chats)
    project.update_config(steps=2, n_ctx=64)
    thread, worker = start_training(project)  # started at once
    assert_thread_gone(qtbot, thread)
    assert isinstance(worker.result, Finished) and worker.result.step == 2
    assert worker.model == llama and worker.data == chats and worker.config == project.config


def test_start_training_without_model_or_data_is_refused():
    with pytest.raises(ValueError, match="needs a model and a dataset"):
        start_training(Project())
