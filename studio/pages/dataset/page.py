"""The Dataset page: open, check, edit and save a JSON Lines training set.

A table of the samples (sortable, searchable), the problems found in the file with their line
numbers, an editor for the selected sample, and a token view showing which tokens the model is
trained on, with the open model's tokenizer and chat template. The samples live in a
`DatasetDocument` (the window's, shared with the other pages, or the page's own): every change
goes through it and is undoable with its history. Files are read with the engine's `load_jsonl`
(a bad line is a problem, never a failure) and written with `save_jsonl` (a temporary file
renamed into place, so a failed save leaves the file as it was). ShareGPT and Alpaca files open
or import as conversations and are saved as "messages".

The page keeps `project.dataset_path` up to date and opens the dataset a loaded project names.
Errors are shown in the page, with what to do next, and emitted as `sig_error`.

A file larger than `BACKGROUND_BYTES` is read off the UI thread (`loader.DatasetLoader`) with a
progress bar and a Cancel button, and the table's rows, search texts and lookups are made there
too; token counts with the open model are made in the background and come in as they are ready.
The table sorts and searches with arrays (`proxy.SamplesFilterModel`) and the Problems list shows
only the rows in sight (`problems.ProblemsModel`), so a hundred thousand samples stay fluid.

What this page is not: it holds no samples itself (the document does) and does not train, split
or pack; the dataset is kept in memory (files of a few hundred thousand samples are fine).

Its widgets are made in layout.py, importing and saving are files.py's, reading reading.py's and
the rows rows.py's; what is left here (about 700 lines) stays whole on purpose: opening a file,
the selection, the editor, the problems and the token view all act on the one document, table and
set of widgets, so apart they would pass the whole page from module to module.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QEvent, QItemSelection, QItemSelectionModel, QModelIndex, QTimer, Signal
from PySide6.QtGui import QAction, QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QWidget,
)

from engine import (
    ChatTemplate,
    ColumnMap,
    DatasetError,
    EncodeOptions,
    Problem,
    Sample,
    Source,
)

from ...count_process import MANY
from ...dataset_document import DatasetChange, DatasetDocument
from ...project import ModelInfo, Project
from ...weak_listener import listen_while_alive
from . import files, layout
from .files import FILE_FILTER
from .import_dialog import ColumnMapDialog
from .loader import DatasetLoader
from .problems import ProblemsModel
from .proxy import SamplesFilterModel
from .reading import LoadResult, read_dataset
from .samples import new_sample
from .table import SamplesModel

DATASET_SUFFIXES = (".jsonl", ".json", ".ndjson")
BACKGROUND_BYTES = 256 << 10  # files larger than this are read off the UI thread, with progress
LARGE = 20_000  # samples: a document this large is shown first, then its problems and first sample


class DatasetPage(QWidget):
    """The dataset editor. Public: open_path, save, save_as, import_path, set_model_info, actions(),
    undo, redo, document (DatasetDocument), is_modified, path, model (SamplesModel), samples."""

    sig_dataset_opened = Signal(str)  # a file was opened (its absolute path)
    sig_dataset_opening = Signal(str)  # a large file is being read in the background (its path)
    sig_modified = Signal(bool)  # the dataset now differs (True) or not (False) from the file
    sig_error = Signal(str)  # an error, also shown in the page
    sig_saved = Signal(str)  # the dataset was written to this path

    def __init__(
        self, project: Project, document: DatasetDocument | None = None, parent: QWidget | None = None
    ):
        super().__init__(parent)
        self.project = project
        self.document = document if document is not None else DatasetDocument()
        self.mapping_dialog: ColumnMapDialog | None = None  # the import's column mapping, while shown
        self.model_info: ModelInfo | None = None
        self._template: ChatTemplate | None = None
        self._tokens_shown: tuple | None = None  # what the token view shows (not to render it twice)
        self.background_bytes = BACKGROUND_BYTES  # files larger than this are read off the UI thread
        self._load_job: int | None = None  # the background read under way
        self._load_path: str | None = None
        # Questions to the person; replace them in tests or scripts.
        # confirm(title, text) -> bool: go ahead?  ask_unsaved() -> "save" | "discard" | "cancel"
        self.confirm: Callable[[str, str], bool] = lambda title, text: files.confirm_dialog(self, title, text)
        self.ask_unsaved: Callable[[], str] = lambda: files.ask_unsaved_dialog(self)
        self.setAcceptDrops(True)

        self.model = SamplesModel(self.document, parent=self)
        self.proxy = SamplesFilterModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.sig_searched.connect(self._update_labels)
        self.loader = DatasetLoader(self)
        self.loader.sig_progress.connect(self._load_progress)
        self.loader.sig_loaded.connect(self._load_done)
        self.loader.sig_failed.connect(self._load_failed)
        self.loader.sig_counts.connect(self.model.take_counts)
        self.loader.sig_counted.connect(self.model.counting_done)
        self.loader.sig_count_failed.connect(self._count_failed)
        self.model.set_counter(self._count_in_background)
        self.problems_model = ProblemsModel(self)
        self._refresh_timer = QTimer(self)
        self._refresh_timer.setSingleShot(True)
        self._refresh_timer.setInterval(120)
        self._refresh_timer.timeout.connect(self.refresh)

        layout.setup_actions(self)
        layout.setup_ui(self)
        self.model.sig_changed.connect(self._model_changed)
        listen_while_alive(self, project, DatasetPage._project_changed)
        listen_while_alive(self, self.document, DatasetPage._document_changed)
        self._update_history_actions()
        self._update_encoder()
        self.refresh()

    # --- building -----------------------------------------------------------------------------
    # --- public API ---------------------------------------------------------------------------
    def actions(self) -> list[QAction]:  # type: ignore[override]
        """The page's actions, for menus: open, save, save as, import, add, duplicate, delete,
        move up, move down, undo, redo, find. Their shortcuts work while focus is in the page."""
        return list(self._actions)

    @property
    def path(self) -> str | None:
        """The dataset's file (absolute), None for a new dataset."""
        return self.document.path

    @property
    def skipped(self) -> list[Problem]:
        """Errors on lines of the file that gave no sample (not in the table)."""
        return self.document.skipped

    @property
    def is_modified(self) -> bool:
        return self.document.dirty

    @property
    def samples(self) -> list[Sample]:
        return self.document.samples()

    def undo(self) -> None:
        """Undo the last change to the dataset (the rows it touched are selected)."""
        self.document.undo()

    def redo(self) -> None:
        self.document.redo()

    def set_model_info(self, info: ModelInfo | None) -> None:
        """Count and show tokens with this model's tokenizer and chat template (None: no model)."""
        self.model_info = info
        self._update_encoder()
        self.refresh()

    def open_path(self, path: str | os.PathLike[str]) -> bool:
        """Open a dataset file; False (and the reason shown in the page) when it cannot be read.

        Asks first when there are unsaved changes (`ask_unsaved`). A file larger than
        `background_bytes` is read off the UI thread: True then says that it is being read (the
        progress shows above the table, and sig_dataset_opened follows when it is open)."""
        path = os.path.abspath(os.fspath(path))
        if not self.may_discard_changes():
            return False
        try:
            size = os.path.getsize(path) if os.path.isfile(path) else 0
        except OSError:
            size = 0
        if size > self.background_bytes:
            self._start_loading(path, size)
            return True
        self.cancel_loading()
        try:
            result = read_dataset(path)
        except (DatasetError, OSError) as exc:
            self._open_failed(exc)
            return False
        self._apply_load(result)
        return True

    @property
    def loading(self) -> bool:
        """A file is being read in the background."""
        return self._load_job is not None

    def busy(self) -> bool:
        """Reading a file, searching, or listing its problems (in the background)."""
        return self.loading or self.proxy.searching or self._problems_builder.busy

    def cancel_loading(self) -> None:
        """Stop reading a file in the background; the dataset shown stays as it is."""
        if self._load_job is None:
            return
        self.loader.cancel_load()
        self._end_loading()
        self.show_message("info", f"Stopped reading {Path(self._load_path or '').name}: nothing was changed.")

    def _start_loading(self, path: str, size: int) -> None:
        self._load_path = path
        self._load_job = self.loader.load(path)
        self.load_label.setText(f"Reading {Path(path).name} ({size / 2**20:,.0f} MB)…")
        self.load_bar.setValue(0)
        self.load_bar.setFormat("%p%")
        self.load_strip.show()
        self.message.hide()
        self.sig_dataset_opening.emit(path)
        self.splitter.setEnabled(False)  # edits would be replaced by the file being read
        for action in self._actions:
            if action is not self.action_open:
                action.setEnabled(False)

    def _end_loading(self) -> None:
        self._load_job = None
        self.load_strip.hide()
        self.splitter.setEnabled(True)
        for action in (
            self.action_save,
            self.action_save_as,
            self.action_import,
            self.action_add,
            self.action_find,
        ):
            action.setEnabled(True)
        self._update_actions()
        self._update_history_actions()

    def _load_progress(self, job: int, done: int, total: int) -> None:
        if job == self._load_job and total:
            self.load_bar.setValue(int(1000 * min(done, total) / total))
            if done >= total:
                self.load_bar.setFormat("preparing the table…")

    def _load_done(self, job: int, result: LoadResult) -> None:
        if job != self._load_job:
            return
        self._end_loading()
        self._apply_load(result)

    def _load_failed(self, job: int, message: str) -> None:
        if job != self._load_job:
            return
        self._end_loading()
        self._open_failed(message)

    def _count_failed(self, generation: int, message: str) -> None:
        if generation != self.model.generation:
            return
        self.show_message(
            "warning",
            f"Counting tokens in the background failed: {message}\n"
            "The rows left are counted here instead, a slice at a time (the window stays usable).",
        )

    def _open_failed(self, exc: object) -> None:
        self.show_error(
            f"The dataset could not be opened: {exc}",
            "Choose a JSON Lines file (.jsonl) saved as UTF-8 text, with one JSON object per line.",
        )

    def _apply_load(self, result: LoadResult) -> None:
        """Show a file that was read: the document, the table and the problems take it in."""
        path = result.path
        self.model.prepare_rows(result.rows)
        self.document.reset(result.samples, path, saved=True, problems=result.problems, index=result.index)
        self._fit_number_columns()
        self.project.update(dataset_path=path)
        n, n_problems, name = len(result.samples), len(result.problems), Path(path).name
        if self.skipped:
            self.show_message(
                "warning",
                f"Opened {name}: {n:,} samples. {len(self.skipped):,} line(s) could not be read and are not "
                "in the table (see Problems). Fix them in the file, or know that saving here drops them.",
            )
        elif n_problems:
            self.show_message(
                "warning", f"Opened {name}: {n:,} samples, {n_problems:,} warning(s) (see Problems)."
            )
        elif not n:
            self.show_message("info", f"{name} holds no samples yet: add one with Add sample (Ctrl+Shift+N).")
        else:
            self.message.hide()
        self.sig_dataset_opened.emit(path)

    def _fit_number_columns(self) -> None:
        """Widen # and Line to hold the largest position and line (100,000 needs six digits)."""
        last_line = self.document.sample(len(self.document) - 1).line if len(self.document) else 0
        digits = len(str(max(len(self.document), last_line)))  # a file's lines only grow
        fm = self.fontMetrics()
        for col, title in ((SamplesModel.COL_INDEX, "#"), (SamplesModel.COL_LINE, "Line")):
            width = max(fm.horizontalAdvance("0" * max(digits, 4)), fm.horizontalAdvance(title + "0")) + 12
            if self.table.columnWidth(col) < width:
                self.table.setColumnWidth(col, width)

    def _count_in_background(self, generation: int, samples: list[Sample]) -> bool:
        """The table's counter: count tokens in the loader's child process (many rows; few are
        counted here)."""
        model = self.model
        if len(samples) < MANY or model.tokenizer is None or model.options is None:
            return False
        self.loader.count(generation, samples, model.tokenizer, model.template, model.options)
        return True

    def save(self) -> bool:
        """Save to the dataset's file (asks for a name when it has none)."""
        if not self.path:
            return self.choose_save_as()
        return files.write(self, self.path)

    def save_as(self, path: str | os.PathLike[str]) -> bool:
        """Save to `path`, which becomes the dataset's file (and the project's dataset)."""
        return files.write(self, os.path.abspath(os.fspath(path)))

    def may_discard_changes(self) -> bool:
        """True when there are no unsaved changes, or the person saved or discarded them."""
        if not self.is_modified:
            return True
        answer = self.ask_unsaved()
        if answer == "save":
            return self.save()
        return answer == "discard"

    def show_error(self, message: str, hint: str = "") -> None:
        """Show an error in the page (with what to do next) and emit sig_error."""
        text = f"{message}\n{hint}" if hint else message
        self.message.show_message("error", text)
        self.sig_error.emit(text)

    def show_message(self, level: str, text: str) -> None:
        self.message.show_message(level, text)

    def import_path(self, path: str | os.PathLike[str]) -> bool:
        """Append the samples of another file as one undoable step (`files.import_path`): CSV or TSV
        (through the column-mapping dialog), ShareGPT, Alpaca or preference data as a JSON array or
        JSON Lines, or any accepted shape. The file is only read; problems are reported by line."""
        return files.import_path(self, path)

    # --- dialogs ------------------------------------------------------------------------------
    def choose_import(self) -> bool:
        return files.choose_import(self)

    def choose_save_as(self) -> bool:
        return files.choose_save_as(self)

    def ask_mapping(self, source: Source, guess: ColumnMap) -> ColumnMap | None:
        """The columns the person maps in the dialog (None: cancelled)."""
        return files.ask_mapping(self, source, guess)

    def choose_file(self) -> bool:
        path, _ = QFileDialog.getOpenFileName(self, "Open dataset", files.start_dir(self), FILE_FILTER)
        return self.open_path(path) if path else False

    # --- editing ------------------------------------------------------------------------------
    def current_row(self) -> int:
        """The dataset position of the selected sample, -1 when none is."""
        index = self.table.currentIndex()
        if not index.isValid():
            return -1
        return self.proxy.mapToSource(index).row()

    def selected_rows(self) -> list[int]:
        rows = {self.proxy.mapToSource(i).row() for i in self.table.selectionModel().selectedRows()}
        if not rows and self.current_row() >= 0:
            rows = {self.current_row()}
        return sorted(rows)

    def select_rows(self, rows: list[int]) -> None:
        """Select these dataset positions (the first becomes current) and scroll to it."""
        rows = [r for r in rows if 0 <= r < self.model.rowCount()]
        selection_model = self.table.selectionModel()
        if not rows:
            selection_model.clearSelection()
            self._current_changed()
            return
        proxy_indexes = []
        for r in rows:
            index = self.proxy.mapFromSource(self.model.index(r, 0))
            if not index.isValid():  # hidden by the search: keep it visible while it is selected
                self.proxy.set_pinned(self.model.row_object(r), refilter=True)
                index = self.proxy.mapFromSource(self.model.index(r, 0))
            if index.isValid():
                proxy_indexes.append(index)
        if not proxy_indexes:
            return
        selection = QItemSelection()
        for index in proxy_indexes:
            selection.select(index, index.siblingAtColumn(self.proxy.columnCount() - 1))
        first = proxy_indexes[0]
        before = self.table.currentIndex()
        selection_model.setCurrentIndex(first, QItemSelectionModel.NoUpdate)
        selection_model.select(selection, QItemSelectionModel.ClearAndSelect | QItemSelectionModel.Rows)
        self.table.scrollTo(first)
        if before == first:  # currentRowChanged did not fire: the same row, perhaps a changed sample
            self._sync_editor()
            self._update_actions()
            self._refresh_timer.start()

    def add_sample(self, kind: str = "messages") -> None:
        row = self.current_row()
        at = row + 1 if row >= 0 else self.model.rowCount()
        shape = {"messages": "conversation", "prompt": "prompt/response sample", "text": "text sample",
                 "preference": "preference pair"}[kind]  # fmt: skip
        self.document.insert(at, [new_sample(kind)], f"Add a {shape}")
        self.editor.focus_first_field()

    def duplicate_selected(self) -> None:
        rows = self.selected_rows()
        if not rows:
            return
        copies = [replace(self.document.sample(r), line=0) for r in rows]
        what = "sample" if len(rows) == 1 else f"{len(rows)} samples"
        self.document.insert(rows[-1] + 1, copies, f"Duplicate {what}")

    def delete_selected(self) -> None:
        rows = self.selected_rows()
        if not rows:
            return
        what = "sample" if len(rows) == 1 else f"{len(rows)} samples"
        self.document.remove(rows, f"Delete {what}")

    def move_current(self, step: int) -> None:
        row = self.current_row()
        dst = row + step
        if row < 0 or not 0 <= dst < self.model.rowCount():
            return
        what = "up" if step < 0 else "down"
        self.document.move(row, dst, f"Move sample {what}")

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def _edited(self, new: Sample, problems: list[Problem], key: tuple, description: str) -> None:
        row = self.current_row()
        if row < 0:
            return
        # the document validates the sample again for the table (`problems` are the editor's view)
        self.document.edit(row, new, description, key=key)

    # --- problems -----------------------------------------------------------------------------
    def select_problem(self, index: QModelIndex | int) -> None:
        """Select the sample a problem is about (a row of the Problems list; skipped lines have none)."""
        row = index.row() if isinstance(index, QModelIndex) else int(index)
        entry = self.problems_model.entry(row)
        if entry is None:
            return
        if entry.row is not None:
            at = self.model.row_of(entry.row)
            if at >= 0:
                self.select_rows([at])
                return
        self.show_message(
            "warning",
            f"Line {entry.line} could not be read, so it is not in the table: fix it in a text editor and "
            "open the file again, or add the sample again here.",
        )

    def select_problem_at(self, row: int) -> None:
        """Click the Problems list's row `row` (as a person would): its sample is selected."""
        index = self.problems_model.index(row, 0)
        self.problems.setCurrentIndex(index)
        self.problems.scrollTo(index)
        self.select_problem(index)

    def problems_count(self) -> int:
        """Problems listed (the list is made in the background: this finishes it first)."""
        self._problems_builder.finish()
        return len(self.problems_model.entries)

    def _fill_problems(self) -> None:
        self._problems_builder.rebuild()

    def _no_problems_text(self) -> str:
        if self.model_info is None:
            return "No problems found in the file (open a model to check tokens too)."
        return "No problems found: every line was read and every sample encodes."

    def _problems_built(self) -> None:
        n = len(self.problems_model.entries)
        self.problems_title.setText(f"<b>Problems</b> ({n:,})" if n else "<b>Problems</b> (none)")

    # --- refreshing ---------------------------------------------------------------------------
    def refresh(self) -> None:
        """Update the problems list, the stats, the editor and the token view now (after an edit they
        follow on their own, a moment later)."""
        self._refresh_timer.stop()
        self._fill_problems()
        self._update_labels()
        self._sync_editor()
        self._refresh_tokens()
        self._update_actions()

    def _model_changed(self) -> None:
        self._sync_editor()
        self._update_actions()
        self._refresh_timer.start()

    def _update_labels(self) -> None:
        if self.path:
            mark = " (modified)" if self.is_modified else ""
            self.path_label.setText(f"<b>{Path(self.path).name}</b>{mark} — {os.path.dirname(self.path)}")
            self.path_label.setToolTip(f"The dataset file being edited: {self.path}")
        else:
            mark = " (not saved)" if self.model.rowCount() else ""
            self.path_label.setText(
                f"<b>New dataset</b>{mark} — open a .jsonl file (Ctrl+Shift+O), drop one here, or add samples"
            )
        s = self.model.stats()
        problems = s.problems + len(self.skipped)
        parts = [f"{s.samples:,} samples", f"{s.with_reward:,} with rewards", f"{problems:,} problems"]
        shown = self.proxy.rowCount()
        if self.proxy.search:
            parts.insert(1, f"{shown:,} shown")
        if self.model_info is None:
            parts.append("tokens: – (no model open)")
        elif not self.model.has_encoder():
            parts.append("tokens: – (check n_ctx)")
        elif s.tokens is None:
            parts.append(f"counting tokens… {s.counted:,}/{s.samples:,}")
        else:
            parts.append(f"{s.tokens:,} tokens ({s.trained:,} trained)")
        self.stats_label.setText(" · ".join(parts))

    def _header_text(self, row: int) -> str:
        s = self.model.sample(row)
        line = f"line {s.line}" if s.line else "new (not saved yet)"
        turns = f", {len(s.messages)} turns" if s.kind == "messages" else ""
        return f"<b>Sample {row + 1}</b> of {self.model.rowCount()} · {line} · {s.kind}{turns}"

    def _sync_editor(self) -> None:
        row = self.current_row()
        if row < 0:
            self.editor.show_sample(None)
        else:
            self.editor.show_sample(self.model.sample(row), self._header_text(row))

    def _current_changed(self) -> None:
        row = self.current_row()
        self.proxy.set_pinned(self.model.row_object(row) if row >= 0 else None)
        self._sync_editor()
        self._refresh_tokens()
        self._update_actions()

    def _refresh_tokens(self) -> None:
        row = self.current_row()
        shown = (
            (self.model.row_object(row), self.model.sample(row), self.model.encoded(row))
            if row >= 0 and self.model_info is not None and self.model.has_encoder()
            else None
        )
        last = self._tokens_shown
        if shown is not None and last is not None and all(a is b for a, b in zip(shown, last, strict=True)):
            return  # this very sample, with these tokens, is on show already
        self._tokens_shown = shown
        view = self.token_view
        if self.model_info is None:
            view.show_message(
                "No model is open, so there are no tokens to show. Open a .gguf model on the Model page: "
                "this view then shows the selected sample as the model reads it, with the tokens it is "
                "trained on in green."
            )
            return
        if not self.model.has_encoder():
            view.show_message("Tokens cannot be counted with the current settings: check n_ctx (at least 2).")
            return
        if row < 0:
            view.show_message("Select a sample to see its tokens.")
            return
        encoded = self.model.encoded(row)
        tokenizer = self.model.tokenizer
        if encoded is None or tokenizer is None:
            problems = [p for p in self.model.problems(row) if p.severity == "error"]
            why = "; ".join(p.message for p in problems) or "the sample cannot be encoded"
            view.show_message(f"This sample gives no tokens to train on: {why}.")
            return
        options = self.model.options
        note = f"cut at n_ctx = {options.n_ctx} ✂" if encoded.truncated and options else ""
        view.show_tokens(tokenizer, encoded, note)

    def _update_actions(self) -> None:
        row = self.current_row()
        has = row >= 0
        self.action_duplicate.setEnabled(has)
        self.action_delete.setEnabled(has)
        self.action_up.setEnabled(has and row > 0)
        self.action_down.setEnabled(has and row < self.model.rowCount() - 1)

    def _document_changed(self, change: DatasetChange) -> None:
        """The document changed (the table model has followed already): keep the page in step."""
        if change.kind == "reset":  # opened, or replaced (a recovered autosave)
            self.proxy.set_pinned(None)
            if len(self.document) > LARGE:
                # a large file: the rows first; its problems, stats and first sample a moment later, on
                # timers (not queued calls, which Qt delivers before the timers and input waiting: the
                # reset, the problems, the first selection and the paint of the table were one 75 ms
                # piece of work on the UI thread for 100,000 samples)
                self._refresh_timer.start()
                QTimer.singleShot(1, self._select_first)
            else:
                self.refresh()
                if len(self.document):
                    self.select_rows([0])
        elif change.kind == "history":
            self._update_history_actions()
            if change.rows:
                self.select_rows(list(change.rows))
        elif change.kind == "path":
            self._update_labels()
        elif change.kind == "dirty":
            self._update_labels()
            self.sig_modified.emit(self.document.dirty)

    def _select_first(self) -> None:
        if len(self.document) and self.current_row() < 0:
            self.select_rows([0])

    def _update_history_actions(self) -> None:
        doc = self.document
        for action, verb, can, what in (
            (self.action_undo, "Undo", doc.can_undo(), doc.undo_text()),
            (self.action_redo, "Redo", doc.can_redo(), doc.redo_text()),
        ):
            action.setEnabled(can)
            action.setText(f"{verb} {_lower_first(what)}" if can and what else verb)

    def _search_changed(self, text: str) -> None:
        self.proxy.set_search(text)
        self._update_labels()

    def _select_first_visible(self) -> None:
        if self.proxy.rowCount():
            self.select_rows([self.proxy.mapToSource(self.proxy.index(0, 0)).row()])
            self.table.setFocus()

    # --- model and project --------------------------------------------------------------------
    def _encode_options(self) -> EncodeOptions | None:
        c = self.project.config
        try:
            return EncodeOptions(
                n_ctx=c.n_ctx, train_on_prompt=c.train_on_prompt, prompt_format=c.prompt_format
            )
        except ValueError:
            return None

    def _update_encoder(self) -> None:
        info = self.model_info
        options = self._encode_options() if info is not None else None
        tokenizer = info.tokenizer if info is not None and options is not None else None
        template = info.template if tokenizer is not None and info is not None else None
        current = (self.model.tokenizer, self.model.options)
        if current == (tokenizer, options) and self._template is template:
            return
        self._template = template
        self.model.set_encoder(tokenizer, template, options)

    def shutdown(self) -> None:
        """The window is closing: a counting under way stops (its child process is killed and reaped)
        and a file being read is dropped."""
        self.loader.cancel_load()
        self.loader.shutdown()

    def _project_changed(self, changed: set[str]) -> None:
        if "config" in changed:
            self._update_encoder()
            self.refresh()
        if "dataset_path" in changed:
            path = self.project.dataset_path
            if path and (self.path is None or os.path.abspath(path) != self.path):
                self.open_path(path)

    # --- drag and drop ------------------------------------------------------------------------
    @staticmethod
    def _dropped_file(event: QDragEnterEvent | QDropEvent) -> str | None:
        mime = event.mimeData()
        if not mime.hasUrls():
            return None
        for url in mime.urls():
            if url.isLocalFile() and url.toLocalFile().lower().endswith(DATASET_SUFFIXES):
                return url.toLocalFile()
        return None

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt override
        if self._dropped_file(event):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt override
        path = self._dropped_file(event)
        if path:
            event.acceptProposedAction()
            self.open_path(path)

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.type() == QEvent.PaletteChange:
            self.model.forget_looks()
            self._refresh_tokens()
        super().changeEvent(event)


def _lower_first(text: str) -> str:
    """ "Delete 2 samples" -> "delete 2 samples", to follow "Undo"; "LoRA ..." stays."""
    if len(text) > 1 and text[1].isupper():
        return text
    return text[:1].lower() + text[1:]


__all__ = ["DatasetPage"]
