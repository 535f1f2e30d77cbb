"""The export dialog: write a LoRA adapter GGUF (F32, F16, Q8_0) or a merged model GGUF, check before
writing, show progress, and after writing reload the file and compare its logits with the model in
memory.

The work is the engine's (`engine.check_export`, `engine.write_export`, `engine.verify_export`,
`engine.find_checkpoints`, `engine.suggest_out`; `tune-engine export --check/--verify` runs the
same); each step runs as a job of the app's engine worker (studio.worker), and a merge stops
between tensors when asked, leaving the target as it was. The sources are the current adapter, the
other runs of the model (`set_runs`), the run's checkpoints and files chosen by hand; after an
export it offers "Open folder", "Copy path" and a llama-cli command (`ExportResultWidget`). Its
body scrolls on a short screen, the buttons stay in view. The dialog keeps only widgets: it does
not train or generate.

Its widgets are made by studio.pages.export.layout; this module decides what they show and runs the
check, export and verify jobs.
"""

from __future__ import annotations

import os
import threading

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QColor, QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QTableWidgetItem,
    QTreeWidgetItem,
    QWidget,
)

from engine import (
    BAD_MARK,
    OK_MARK,
    CheckReport,
    ExportRequest,
    LoraAdapter,
    VerifyReport,
    check_export,
    export_modelfile,
    find_checkpoints,
    human_bytes,
    quarantine,
    run_of,
    suggest_out,
    verify_export,
    write_export,
)

from ...project import ModelInfo, Project
from ...widgets.runs import has_adapter, run_label, same_file, same_model
from ...widgets.theme import is_dark
from ...worker import Engine
from .layout import setup_ui
from .types import modelfile_outcome

GREEN, RED = "#1e7a34", "#b03a2e"  # on the light palette
DARK_GREEN, DARK_RED = "#7dcea0", "#ff8a80"  # on the dark one


# --- the dialog ------------------------------------------------------------------------------------


