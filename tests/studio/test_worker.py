"""The app's one engine worker: jobs in order on one thread, callbacks on the UI thread, models opened
once and shared, errors that always reach the window, stop and shutdown that never kill a thread."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QThread

from studio.worker import OUT_OF_MEMORY, Engine, ModelHandle

TIMEOUT_MS = 20_000


@pytest.fixture
def llama(synth_model) -> str:
    return synth_model("llama")


def wait(qtbot, engine: Engine) -> None:
    qtbot.waitUntil(lambda: not engine.jobs, timeout=TIMEOUT_MS)


def submit_until_stopped(engine: Engine, **kwargs):
    """Submit a job that runs until it is asked to stop (then returns "stopped"); returns the job and an
    event set once it runs."""
    started = threading.Event()

    def long(session, job):
        started.set()
        while not job.should_stop():
            time.sleep(0.005)
        return "stopped"

    return engine.submit("long", long, needs_session=False, **kwargs), started


def test_jobs_run_in_order_with_events_and_results_on_the_ui_thread(qtbot, engine):
    seen: list = []
    main = QThread.currentThread()

    def work(tag):
        def fn(session, job):
            assert QThread.currentThread() is not main  # the work: on the worker thread
            for i in range(3):
                job.emit((tag, i))
            return tag

        return fn

    def on_event(e):
        assert QThread.currentThread() is main
        seen.append(e)

    def on_done(r):
        assert QThread.currentThread() is main
        seen.append(("done", r))

    with qtbot.waitSignals([engine.sig_busy_changed, engine.sig_busy_changed], timeout=TIMEOUT_MS):
        for tag in ("a", "b"):
            engine.submit(tag, work(tag), on_event=on_event, on_done=on_done, needs_session=False)
    wait(qtbot, engine)
    assert seen == [("a", 0), ("a", 1), ("a", 2), ("done", "a"), ("b", 0), ("b", 1), ("b", 2), ("done", "b")]
    assert not engine.busy and engine.describe() == "Engine: idle"


def test_a_model_is_opened_once_and_shared_by_the_jobs_that_need_it(qtbot, engine, llama):
    handles: list[ModelHandle] = []
    sessions: list[int] = []
    with qtbot.waitSignal(engine.sig_model_opened, timeout=TIMEOUT_MS) as opened:
        engine.open_model(llama, on_done=handles.append)
    for _ in range(2):
        engine.submit(
            "use it", lambda session, job: id(session), on_done=sessions.append, model=(llama, "cpu")
        )
    wait(qtbot, engine)
    assert len(sessions) == 2 and sessions[0] == sessions[1]  # the same session served both jobs
    assert handles == [opened.args[0]] == [engine.model] and engine.model.path == llama
    errors: list[str] = []
    engine.open_model(llama + ".missing", on_error=errors.append)
    wait(qtbot, engine)
    assert errors and "missing" in errors[0] and engine.model is None  # the old model was released


def test_errors_reach_the_ui_as_messages(qtbot, engine):
    errors: list[str] = []
    jobs = [
        engine.submit("no model", lambda s, j: s.path, on_error=errors.append),
        engine.submit("memory", lambda s, j: (_ for _ in ()).throw(MemoryError()), on_error=errors.append,
                      needs_session=False),
        engine.submit("bug", lambda s, j: 1 / 0, on_error=errors.append, needs_session=False),
    ]  # fmt: skip
    wait(qtbot, engine)
    assert "no model is open" in errors[0]
    assert errors[1] == OUT_OF_MEMORY
    assert "ZeroDivisionError" in errors[2] and "bug" in errors[2]
    assert "ZeroDivisionError" in jobs[2].traceback and jobs[2].state == "failed"


def test_cancel_drops_a_queued_job_and_stops_a_running_one(qtbot, engine):
    results: list = []
    running, started = submit_until_stopped(engine, on_done=results.append)
    queued = engine.submit("never", lambda s, j: results.append("ran"), needs_session=False)
    assert started.wait(10)
    engine.cancel(queued)
    assert queued.state == "cancelled"
    engine.cancel(running)
    wait(qtbot, engine)
    qtbot.wait(50)
    assert results == ["stopped"]


def test_shutdown_stops_the_running_job_and_ends_the_thread(qtbot):
    engine = Engine()
    _, started = submit_until_stopped(engine)
    later = engine.submit("later", lambda s, j: None, needs_session=False)
    assert started.wait(10)
    assert engine.shutdown(10_000)
    assert later.state == "cancelled"
    errors: list[str] = []
    engine.submit("after", lambda s, j: None, on_error=errors.append, needs_session=False)
    assert errors == ["the app is closing"]


class _RacyState(str):
    """A job state whose first comparison on the worker thread waits (up to 1 s) for the UI thread's
    cancel: the window between the worker's look at the state and its write of "running", made
    certain. On the UI thread it compares at once."""

    def __new__(cls, value: str, reached: threading.Event, cancelled: threading.Event):
        s = super().__new__(cls, value)
        s.reached, s.cancelled, s.waited = reached, cancelled, False
        return s

    def _hold(self) -> None:
        if threading.current_thread() is not threading.main_thread() and not self.waited:
            self.waited = True
            self.reached.set()
            self.cancelled.wait(1.0)

    def __eq__(self, other):
        self._hold()
        return str.__eq__(self, other)

    def __ne__(self, other):
        self._hold()
        return str.__ne__(self, other)

    __hash__ = str.__hash__


def test_a_job_cancelled_as_the_worker_takes_it_either_never_runs_or_is_asked_to_stop(qtbot, engine):
    gate = threading.Event()
    engine.submit("holds the worker", lambda s, j: gate.wait(10), needs_session=False)
    ran: list[str] = []
    done: list = []

    def fn(session, job):  # a long job: it ends when asked to stop (or after 5 s)
        ran.append("ran")
        for _ in range(500):
            if job.should_stop():
                return "stopped"
            time.sleep(0.01)
        return "finished"

    job = engine.submit("racy", fn, on_done=done.append, needs_session=False)
    reached, cancelled = threading.Event(), threading.Event()
    job.state = _RacyState("queued", reached, cancelled)
    gate.set()
    assert reached.wait(10)  # the worker is looking at the job's state
    engine.cancel(job)
    dropped = job.state == "cancelled"
    cancelled.set()
    qtbot.waitUntil(lambda: not engine.jobs or (dropped and job not in engine.jobs), timeout=TIMEOUT_MS)
    qtbot.wait(100)
    if dropped:  # the UI was told the job will never run: it must not run, nor its on_done fire
        assert ran == [] and done == []
    else:  # the worker took it first: it runs, asked to stop, and its result comes back
        assert ran == ["ran"] and done == ["stopped"] and job.state == "done"


def test_only_a_handle_of_the_model_crosses_to_the_ui_thread(qtbot, engine, llama):
    with qtbot.waitSignal(engine.sig_model_opened, timeout=TIMEOUT_MS) as opened:
        engine.open_model(llama)
    handle = opened.args[0]
    assert isinstance(handle, ModelHandle) and handle == engine.model
    assert (handle.path, handle.device, handle.name) == (llama, "cpu", os.path.basename(llama))
    with pytest.raises(dataclasses.FrozenInstanceError):
        handle.path = "x"  # type: ignore[misc]
    from engine import EngineSession

    assert not any(isinstance(v, EngineSession) for v in vars(engine).values())  # only the worker holds it
    infos: list = []
    engine.open_model(llama, describe=lambda session: session.summary.config.arch, on_done=infos.append)
    wait(qtbot, engine)
    assert infos == ["llama"] and engine.model is handle  # the same model: not opened again


EXIT_SCRIPT = """
import sys, threading, time
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication
app = QApplication([])
from studio.main_window import MainWindow
folder = sys.argv[1]
w = MainWindow(settings=QSettings(folder + "/s.ini", QSettings.IniFormat), recovery_dir=folder + "/rec")
started = threading.Event()
def long(session, job):
    started.set()
    while not job.should_stop():
        time.sleep(0.01)
w.engine.submit("long", long, needs_session=False)
started.wait(10)
print("exiting without closing the window", flush=True)
"""


def test_a_program_that_builds_a_main_window_and_exits_without_closing_it_exits_cleanly(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       timeout=60, env=env, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert "exiting without closing the window" in r.stdout
    assert r.returncode == 0 and "QThread: Destroyed" not in r.stderr, (r.returncode, r.stderr[-2000:])


def test_the_application_quitting_stops_the_engine(qtbot):
    from PySide6.QtWidgets import QApplication

    engine = Engine()
    _, started = submit_until_stopped(engine)
    assert started.wait(10)
    QApplication.instance().aboutToQuit.emit()  # what QApplication.quit() sends before the loop ends
    assert not engine._thread.isRunning() and engine.jobs == []
