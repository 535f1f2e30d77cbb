"""What a newcomer meets in the window: the first-run strip that follows the work and links to the pages,
the demo opening without unsaved changes, Save / Discard / Cancel on quitting, datasets opening onto
the Dataset page, the quick start and the shortcut list (read from the actions), the theme choice,
and a window that goes down to 1024×640 with nothing cut off on the Model, Dataset and Targets pages."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QSettings, QTimer
from PySide6.QtGui import QAction, QColor, QKeySequence, QPalette
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QLineEdit,
    QMessageBox,
)

from engine import Finished, TargetSpec
from studio.app import DEMO_SETTINGS
from studio.main_window import PAGES, MainWindow
from studio.resources import DEMO_DATASET, DEMO_MODEL
from studio.widgets.theme import is_dark

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "data" / "datasets" / "sample_data.jsonl"


def make_window(tmp_path, name: str = "settings") -> MainWindow:
    """A window on its own settings file; `dispose` it at the end."""
    w = MainWindow(QSettings(str(tmp_path / f"{name}.ini"), QSettings.IniFormat))
    w.ask_unsaved = lambda text: "discard"
    w.project.update(output_dir=str(tmp_path / "runs"))
    w.project.dirty = False
    w.show()
    return w


def dispose(w: MainWindow) -> None:
    """Shut the engine down and delete the window now: live windows slow every palette change."""
    w.engine.shutdown()
    w.ask_unsaved = lambda text: "discard"
    w.close()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.DeferredDelete)


@pytest.fixture
def window(qtbot, tmp_path):
    w = make_window(tmp_path)
    yield w
    dispose(w)


def open_demo(qtbot, window: MainWindow) -> None:
    with qtbot.waitSignal(window.sig_model_changed, timeout=30_000):
        window.start_project(
            str(DEMO_MODEL),
            str(DEMO_DATASET),
            config=dict(targets=TargetSpec(preset="all"), **DEMO_SETTINGS),
        )


def finished() -> Finished:
    return Finished(
        step=1, stopped=False, final_loss=1.0, adapter_path=None, merged_path=None, checkpoint_path=None
    )


# --- the first-run strip ---------------------------------------------------------------------------
def test_first_steps_strip_follows_the_work_and_links_to_the_pages(qtbot, window):
    strip = window.first_steps
    assert strip.isVisible() and not any(strip.done[k] for k in ("Model", "Dataset", "Targets"))
    assert strip.next_step() == "Model"
    open_demo(qtbot, window)
    window.update_first_steps()
    assert strip.text_of("Model") == "Model ✓ demo.gguf"
    assert strip.text_of("Dataset") == f"Dataset ✓ {len(window.dataset)} samples"
    n = len(window.targets_page.selected_names())
    assert n > 0 and strip.text_of("Targets") == f"Targets ✓ {n} tensors"
    assert strip.text_of("Train") == "Start training →" and strip.next_step() == "Train"
    window.dataset.remove([0], "Delete sample")  # live: the strip follows the document
    qtbot.waitUntil(lambda: strip.text_of("Dataset") == f"Dataset ✓ {len(window.dataset)} samples")
    window.project.update_targets(preset="none", patterns=())
    qtbot.waitUntil(lambda: not strip.done["Targets"])
    assert strip.next_step() == "Targets"
    for name in ("Dataset", "Targets", "Train", "Model"):
        strip.buttons[name].click()
        assert window.current_page() is window.pages[PAGES.index(name)]


def test_a_long_model_name_does_not_widen_the_strip(qtbot):
    from studio.widgets.first_steps import FirstStepsWidget

    strip = FirstStepsWidget([("Model", "Model"), ("Train", "Start training")])
    qtbot.addWidget(strip)
    strip.set_step("Model", True, "demo.gguf")
    narrow = strip.minimumSizeHint().width()
    name = "a-very-long-model-name-with-every-detail-of-its-making-q4_k_m.gguf"
    strip.set_step("Model", True, name, tip=name)
    assert (
        strip.text_of("Model") == "Model ✓ a-very-long-model-nam…4_k_m.gguf"
        and strip.buttons["Model"].toolTip() == name
    )
    assert strip.minimumSizeHint().width() < narrow + 200


def test_the_strip_goes_once_the_person_has_trained_and_stays_gone(qtbot, window, tmp_path):
    assert window.first_steps.isVisible()
    window.train_page.sig_run_finished.emit(finished())
    assert not window.first_steps.isVisible() and not window.action_first_steps.isChecked()
    window.settings.sync()
    again = make_window(tmp_path)  # the same settings file
    try:
        assert not again.first_steps.isVisible()
        again.action_first_steps.trigger()  # View > Getting started strip brings it back
        assert again.first_steps.isVisible()
        again.first_steps.close_button.click()  # and its ✕ hides it, remembered
        assert not again.first_steps.isVisible() and again.settings.value("view/first_steps") in (
            False,
            "false",
        )
    finally:
        dispose(again)


# --- unsaved changes -------------------------------------------------------------------------------
def test_the_demo_opens_without_unsaved_changes(qtbot, window):
    open_demo(qtbot, window)
    qtbot.wait(50)  # what pages do after the model opened is part of opening it
    assert not window.project.dirty and not window.dataset.dirty
    assert "*" not in window.windowTitle() and window.windowTitle().endswith("demo.gguf")
    window.project.update_config(rank=4)  # a change the person makes is marked
    assert window.windowTitle().startswith("Tune Studio — untitled project *")


def test_quitting_with_unsaved_changes_offers_save_discard_cancel(qtbot, window, tmp_path, monkeypatch):
    data = tmp_path / "data.jsonl"
    shutil.copyfile(SAMPLE_DATA, data)
    assert window.open_dataset(str(data))
    window.dataset.remove([0], "Delete sample")
    asked = []
    window.ask_unsaved = lambda text: asked.append(text) or "cancel"
    assert not window.close() and window.isVisible()  # Cancel: nothing happens
    assert asked == ["Save the changes to the dataset data.jsonl and the untitled project?"]
    window.ask_unsaved = lambda text: "save"
    project = tmp_path / "p.tune.json"
    from PySide6.QtWidgets import QFileDialog

    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(project), ""))
    lines = len(data.read_text().splitlines())
    assert window.close()  # Save: the dataset and the project (named now) are written, then it closes
    assert len(data.read_text().splitlines()) == lines - 1 and not window.dataset.dirty
    assert project.exists() and not window.project.dirty


def test_the_question_has_save_discard_and_cancel_buttons(qtbot, window):
    window.confirm, window.ask_unsaved = window._ask, window._ask_unsaved  # the real dialog
    seen = {}

    def answer():
        boxes = [b for b in window.findChildren(QMessageBox) if b.isVisible()]
        if not boxes:
            QTimer.singleShot(10, answer)
            return
        seen["buttons"] = boxes[0].standardButtons()
        seen["text"] = boxes[0].text()
        boxes[0].button(QMessageBox.Cancel).click()

    window.project.update_config(rank=4)
    QTimer.singleShot(0, answer)
    assert not window.close() and window.isVisible()
    assert seen["buttons"] == QMessageBox.Save | QMessageBox.Discard | QMessageBox.Cancel
    assert seen["text"] == "Save the changes to the untitled project?"


# --- datasets open onto the Dataset page -----------------------------------------------------------
def test_opening_a_dataset_shows_the_dataset_page(qtbot, window, tmp_path, monkeypatch):
    data = tmp_path / "data.jsonl"
    shutil.copyfile(SAMPLE_DATA, data)
    from PySide6.QtWidgets import QFileDialog

    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(data), ""))
    window.show_page(0)
    window.action_open_dataset.trigger()  # File > Open dataset…
    assert window.current_page() is window.dataset_page and window.dataset.path == str(data)
    window.show_page(0)
    recent = window.recent_datasets_menu.actions()
    assert [a.text() for a in recent] == ["data.jsonl"]
    recent[0].trigger()  # File > Recent datasets
    assert window.current_page() is window.dataset_page
    window.show_page(0)
    window.open_any(str(data))  # a dropped file
    assert window.current_page() is window.dataset_page
    window.show_page(2)
    open_demo(qtbot, window)  # files opened as part of the demo (or a project) leave the page alone
    assert window.current_page() is window.targets_page


# --- help ------------------------------------------------------------------------------------------
def test_quick_start_has_a_step_for_every_page_each_linking_to_it(qtbot, window):
    dialog = window.show_quick_start()
    assert len(dialog.step_labels) == len(window.page_names) == 8
    assert "eight steps" in dialog.intro.text()
    texts = [label.text() for label in dialog.step_labels]
    assert "Ctrl+5" in texts[4] and "Chat" in texts[4] and "Ctrl+8" in texts[7]
    assert "Ctrl+O" in texts[0] and "Ctrl+1" in texts[0] and "Ctrl+Return" in texts[3]
    dialog.step_labels[2].linkActivated.emit("Targets")
    assert window.current_page() is window.targets_page and not dialog.isVisible()


def test_keyboard_shortcuts_are_read_from_the_actions(qtbot, window):
    rows = window.shortcut_rows()
    assert ("File menu", "Save", "Ctrl+S") in rows
    assert ("File menu", "Open dataset…", "Ctrl+Shift+O") in rows
    assert ("Help menu", "Keyboard shortcuts", "Ctrl+/") in rows
    for i, name in enumerate(PAGES):
        assert ("View menu", name, f"Ctrl+{i + 1}") in rows
    assert ("Train page", "Start", "Ctrl+Return") in rows
    listed = {keys for _, _, keys in rows}
    for action in window.findChildren(QAction):  # every action with a shortcut is there
        keys = ", ".join(s.toString(QKeySequence.NativeText) for s in action.shortcuts() if not s.isEmpty())
        assert not keys or keys in listed, action.text()
    fresh = QAction("Mark sample", window.dataset_page)  # never stale: a new action shows at once
    fresh.setShortcut(QKeySequence("Ctrl+Alt+M"))
    window.dataset_page.addAction(fresh)
    dialog = window.show_shortcuts()
    assert ("Dataset page", "Mark sample", "Ctrl+Alt+M") in dialog.rows
    dialog.filter.setText("ctrl+alt+m")
    assert dialog.visible_rows() == [("Dataset page", "Mark sample", "Ctrl+Alt+M")]


# --- theme -----------------------------------------------------------------------------------------
def contrast(a: QColor, b: QColor) -> float:
    """WCAG contrast ratio of two colours (4.5 is the minimum for body text)."""

    def lum(c: QColor) -> float:
        def ch(v: float) -> float:
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

        return 0.2126 * ch(c.redF()) + 0.7152 * ch(c.greenF()) + 0.0722 * ch(c.blueF())

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_theme_choice_applies_is_remembered_and_keeps_text_readable(qtbot, window, tmp_path):
    from studio.pages.dataset.table import TEXT_COLOURS
    from studio.pages.targets.page import ERROR_COLOURS, WARN_COLOURS

    app = QApplication.instance()
    before = QColor(app.palette().color(QPalette.Base))
    try:
        window.theme_actions["dark"].trigger()  # View > Theme > Dark
        QApplication.processEvents()  # the palette change reaches the hidden pages
        assert is_dark(app.palette()) and window.settings.value("view/theme") == "dark"
        assert is_dark(window.nav.palette())  # widgets with a style sheet follow too
        # hints, legends and warnings on the Targets and Dataset pages stay readable on dark
        page = window.targets_page
        for label in (page.legend_label, page.hint_label, page.placeholder):
            fg = label.palette().color(label.foregroundRole())
            assert contrast(fg, label.palette().color(QPalette.Window)) >= 4.5, label.text()[:30]
        pal = QApplication.palette()
        for colour in (ERROR_COLOURS[1], WARN_COLOURS[1], *(c[1] for c in TEXT_COLOURS.values())):
            assert contrast(QColor(colour), pal.color(QPalette.Window)) >= 4.5, colour
            assert contrast(QColor(colour), pal.color(QPalette.Base)) >= 4.5, colour
        assert ERROR_COLOURS[1] in page.error_label.styleSheet()  # the page switched its own colours
        window.settings.sync()
        again = make_window(tmp_path)  # the same settings: the theme is remembered
        try:
            assert again.theme == "dark" and again.theme_actions["dark"].isChecked()
        finally:
            dispose(again)
        window.set_theme("light")
        assert not is_dark(app.palette())
    finally:
        window.set_theme("system")
    assert app.palette().color(QPalette.Base) == before  # System gives back the desktop's palette
    for colour in (ERROR_COLOURS[0], WARN_COLOURS[0], *(c[0] for c in TEXT_COLOURS.values())):
        assert contrast(QColor(colour), QColor("#ffffff")) >= 4.5, colour


# --- layout ----------------------------------------------------------------------------------------
def test_window_fits_1024x640_with_nothing_cut_off(qtbot, window):
    open_demo(qtbot, window)
    window.resize(1024, 640)
    qtbot.waitUntil(lambda: window.size().width() == 1024 and window.size().height() == 640)
    hint = window.minimumSizeHint()
    assert hint.width() <= 1024 and hint.height() <= 640
    controls = (QAbstractButton, QComboBox, QLineEdit, QAbstractSpinBox)
    for name in ("Model", "Dataset", "Targets"):
        window.show_page(PAGES.index(name))
        QApplication.processEvents()
        page, area = window.current_page(), window.stack.currentWidget()
        assert page.minimumSizeHint().width() <= area.viewport().width(), name
        assert page.minimumSizeHint().height() <= area.viewport().height(), name
        assert not area.horizontalScrollBar().isVisible() and not area.verticalScrollBar().isVisible()
        for w in (w for kind in controls for w in page.findChildren(kind)):
            if w.isVisible():
                assert w.width() >= w.minimumSizeHint().width(), (
                    f"{name}: {type(w).__name__} {w.objectName()}"
                )
    nav = window.nav
    assert nav.viewport().width() >= nav.sizeHintForColumn(0)  # every page name shows whole
    status = [window.device_label, window.memory_label, window.state_label, window.engine_label]
    assert all(label.isVisible() and label.width() >= label.sizeHint().width() for label in status)