class ExportDialog(QDialog):
    """Choose a source and what to write, check, export with progress, verify; see the module docstring.

    Signals: sig_checked(CheckReport), sig_exported(path), sig_verified(VerifyReport), sig_failed(message)
    (a cancelled merge reports sig_failed too, with `cancelled` True).
    """

    sig_checked = Signal(object)
    sig_exported = Signal(str)
    sig_verified = Signal(object)
    sig_failed = Signal(str)

    def __init__(
        self,
        project: Project,
        engine: Engine,
        adapter_path: str | None = None,
        parent: QWidget | None = None,
        info: ModelInfo | None = None,
    ):
        super().__init__(parent)
        self.project = project
        self.engine = engine
        self.info = info
        self.adapter_path = adapter_path or None
        self.report: CheckReport | None = None
        self.runs: list = []  # engine RunRecord, from set_runs
        self.model_path: str | None = None
        self.verify_report: VerifyReport | None = None
        self.written: tuple[ExportRequest, LoraAdapter, str] | None = None
        self.modelfile_written: str | None = None  # the Modelfile of the last verified export
        self.cancelled = False
        self._busy = False  # an engine job of this dialog is queued or running
        self._phase = ""
        self._stop = threading.Event()
        self._close_when_done = False
        self._writing: tuple[ExportRequest, LoraAdapter] | None = None
        self._out_auto = True
        self.setWindowTitle("Export")
        self.setAcceptDrops(True)  # drop an adapter .gguf to export it
        screen = self.screen() or QGuiApplication.primaryScreen()
        room = screen.availableGeometry().height() - 60 if screen is not None else 760
        self.resize(800, max(420, min(760, room)))  # a small screen: the dialog's body scrolls
        setup_ui(self)
        self.refresh_sources()
        self._suggest()
        self._set_status("Press Check (Ctrl+K) to run the checks; Export is enabled when they pass.")

    # --- building ------------------------------------------------------------------------------
    def _colour(self, ok: bool) -> str:
        dark = is_dark(self.palette())
        return (DARK_GREEN if dark else GREEN) if ok else (DARK_RED if dark else RED)

    # --- sources ---------------------------------------------------------------------------------
    def refresh_sources(self) -> None:
        """Fill the source list: the current adapter, the run's checkpoints, files chosen before."""
        current = self.source_path()
        chosen = [
            self.source_combo.itemData(i)
            for i in range(self.source_combo.count())
            if self.source_combo.itemText(i).startswith("File ·")
        ]
        self.source_combo.blockSignals(True)
        self.source_combo.clear()
        if self.adapter_path:
            self.source_combo.addItem(
                f"Current adapter · {os.path.basename(self.adapter_path)}", self.adapter_path
            )
        for r in self.runs:  # the other runs of this model, newest first
            if (
                has_adapter(r)
                and same_model(r, self.model_path)
                and not same_file(r.adapter, self.adapter_path)
            ):
                self.source_combo.addItem(f"Run · {run_label(r)}", r.adapter)
        cfg = self.project.config
        run_ckpts = os.path.splitext(self.adapter_path)[0] + "-checkpoints" if self.adapter_path else None
        self.checkpoints = find_checkpoints(
            [run_ckpts, cfg.checkpoint_dir, self.project.output_folder()], run_of(self.adapter_path)
        )
        for c in self.checkpoints:
            self.source_combo.addItem(c.label(), c.path)
        for path in chosen:
            self.source_combo.addItem(f"File · {os.path.basename(path)}", path)
        for i in range(self.source_combo.count()):
            self.source_combo.setItemData(i, self.source_combo.itemData(i), Qt.ToolTipRole)
        if self.source_combo.count() == 0:
            self.source_combo.addItem("No adapter yet: train one, or choose a file", "")
        i = self.source_combo.findData(current) if current else 0
        self.source_combo.setCurrentIndex(max(0, i))
        self.source_combo.blockSignals(False)
        self._source_changed()

    def set_runs(self, runs, model_path: str | None) -> None:
        """The run history (engine RunRecord, newest first): each run of the model is a source."""
        self.runs, self.model_path = list(runs), model_path
        self.refresh_sources()

    def set_adapter(self, path: str | None) -> None:
        """The current adapter (the last run's): listed first with its run's checkpoints, and selected."""
        self.adapter_path = path or None
        self.refresh_sources()
        if path:
            self.set_source(path)

    def source_path(self) -> str:
        data = self.source_combo.currentData() if self.source_combo.count() else None
        return str(data) if data else ""

    def set_source(self, path: str) -> None:
        """Select `path` as the source (added to the list when it is not there)."""
        i = self.source_combo.findData(path)
        if i < 0:
            if self.source_combo.count() == 1 and not self.source_combo.itemData(0):
                self.source_combo.clear()
            self.source_combo.addItem(f"File · {os.path.basename(path)}", path)
            i = self.source_combo.count() - 1
            self.source_combo.setItemData(i, path, Qt.ToolTipRole)
        self.source_combo.setCurrentIndex(i)
        self._source_changed()

    def _choose_source(self) -> None:
        start = os.path.dirname(self.source_path()) or self.project.output_folder()
        path, _ = QFileDialog.getOpenFileName(self, "Choose adapter", start, "GGUF adapters (*.gguf)")
        if path:
            self.set_source(path)

    def _source_changed(self, *_: object) -> None:
        self.source_label.setText(self.source_path() or "—")
        base = self.project.model_path
        self.base_label.setText(base or "none open: open the base model on the Model page")
        self._settings_changed()

    # --- settings --------------------------------------------------------------------------------
    def request(self) -> ExportRequest:
        merge = self.merged_radio.isChecked()
        return ExportRequest(
            source=self.source_path(),
            out=self.out_edit.text().strip(),
            base=self.project.model_path,
            merge=merge,
            qtype=self.type_combo.qtype(),
            scale=float(self.scale_spin.value()) if merge else 1.0,
            modelfile=self.modelfile_check.isChecked(),
            sampling=self.project.chat_sampling,
        )

    def set_kind(self, merge: bool) -> None:
        (self.merged_radio if merge else self.adapter_radio).setChecked(True)

    def _kind_changed(self, *_: object) -> None:
        merge = self.merged_radio.isChecked()
        self.type_combo.set_merge(merge)
        self.merged_options.setVisible(merge)
        self._settings_changed()

    def _settings_changed(self, *_: object) -> None:
        merge = self.merged_radio.isChecked()
        tip = self.type_combo.itemData(self.type_combo.currentIndex(), Qt.ToolTipRole) or ""
        if merge:
            self.note_label.setText(
                "A whole model file: every metadata key, the tokenizer and the chat template are copied; "
                f"tensors the adapter does not touch are copied byte for byte. {tip}"
            )
        else:
            self.note_label.setText(tip)
        self._suggest()
        self._invalidate()

    def _suggest(self) -> None:
        src = self.source_path()
        if self._out_auto and src:
            req = self.request()
            self.out_edit.setText(suggest_out(src, req.merge, req.qtype))

    def _out_edited(self, _text: str) -> None:
        self._out_auto = False

    def _choose_out(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export to", self.out_edit.text(), "GGUF (*.gguf)")
        if path:
            self._out_auto = False
            self.out_edit.setText(path)

    def _invalidate(self) -> None:
        if self.report is not None and self.report.request != self.request():
            self.report = None
            self.check_tree.setEnabled(False)
            self.status_label.setStyleSheet("")
            self.status_label.setText("The settings changed: check again (Ctrl+K) before exporting.")
        self._update_buttons()

    # --- state -----------------------------------------------------------------------------------
    def is_busy(self) -> bool:
        """A check, export or verification is running (the buttons that start one are disabled)."""
        return self._busy

    def _update_buttons(self) -> None:
        busy = self.is_busy()
        ready = self.report is not None and self.report.ok and self.report.request == self.request()
        self.check_button.setEnabled(not busy)
        self.export_button.setEnabled(not busy and ready)
        self.verify_button.setEnabled(not busy and self.written is not None)
        self.cancel_button.setEnabled(busy and self._phase == "export" and self.request().merge)
        for w in (
            self.source_combo,
            self.adapter_radio,
            self.merged_radio,
            self.type_row,
            self.merged_options,
            self.out_edit,
        ):
            w.setEnabled(not busy)

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status_label.setStyleSheet(f"QLabel {{ color: {self._colour(False)}; }}" if error else "")
        self.status_label.setText(text)
        self._update_buttons()

    def _run(self, phase: str, fn, on_done, progress: bool = False) -> None:
        """fn(on_progress, should_stop, session) as a job of the engine worker; session is the app's
        engine session (None when no model is open)."""
        self._phase = phase
        self._stop.clear()
        self.cancelled = False
        self._busy = True
        stop = self._stop

        def job(session, job):
            return fn(lambda done, total: job.emit((done, total)), stop.is_set, session)

        self.engine.submit(
            {"check": "checking an export", "export": "exporting", "verify": "verifying an export"}[phase],
            job,
            on_event=(lambda ev: self._progress(*ev)) if progress else None,
            on_done=on_done,
            on_error=self._failed,
            needs_session=False,
        )
        self._update_buttons()

    def _end_phase(self) -> bool:
        """The worker has reported: idle again. True when a requested close happened."""
        self._busy = False
        self._phase = ""
        self._update_buttons()
        if self._close_when_done:
            self._close_when_done = False
            super().reject()
            return True
        return False

    def _bar(self, mode: str, done: int = 0, total: int = 1, text: str = "") -> None:
        """The progress bar: idle (empty), busy (indeterminate), tensors (done of total), done."""
        bar = self.progress
        if mode == "busy":
            bar.setRange(0, 0)
            bar.setTextVisible(False)
        elif mode == "tensors":
            bar.setRange(0, max(1, total))
            bar.setValue(done)
            bar.setFormat("%v of %m tensors")
            bar.setTextVisible(total > 1)
        else:
            bar.setRange(0, 1)
            bar.setValue(1 if mode == "done" else 0)
            bar.setFormat(text)
            bar.setTextVisible(bool(text))

    @Slot(int, int)
    def _progress(self, done: int, total: int) -> None:
        self._bar("tensors", done, total)
        if self.request().merge and done < total:
            self.status_label.setText(f"Merging: tensor {done} of {total}…")

    @Slot(str)
    def _failed(self, message: str) -> None:
        self._bar("idle")
        if self._phase == "export" and self._stop.is_set():
            self.cancelled = True
            self._set_status(
                f"Cancelled: nothing was written; {os.path.basename(self.request().out)} is as it was."
            )
        else:
            what = {"check": "The checks could not run", "export": "Export failed", "verify": "Verify failed"}
            hint = {
                "export": " Check again (Ctrl+K); the target is left as it was.",
                "verify": " The file was written; export again as F32 if this persists.",
            }
            self._set_status(
                f"{what.get(self._phase, 'Failed')}: {message}.{hint.get(self._phase, '')}", True
            )
        self._end_phase()
        self.sig_failed.emit(message)

    # --- check -----------------------------------------------------------------------------------
    def check(self) -> None:
        """Run the checks in a worker; sig_checked(CheckReport) when they are done."""
        if self.is_busy():
            return
        req = self.request()
        self.report = None
        self.check_tree.clear()
        self.status_label.setStyleSheet("")
        self.status_label.setText("Checking…")
        self._bar("busy")
        self._run("check", lambda progress, stop, session: check_export(req), self._checked)

    @Slot(object)
    def _checked(self, report: CheckReport) -> None:
        self._bar("idle")
        self.report = report
        self.check_tree.setEnabled(True)
        self.check_tree.clear()
        for item in report.items:
            row = QTreeWidgetItem([item.text(), item.detail])
            row.setForeground(0, QColor(self._colour(item.ok)))
            row.setToolTip(0, item.detail)
            row.setToolTip(1, item.detail)
            self.check_tree.addTopLevelItem(row)
        if report.ok:
            size = f" (about {human_bytes(report.size)})" if report.size else ""
            notes = "".join(f"\nNote: {n}" for n in report.notes)
            what = f"Export writes the {report.request.kind}{size}."
            self._set_status(f"All {len(report.items)} checks passed. {what}{notes}")
        else:
            bad = report.failures()
            # one wrapped paragraph: the label has room for wrapping, not for extra lines
            lines = "; ".join(f"{BAD_MARK} {i.label}: {i.detail}" for i in bad)
            what = "1 check failed; fix it" if len(bad) == 1 else f"{len(bad)} checks failed; fix them"
            self._set_status(f"{what} and check again — {lines}", True)
        self._end_phase()
        self.sig_checked.emit(report)

    def check_texts(self) -> list[str]:
        """The rows of the check list as shown: "✓ label — detail" (notes are in the status line)."""
        out = []
        for i in range(self.check_tree.topLevelItemCount()):
            row = self.check_tree.topLevelItem(i)
            out.append(f"{row.text(0)} — {row.text(1)}")
        return out

    # --- export ----------------------------------------------------------------------------------
    def export(self) -> None:
        """Write the file in a worker (the checks must have passed), then verify it."""
        if self.is_busy() or self.report is None or not self.report.ok or self.report.adapter is None:
            return
        req, adapter = self.report.request, self.report.adapter
        if req != self.request():
            self._invalidate()
            return
        self.written = None
        self.result.clear()
        self.verify_table.setRowCount(0)
        self.verdict_label.setStyleSheet("")
        self.verdict_label.setText("Not verified yet.")
        if req.merge:
            self._bar("tensors", 0, 1)
            self.status_label.setText("Merging…")
        else:
            self._bar("busy")  # indeterminate: one write
            self.status_label.setText(f"Writing the {req.kind}…")
        self.status_label.setStyleSheet("")

        def work(progress, should_stop, session):
            return write_export(req, adapter, progress, should_stop)

        self._writing = (req, adapter)
        self._run("export", work, self._exported, progress=True)

    @Slot(object)
    def _exported(self, path: str) -> None:
        self._bar("done", text="Written")
        req, adapter = self._writing
        self.written = (req, adapter, path)
        size = human_bytes(os.path.getsize(path)) if os.path.exists(path) else "?"
        self.status_label.setText(f"Wrote {path} ({size}). Verifying…")
        closed = self._end_phase()
        self.sig_exported.emit(path)
        if not closed:
            self.verify()

    def cancel(self) -> None:
        """Ask a running merge to stop between tensors; the target stays as it was."""
        if self.is_busy() and self._phase == "export":
            self._stop.set()
            self.status_label.setText("Cancelling…")
            self.cancel_button.setEnabled(False)

    # --- verify ----------------------------------------------------------------------------------
    def verify(self) -> None:
        """Reload the written file and compare logits in a worker; sig_verified(VerifyReport)."""
        if self.is_busy() or self.written is None:
            return
        req, adapter, path = self.written
        template = self.info.template if self.info is not None and self.info.path == req.base else None
        self._bar("busy")
        self.verdict_label.setStyleSheet("")
        self.verdict_label.setText("Verifying: reloading the file and comparing logits…")

        def work(progress, should_stop, session):
            if session is not None and req.base and os.path.samefile(session.path, req.base):
                report = session.verify_export(req, adapter, path)  # against the model in memory
            else:
                report = verify_export(req, adapter, path, template=template)
            report = quarantine(report)  # a file that failed is renamed *.failed.gguf
            return report, export_modelfile(req) if report.ok else None

        self._run("verify", work, self._verified_and_modelfile)

    def _verified_and_modelfile(self, result) -> None:
        report, modelfile = result
        self.modelfile_written = modelfile
        self._verified(report)
        if report.ok and self.modelfile_check.isChecked():
            notes = self.report.notes if self.report is not None else []
            self._set_status(f"{self.status_label.text()} {modelfile_outcome(modelfile, notes)}")

    @Slot(object)
    def _verified(self, report: VerifyReport) -> None:
        self._bar("done", text="Written and verified")
        self.verify_report = report
        self.verify_table.setRowCount(len(report.rows))
        for r, row in enumerate(report.rows):
            off = f"{row.n_off} of {row.n_tokens}; others ≤ {row.max_abs_rest:.3g}" if row.n_off else "none"
            rel = f"{row.rel:.1e}" if row.max_abs else "0"
            cells = (row.prompt, str(row.n_tokens), f"{row.max_abs:.3g}", rel, off)
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c:
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.verify_table.setItem(r, c, item)
        mark = OK_MARK if report.ok else BAD_MARK
        notes = f" ({'; '.join(report.notes)})" if report.notes else ""
        self.verdict_label.setStyleSheet(f"QLabel {{ color: {self._colour(report.ok)}; }}")
        self.verdict_label.setText(f"{mark} {report.verdict()}{notes}")
        if report.ok:
            self._set_status(f"Wrote and verified {report.path}.")
            self.result.set_result(report.path, self.project.model_path, report.merge)
        else:
            self._set_status(f"{os.path.basename(report.path)} failed its check: do not use it.", error=True)
            self.result.set_failed(report.failed_path or report.path)
            if report.failed_path:
                self.written = None  # the file is no longer where it was written
        self._end_phase()
        self.sig_verified.emit(report)

    # --- drag and drop -------------------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt's name
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        if len(urls) == 1 and urls[0].toLocalFile().lower().endswith(".gguf") and not self.is_busy():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt's name
        """A dropped .gguf adapter becomes the source."""
        self.set_source(event.mimeData().urls()[0].toLocalFile())
        event.acceptProposedAction()

    # --- closing ---------------------------------------------------------------------------------
    def reject(self) -> None:
        """Close; while a worker runs, stop a merge and close when it has ended (never kill a thread)."""
        if self.is_busy():
            self._close_when_done = True
            self.cancel()
            self.status_label.setText("Closing when the current step ends…")
            return
        super().reject()


__all__ = ["ExportDialog"]
