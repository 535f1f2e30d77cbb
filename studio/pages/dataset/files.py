"""The Dataset page's file work beside opening: importing another file's samples (CSV and TSV
through the column-mapping dialog, ShareGPT, Alpaca, preference pairs) and saving, with the
dialogs they ask through. Functions of the page (`page`: the DatasetPage of page.py), which keeps
its public methods (import_path, save, save_as, ...) as one-line calls of these; the questions go
through the page's `confirm`, `ask_unsaved` and `ask_mapping`, which tests replace.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from PySide6.QtWidgets import QDialog, QFileDialog, QMessageBox

from engine import ColumnMap, DatasetError, Source, convert_source, guess_map, read_source

from .import_dialog import ColumnMapDialog

FILE_FILTER = "JSON Lines datasets (*.jsonl *.ndjson *.json);;All files (*)"
IMPORT_FILTER = "Datasets (*.csv *.tsv *.tab *.json *.jsonl *.ndjson);;All files (*)"


def start_dir(page) -> str:
    """Where a file dialog starts: the dataset's folder, else the project's."""
    anchor = page.path or page.project.dataset_path or page.project.path
    return os.path.dirname(anchor) if anchor else ""


def import_path(page, path: str | os.PathLike[str]) -> bool:
    """Append the samples of another file as one undoable step: CSV or TSV (through the
    column-mapping dialog), ShareGPT, Alpaca or preference data as a JSON array or JSON Lines,
    or any accepted shape. The file is only read; problems are reported by line."""
    path = os.path.abspath(os.fspath(path))
    try:
        source = read_source(path)
        mapping = ColumnMap()
        if source.format in ("csv", "tsv"):
            mapping = page.ask_mapping(source, guess_map(source.columns))
        else:
            result = convert_source(source, mapping)
            if not result.samples and not guess_map(source.columns).is_empty():
                mapping = page.ask_mapping(source, guess_map(source.columns))
        if mapping is None:
            return False
        result = convert_source(source, mapping)
        samples, problems = result.samples, result.problems
    except (DatasetError, OSError) as exc:
        page.show_error(
            f"Nothing was imported: {exc}",
            "Choose a CSV or TSV file with a header line, a JSON array or JSON Lines: ShareGPT "
            '({"conversations": [{"from", "value"}, …]}), Alpaca ({"instruction", "input", '
            '"output"}), preference pairs ({"prompt", "chosen", "rejected"}) or one of the '
            "dataset shapes.",
        )
        return False
    name = Path(path).name
    errors = [p for p in problems if p.severity == "error"]
    if not samples:
        first = f" First problem: line {errors[0].line}: {errors[0].message}" if errors else ""
        page.show_error(
            f"Nothing was imported: {name} has no sample that can be read.{first}",
            "Check the column mapping, or that the file holds one of the accepted shapes.",
        )
        return False
    imported = [replace(s, line=0) for s in samples]
    page.document.insert(len(page.document), imported, f"Import {len(imported)} samples from {name}")
    skipped = ""
    if errors:
        listed = "; ".join(f"line {p.line}: {p.message}" for p in errors[:3])
        more = f" and {len(errors) - 3} more" if len(errors) > 3 else ""
        skipped = f" {len(errors)} line(s) could not be read and were left out ({listed}{more})."
    page.show_message(
        "warning" if errors else "info",
        f"Imported {len(imported)} samples from {name} at the end of the dataset (Undo removes them)."
        + skipped,
    )
    return True


def choose_import(page) -> bool:
    path, _ = QFileDialog.getOpenFileName(
        page, "Import samples (CSV, TSV, ShareGPT, Alpaca, JSON Lines)", start_dir(page), IMPORT_FILTER
    )
    return page.import_path(path) if path else False


def ask_mapping(page, source: Source, guess: ColumnMap) -> ColumnMap | None:
    """The columns the person maps in the dialog (None: cancelled)."""
    dialog = ColumnMapDialog(source, guess, page)
    page.mapping_dialog = dialog  # for tests and screenshots
    accepted = dialog.exec() == QDialog.Accepted
    page.mapping_dialog = None
    return dialog.mapping() if accepted else None


def write(page, path: str) -> bool:
    if os.path.isdir(path):
        page.show_error(
            f"The dataset was not saved: {path} is a folder.",
            "Choose a file name ending in .jsonl with Save As (Ctrl+Shift+S).",
        )
        return False
    same_file = page.path is not None and os.path.abspath(page.path) == path
    if page.skipped and same_file:
        if not page.confirm(
            "Drop unreadable lines?",
            f"{len(page.skipped)} line(s) of {Path(path).name} could not be read and are not in the "
            "table. Saving replaces the file without them. Save anyway? (Use Save As to keep the "
            "original file.)",
        ):
            return False
    try:
        page.document.save(path)  # the lines are renumbered as in the file; clean
    except (DatasetError, OSError) as exc:
        page.show_error(
            f"The dataset was not saved: {exc}",
            "The file on disk was not changed. Check that the folder exists and can be written and "
            "that the disk has room, or save somewhere else with Save As (Ctrl+Shift+S).",
        )
        return False
    page.project.update(dataset_path=path)
    samples = page.document.samples()
    errors = page.model.stats().errors
    note = (
        f" {errors} sample(s) have errors (see Problems): training skips them until they are fixed."
        if errors
        else ""
    )
    page.show_message("warning" if errors else "info", f"Saved {len(samples)} samples to {path}.{note}")
    page.refresh()
    page.sig_saved.emit(path)
    return True


def choose_save_as(page) -> bool:
    start = page.path or os.path.join(start_dir(page), "dataset.jsonl")
    path, _ = QFileDialog.getSaveFileName(page, "Save dataset as", start, FILE_FILTER)
    if not path:
        return False
    if not Path(path).suffix:
        path += ".jsonl"
    return page.save_as(path)


def confirm_dialog(page, title: str, text: str) -> bool:
    answer = QMessageBox.question(page, title, text, QMessageBox.Yes | QMessageBox.Cancel, QMessageBox.Cancel)
    return answer == QMessageBox.Yes


def ask_unsaved_dialog(page) -> str:
    name = Path(page.path).name if page.path else "the new dataset"
    box = QMessageBox(page)
    box.setIcon(QMessageBox.Warning)
    box.setWindowTitle("Unsaved dataset changes")
    box.setText(f"Save the changes to {name}?")
    box.setInformativeText("If you don't save them, your changes to the dataset are lost.")
    box.setStandardButtons(QMessageBox.Save | QMessageBox.Discard | QMessageBox.Cancel)
    box.setDefaultButton(QMessageBox.Save)
    answer = box.exec()
    return {QMessageBox.Save: "save", QMessageBox.Discard: "discard"}.get(answer, "cancel")
