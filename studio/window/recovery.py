"""Unsaved changes autosaved by a window that did not close (a crash), offered back at the next start
(`offer_recovery(w)`, through the window's replaceable `ask_restore` hook)."""

from __future__ import annotations

import time

from PySide6.QtWidgets import QMessageBox, QWidget

from ..autosave import Recovery
from ..project import Project, ProjectError


def offer_recovery(w) -> bool:
    """Offer to restore the unsaved changes autosaved by windows that did not close (a crash),
    newest first, through `ask_restore`: Restore puts them back (unsaved), Discard deletes the
    copy. At most one copy is restored; the others wait for a later start. Call it once, at
    start, before opening files. True when a copy was restored."""
    restored = False
    for recovery in w.autosave.pending():
        if restored:
            w.autosave.release(recovery)
            continue
        text = (
            f"Tune Studio did not close properly last time. {recovery.describe()}\n\n"
            "Restore them? Discard deletes this copy; the files you saved are not changed either way."
        )
        if not w.ask_restore("Restore unsaved changes?", text):
            w.autosave.discard(recovery)
            continue
        try:
            restore(w, recovery)
        except ProjectError as exc:
            w.autosave.release(recovery)  # left for a later start
            w.statusBar().showMessage(f"The autosaved copy could not be restored: {exc}", 15000)
            continue
        w.autosave.adopt(recovery)
        restored = True
    return restored


def restore(w, recovery: Recovery) -> None:
    """Put the autosaved copy back in the window `w` (unsaved); ProjectError before any change."""
    if recovery.project is not None:
        Project().restore(recovery.project, recovery.project_path)  # ProjectError before any change
    if recovery.samples is not None:
        # first, so that the project's dataset_path names the open dataset and it is not read again
        w.dataset.reset(recovery.samples, recovery.dataset_path, saved=False, problems=recovery.skipped)
    if recovery.project is not None:
        w.project.restore(recovery.project, recovery.project_path)
        if w.project.model_path:
            w.open_model(w.project.model_path)
    elif recovery.samples is not None and recovery.dataset_path:
        w.project.update(dataset_path=recovery.dataset_path)
    when = time.strftime("%H:%M:%S", time.localtime(recovery.written))
    if recovery.samples is not None:
        w.dataset_page.show_message(
            "info",
            f"Restored {len(recovery.samples)} samples with the changes autosaved at {when}; they are "
            "not saved yet: save (Ctrl+S) to keep them.",
        )
    w.statusBar().showMessage(f"Restored the unsaved changes autosaved at {when}", 8000)


def ask_restore(parent: QWidget, title: str, text: str) -> bool:
    """Restore (True) or Discard (False) an autosaved copy; Escape restores, only Discard deletes."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Question)
    box.setWindowTitle(title)
    box.setText(text)
    restore = box.addButton("Restore", QMessageBox.AcceptRole)
    box.addButton("Discard", QMessageBox.DestructiveRole)
    box.setDefaultButton(restore)
    box.setEscapeButton(restore)  # only an explicit Discard deletes the copy
    box.exec()
    return box.clickedButton() is restore
