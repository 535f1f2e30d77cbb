"""Autosave and recovery: unsaved edits are copied a moment after each change, a real crash (a child
process that dies) loses none of them, the next window offers them back (Restore / Discard), and
copies never replace the person's files nor outlive a real save or a clean close."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import fields
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from engine import Problem, Sample, load_jsonl
from studio.autosave import Autosave, RecoveryError, Snapshot, read_recovery, write_snapshot
from studio.dataset_document import DatasetDocument
from studio.main_window import MainWindow
from studio.pages.dataset.samples import new_sample, rebuild_sample
from studio.project import Project

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DATA = ROOT / "tests" / "data" / "datasets" / "sample_data.jsonl"

# A window in a child process: edits, waits for the autosave, writes what it shows, and dies
# without closing (os._exit: no close event, no clean-up, its lock on the recovery slot freed by
# the system as in a real crash).
CRASHING_WINDOW = textwrap.dedent(
    """
    import json, os, sys, time
    from dataclasses import fields
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication([])
    from studio.main_window import MainWindow
    from engine import Sample

    recovery, dataset, out = sys.argv[1:4]
    settings = QSettings(os.path.join(os.path.dirname(out), "crashed.ini"), QSettings.IniFormat)
    w = MainWindow(settings, recovery_dir=recovery)
    w.autosave.delay_ms = 20
    assert w.open_dataset(dataset)
    page = w.dataset_page
    page.select_rows([0])
    page.delete_selected()
    page.add_sample("text")
    page.editor.text.setPlainText("typed just before the crash")
    page.add_sample()  # an empty conversation: not valid yet, still being written
    w.project.update_config(rank=4)
    written = []
    w.autosave.sig_written.connect(written.append)
    deadline = time.monotonic() + 30
    while not written and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.005)
    assert written, "no autosave within 30 s"
    shown = [{f.name: getattr(s, f.name) for f in fields(Sample)} for s in w.dataset.samples()]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(shown, f)
    os._exit(3)
    """
)


def as_fields(samples: list[Sample]) -> list[dict]:
    return json.loads(json.dumps([{f.name: getattr(s, f.name) for f in fields(Sample)} for s in samples]))


def crash_after_edits(recovery: Path, dataset: Path, tmp_path: Path) -> list[dict]:
    """Run the crashing window; what it showed when it died (every field of every sample)."""
    out = tmp_path / "shown.json"
    result = subprocess.run(
        [sys.executable, "-c", CRASHING_WINDOW, str(recovery), str(dataset), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    return json.loads(out.read_text(encoding="utf-8"))


def slots(recovery: Path) -> list[str]:
    return sorted(p.name for p in recovery.iterdir() if p.is_dir()) if recovery.exists() else []


@pytest.fixture
def make_window(qtbot, tmp_path):
    made = []

    def make(recovery: Path, name: str = "settings") -> MainWindow:
        w = MainWindow(QSettings(str(tmp_path / f"{name}.ini"), QSettings.IniFormat), recovery_dir=recovery)
        w.confirm = lambda title, text: True
        w.ask_restore = lambda title, text: pytest.fail(f"asked to restore: {text}")
        w.dataset_page.ask_unsaved = lambda: "discard"
        qtbot.addWidget(w)
        made.append(w)
        return w

    yield make
    for w in made:
        w.engine.shutdown()


@pytest.fixture
def dataset(tmp_path) -> Path:
    path = tmp_path / "data.jsonl"
    shutil.copyfile(SAMPLE_DATA, path)
    return path


def test_edits_are_back_after_a_crash(make_window, dataset, tmp_path):
    before = dataset.read_bytes()
    recovery = tmp_path / "recovery"
    shown = crash_after_edits(recovery, dataset, tmp_path)
    assert dataset.read_bytes() == before  # the copy went to the recovery folder, not over the file
    assert len(slots(recovery)) == 1

    w = make_window(recovery)
    asked = []
    w.ask_restore = lambda title, text: asked.append((title, text)) or True
    assert w.offer_recovery()
    assert asked[0][0] == "Restore unsaved changes?"
    assert "the dataset data.jsonl (8 samples) and the project the untitled project" in asked[0][1]
    assert as_fields(w.dataset.samples()) == shown  # the invalid conversation too, lines and all
    assert "typed just before the crash" in [s.text for s in w.dataset.samples()]
    assert w.dataset.path == str(dataset) and w.dataset.dirty and not w.dataset.can_undo()
    assert w.project.config.rank == 4 and w.project.dirty and w.project.path is None
    assert w.project.dataset_path == str(dataset)
    assert w.dataset_page.model.rowCount() == 8 and w.dataset_page.is_modified
    assert "Restored 8 samples" in w.dataset_page.message.text()
    assert w.windowTitle().startswith("Tune Studio — untitled project *")

    # the copy is this window's now: the next change rewrites it, a clean close removes it
    assert slots(recovery) == [Path(w.autosave.slot).name]
    w.close()
    assert os.listdir(recovery) == []


def test_discard_removes_the_copy(make_window, dataset, tmp_path):
    recovery = tmp_path / "recovery"
    crash_after_edits(recovery, dataset, tmp_path)
    w = make_window(recovery)
    asked = []
    w.ask_restore = lambda title, text: asked.append(text) and False
    assert not w.offer_recovery()
    assert len(asked) == 1 and os.listdir(recovery) == []
    assert w.dataset.samples() == [] and not w.dataset.dirty and w.project.config.rank != 4
    other = make_window(recovery, "other")
    assert not other.offer_recovery()  # nothing left to ask about


def test_autosave_follows_changes_and_a_real_save_removes_the_copy(qtbot, make_window, dataset, tmp_path):
    recovery = tmp_path / "recovery"
    w = make_window(recovery)
    w.autosave.delay_ms = 20
    before = dataset.read_bytes()
    assert w.open_dataset(str(dataset))  # the project now names the dataset: an unsaved change
    with qtbot.waitSignal(w.autosave.sig_written, timeout=10_000) as written:
        pass
    copy = read_recovery(written.args[0])
    assert copy.samples is None and copy.project is not None  # only what is unsaved is copied
    assert copy.project["dataset_path"] == str(dataset)

    page = w.dataset_page
    page.select_rows([1])
    page.delete_selected()
    assert not w.autosave.slot or read_recovery(w.autosave.slot).samples is None  # not yet: a moment later
    with qtbot.waitSignal(w.autosave.sig_written, timeout=10_000):
        pass
    copy = read_recovery(w.autosave.slot)
    assert copy.samples == w.dataset.samples() and copy.dataset_path == str(dataset)
    assert dataset.read_bytes() == before

    assert page.save()
    assert w._save_project(str(tmp_path / "p.tune.json"))
    assert w.autosave.slot is None and os.listdir(recovery) == []  # nothing unsaved: no copy

    page.select_rows([0])
    page.delete_selected()
    page.undo()  # back to the saved state before the copy was due: nothing to copy
    qtbot.wait(100)
    assert os.listdir(recovery) == []


def test_a_live_windows_copy_is_not_offered_to_another_window(qtbot, make_window, dataset, tmp_path):
    recovery = tmp_path / "recovery"
    first = make_window(recovery)
    first.autosave.delay_ms = 20
    assert first.open_dataset(str(dataset))
    first.dataset_page.select_rows([0])
    first.dataset_page.delete_selected()
    with qtbot.waitSignal(first.autosave.sig_written, timeout=10_000):
        pass
    second = make_window(recovery, "second")
    assert not second.offer_recovery()  # ask_restore fails the test if called
    assert slots(recovery) == [Path(first.autosave.slot).name]


# -- the copies themselves -----------------------------------------------------------------------


def snapshot(samples, dataset_path=None, written=None, project=None) -> Snapshot:
    return Snapshot(
        written=time.time() if written is None else written,
        samples=tuple(samples) if samples is not None else None,
        dataset_path=dataset_path,
        skipped=(Problem(4, "invalid JSON at column 2: Expecting value", "error"),),
        project=project,
        project_path=None,
    )


def test_a_copy_reads_back_exactly_even_samples_still_being_edited(tmp_path):
    samples, _ = load_jsonl(SAMPLE_DATA)
    unfinished = rebuild_sample(samples[0], messages=({"role": "user", "content": "é ✓ \u2028 \ud800 x"},))[0]
    samples = [*samples[:3], new_sample("text"), unfinished, new_sample("prompt")]
    folder = tmp_path / "slot"
    write_snapshot(str(folder), snapshot(samples, "/somewhere/data.jsonl", project=Project().to_json()), 1)
    copy = read_recovery(str(folder))
    assert copy.samples == samples and copy.dataset_path == "/somewhere/data.jsonl"
    assert copy.skipped == [Problem(4, "invalid JSON at column 2: Expecting value", "error")]
    assert copy.project == json.loads(json.dumps(Project().to_json()))
    write_snapshot(str(folder), snapshot(samples[:2]), 2)  # the next copy replaces the first
    assert read_recovery(str(folder)).samples == samples[:2]
    assert sorted(os.listdir(folder)) == ["dataset-2.jsonl", "recovery.json"]


def test_a_copy_that_fails_to_write_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    samples, _ = load_jsonl(SAMPLE_DATA)
    folder = tmp_path / "slot"
    write_snapshot(str(folder), snapshot(samples), 1)

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_snapshot(str(folder), snapshot(samples[:1]), 2)
    monkeypatch.undo()
    assert read_recovery(str(folder)).samples == samples
    assert sorted(os.listdir(folder)) == ["dataset-1.jsonl", "recovery.json"]  # no temporary file left
    with pytest.raises(RecoveryError, match="no recovery copy"):
        read_recovery(str(tmp_path))


def test_copies_older_than_the_saved_files_are_not_offered(qtbot, tmp_path, dataset):
    samples, _ = load_jsonl(dataset)
    recovery = tmp_path / "recovery"
    write_snapshot(str(recovery / "old"), snapshot(samples[:2], str(dataset), written=time.time() - 60), 1)
    write_snapshot(str(recovery / "new"), snapshot(samples[:3], str(dataset), written=time.time() + 60), 1)
    write_snapshot(str(recovery / "first"), snapshot(samples[:1], None, written=time.time() - 3600), 1)
    (recovery / "empty").mkdir()  # a crash before its first copy was complete
    autosave = Autosave(DatasetDocument(), Project(), recovery)
    found = autosave.pending()
    assert [r.folder for r in found] == [str(recovery / "new"), str(recovery / "first")]  # newest first
    assert [len(r.samples) for r in found] == [3, 1]
    assert slots(recovery) == ["first", "new"]  # the out-of-date copy and the empty slot are gone
    for r in found:
        autosave.release(r)
    assert len(Autosave(DatasetDocument(), Project(), recovery).pending()) == 2
