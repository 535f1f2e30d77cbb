"""The app's one engine worker: jobs in order on one thread, callbacks on the UI thread, models opened
once and shared, errors that always reach the window, stop and shutdown that never kill a thread."""

from __future__ import annotations

import threading
import time

import pytest
from PySide6.QtCore import QThread

from engine import EngineSession
from studio.worker import OUT_OF_MEMORY, Engine

TIMEOUT_MS = 20_000


@pytest.fixture
def llama(synth_model) -> str:
    return synth_model("llama")


def wait(qtbot, engine: Engine) -> None:
    qtbot.waitUntil(lambda: not engine.jobs, timeout=TIMEOUT_MS)


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
    sessions: list[EngineSession] = []
    with qtbot.waitSignal(engine.sig_model_opened, timeout=TIMEOUT_MS):
        engine.open_model(llama, on_done=sessions.append)
    for _ in range(2):
        engine.submit("use it", lambda session, job: session, on_done=sessions.append, model=(llama, "cpu"))
    wait(qtbot, engine)
    assert len(sessions) == 3 and sessions[0] is sessions[1] is sessions[2] is engine.session
    errors: list[str] = []
    engine.open_model(llama + ".missing", on_error=errors.append)
    wait(qtbot, engine)
    assert errors and "missing" in errors[0] and engine.session is None  # the old model was released


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
    started = threading.Event()
    results: list = []

    def long(session, job):
        started.set()
        while not job.should_stop():
            time.sleep(0.005)
        return "stopped"

    running = engine.submit("long", long, on_done=results.append, needs_session=False)
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
    started = threading.Event()

    def long(session, job):
        started.set()
        while not job.should_stop():
            time.sleep(0.005)

    engine.submit("long", long, needs_session=False)
    later = engine.submit("later", lambda s, j: None, needs_session=False)
    assert started.wait(10)
    assert engine.shutdown(10_000)
    assert later.state == "cancelled"
    errors: list[str] = []
    engine.submit("after", lambda s, j: None, on_error=errors.append, needs_session=False)
    assert errors == ["the app is closing"]
