"""Studio tests run with the app's garbage-collection discipline: Python's cyclic GC never runs on its
own (it could run in a worker thread and destroy Qt objects there, which crashes Qt); it runs on the
main thread after every test, as the app's GarbageCollector timer does.

What survives a test's collection is frozen (`gc.freeze`): later collections look only at objects
made since, instead of the whole session's (with PySide6 wrappers a full collection took 60-200 ms,
twice a test, about a third of the studio tests' time). Frozen objects are still freed when their
last reference goes; a reference cycle among them waits for the end of the test module, where
everything is unfrozen and collected once (windows kept alive past their module would slow every
later palette change and theme test)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="module")
def collect_everything_after_each_module():
    yield
    gc.unfreeze()
    gc.collect()


@pytest.fixture(autouse=True)
def collect_garbage_on_the_main_thread():
    gc.collect()
    gc.freeze()
    gc.disable()
    yield
    gc.collect()
    gc.enable()


def show_active(qtbot, widget, size: tuple[int, int] | None = None) -> None:
    """Show a top-level widget (resized to `size` first if given) and wait until it is exposed and is the
    active window, where its shortcuts work."""
    if size is not None:
        widget.resize(*size)
    widget.show()
    qtbot.waitExposed(widget)
    widget.activateWindow()
    qtbot.waitUntil(widget.isActiveWindow, timeout=2000)


def submit_text(qtbot, page, edit, text: str, signal, submit, keyboard: bool, timeout: int):
    """Type `text` in the page's `edit` and submit it, by Ctrl+Enter in the box (keyboard=True) or by
    calling `submit`; wait for `signal` and for the page to be idle; the signal's arguments."""
    from PySide6.QtCore import Qt

    edit.setPlainText(text)
    with qtbot.waitSignal(signal, timeout=timeout) as fired:
        if keyboard:
            edit.setFocus()
            qtbot.keyClick(edit, Qt.Key_Return, Qt.ControlModifier)
        else:
            assert submit()
    qtbot.waitUntil(lambda: not page.is_busy(), timeout=timeout)
    return fired.args


def open_page(qtbot, page_class, project, engine, tmp_path, info, size: tuple[int, int]):
    """A page of `page_class` (an EnginePage) on `project` and `engine`, its settings in an ini file
    under tmp_path, the open model `info`, shown active at `size`."""
    from PySide6.QtCore import QSettings

    page = page_class(project, engine, settings=QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    qtbot.addWidget(page)
    page.set_model_info(info)
    show_active(qtbot, page, size)
    return page


@pytest.fixture
def engine(qtbot):
    """The app's engine worker (one thread, the open model), shut down after the test."""
    from studio.worker import Engine

    e = Engine()
    yield e
    e.shutdown(60_000)


@pytest.fixture
def shots(tmp_path) -> Path:
    """Where a test's screenshots go: $TUNE_STUDIO_SHOTS when set (to look at them), else under tmp_path."""
    folder = (
        Path(os.environ["TUNE_STUDIO_SHOTS"]) if os.environ.get("TUNE_STUDIO_SHOTS") else tmp_path / "shots"
    )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# the room a page has in a 1024x640 window (navigation, menu, first-steps strip and status bar taken)
SMALL = (1024 - 170, 640 - 110)


@pytest.fixture(scope="session")
def demo_info():
    """The bundled demo model's ModelInfo, read once."""
    from studio.project import ModelInfo
    from studio.resources import DEMO_MODEL

    return ModelInfo.read(str(DEMO_MODEL))
