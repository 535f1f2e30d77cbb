"""Studio tests run with the app's garbage-collection discipline: Python's cyclic GC never runs on its
own (it could run in a worker thread and destroy Qt objects there, which crashes Qt); it runs on the
main thread after every test, as the app's GarbageCollector timer does."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture(autouse=True)
def collect_garbage_on_the_main_thread():
    gc.collect()
    gc.disable()
    yield
    gc.collect()
    gc.enable()


@pytest.fixture
def engine(qtbot):
    """The app's engine worker (one thread, the open model), shut down after the test."""
    from studio.worker import Engine

    e = Engine()
    yield e
    e.shutdown(60_000)
