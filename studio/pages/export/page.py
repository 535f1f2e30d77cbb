"""The Export page: write the trained adapter in the type llama.cpp should load, or merge it into the
base model; checked before writing and verified after (the file is reloaded and its logits compared
with the model in memory).

Two ways: "Export now" runs the checks, the write and the verification of `studio.export_dialog` in
one worker with the settings on the page; "Export…" opens the `ExportDialog`, which also offers the
run's checkpoints, lists every check, shows the merge's progress with Cancel, and the logits per
prompt. The adapter defaults to the one the last training run wrote. Nothing here blocks the UI
thread.
"""

from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine import (
    ExportError,
    ExportRequest,
    check_export,
    human_bytes,
    suggest_out,
    verify_export,
    write_export,
)

from ...project import ModelInfo, Project
from ...worker import Engine
from .dialog import ExportDialog


class ExportPage(QWidget):
    sig_exported = Signal(str)

    def __init__(self, project: Project, engine: Engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.project = project
        self.engine = engine
        self.info: ModelInfo | None = None
        self.job = None  # the export job in flight
        self.dialog: ExportDialog | None = None
        self._out_auto = True
        self.adapter_edit = QLineEdit()
        self.adapter_edit.setPlaceholderText("the adapter a training run wrote, or choose a file")
        self.adapter_edit.setToolTip("The LoRA adapter (.gguf) to export. Filled in when training finishes.")
        browse = QPushButton("Choose…")
        browse.clicked.connect(self._choose_adapter)
        row = QHBoxLayout()
        row.addWidget(self.adapter_edit, 1)
        row.addWidget(browse)
        self.type_combo = QComboBox()
        for t, tip in (
            ("F32", "exact"),
            ("F16", "half the size"),
            ("Q8_0", "a quarter; llama-cli --lora only"),
        ):
            self.type_combo.addItem(f"{t} — {tip}", t)
        self.type_combo.setToolTip(
            "Tensor type of the written adapter. Default F32. llama-export-lora merges only F16/F32 "
            "adapters; Q8_0 writes F16 where rows are not a multiple of 32. When merging: F32 keeps each "
            "tensor's type, F16/Q8_0 write every merged matrix in that type."
        )
        self.merge_check = QCheckBox("Merge into the base model (a full model file)")
        self.merge_check.setToolTip(
            "Write base + adapter as one GGUF model; tensors keep their quantization type."
        )
        self.out_edit = QLineEdit()
        self.out_edit.setToolTip("Where the file is written (atomically: a temporary file, then renamed).")
        out_browse = QPushButton("Choose…")
        out_browse.clicked.connect(self._choose_out)
        out_row = QHBoxLayout()
        out_row.addWidget(self.out_edit, 1)
        out_row.addWidget(out_browse)
        self.export_button = QPushButton("Export now")
        self.export_button.setToolTip(
            "Check, write the file, then reload it and compare its logits with the model in memory"
        )
        self.export_button.clicked.connect(self.export)
        self.dialog_button = QPushButton("Export…")
        self.dialog_button.setShortcut(QKeySequence("Ctrl+Shift+E"))
        self.dialog_button.setToolTip(
            "Open the export dialog: checkpoints, every check listed, progress with Cancel, logits per "
            "prompt (Ctrl+Shift+E)"
        )
        self.dialog_button.clicked.connect(self.open_dialog)
        buttons = QHBoxLayout()
        buttons.addWidget(self.export_button)
        buttons.addWidget(self.dialog_button)
        buttons.addStretch(1)
        self.result_label = QLabel()
        self.result_label.setWordWrap(True)
        self.result_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        form = QFormLayout()
        form.addRow("Adapter:", row)
        form.addRow("Type:", self.type_combo)
        form.addRow("", self.merge_check)
        form.addRow("Write to:", out_row)
        layout = QVBoxLayout(self)
        layout.addWidget(
            QLabel(
                "<h3>Export</h3>Write an adapter llama.cpp loads with <code>--lora</code>, or a merged "
                "model. Every export is checked before writing and reloaded afterwards to compare its logits."
            )
        )
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.result_label)
        layout.addStretch(1)
        self.adapter_edit.textChanged.connect(self._suggest_out)
        self.merge_check.toggled.connect(self._suggest_out)
        self.type_combo.currentIndexChanged.connect(self._suggest_out)
        self.out_edit.textEdited.connect(self._out_edited)

    def set_model_info(self, info: ModelInfo | None) -> None:
        self.info = info

    def set_adapter(self, path: str) -> None:
        self.adapter_edit.setText(path)

    def _choose_adapter(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose adapter", "", "GGUF adapters (*.gguf)")
        if path:
            self.adapter_edit.setText(path)

    def _choose_out(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export to", self.out_edit.text(), "GGUF (*.gguf)")
        if path:
            self._out_auto = False
            self.out_edit.setText(path)

    def _out_edited(self, _text: str) -> None:
        self._out_auto = False

    def _suggest_out(self) -> None:
        src = self.adapter_edit.text().strip()
        if src and (self._out_auto or not self.out_edit.text().strip()):
            merge = self.merge_check.isChecked()
            self.out_edit.setText(suggest_out(src, merge, self._qtype()))

    def _qtype(self) -> str | None:
        qtype = self.type_combo.currentData()
        if self.merge_check.isChecked():
            return None if qtype == "F32" else qtype  # F32: each merged tensor keeps its type
        return qtype

    def request(self) -> ExportRequest:
        return ExportRequest(
            source=self.adapter_edit.text().strip(),
            out=self.out_edit.text().strip(),
            base=self.project.model_path,
            merge=self.merge_check.isChecked(),
            qtype=self._qtype(),
        )

    def shutdown(self) -> None:
        """The app is quitting: close the dialog (a merge in flight stops between tensors); the window
        then waits for the engine worker."""
        if self.dialog is not None:
            self.dialog.close()

    def open_dialog(self) -> ExportDialog:
        """The export dialog for the page's adapter and settings (window-modal, not blocking).

        One dialog per page, kept between openings (it remembers its last export); it is not
        deleted while the app runs.
        """
        dialog = self.dialog
        if dialog is None:
            dialog = self.dialog = ExportDialog(self.project, self.engine, None, self, self.info)
            dialog.sig_exported.connect(self.sig_exported)
            dialog.sig_verified.connect(self._dialog_verified)
        elif dialog.isVisible():
            dialog.raise_()
            dialog.activateWindow()
            return dialog
        dialog.info = self.info
        dialog.set_adapter(self.adapter_edit.text().strip() or None)
        dialog.set_kind(self.merge_check.isChecked())
        if self.merge_check.isChecked():
            dialog.merge_type_combo.setCurrentIndex(max(0, dialog.merge_type_combo.findData(self._qtype())))
        else:
            dialog.type_combo.setCurrentIndex(dialog.type_combo.findData(self.type_combo.currentData()))
        dialog.open()
        return dialog

    def _dialog_verified(self, report) -> None:
        self._show(f"Wrote {report.path}. {report.verdict()}", error=not report.ok)

    def export(self) -> None:
        """Check, write and verify with the page's settings, in a worker; sig_exported(path) when written."""
        req = self.request()
        if not req.source or not req.out:
            self._show("Choose the adapter and where to write.", error=True)
            return
        if not req.base:
            self._show("Open the base model on the Model page first: the export is checked against it.", True)
            return
        template = self.info.template if self.info is not None and self.info.path == req.base else None

        def work(session, job):
            report = check_export(req)
            if not report.ok or report.adapter is None:
                raise ExportError(report.summary())
            path = write_export(req, report.adapter)
            if session is not None and os.path.samefile(session.path, req.base):
                return path, session.verify_export(req, report.adapter, path)  # the model in memory
            return path, verify_export(req, report.adapter, path, template=template)

        self.export_button.setEnabled(False)
        self._show("Checking, exporting and verifying…")
        self.job = self.engine.submit("exporting", work, on_done=self._done, on_error=self._failed,
                                      needs_session=False)  # fmt: skip

    def _done(self, result) -> None:
        path, verified = result
        self.export_button.setEnabled(True)
        size = os.path.getsize(path) if os.path.exists(path) else 0
        kind = "merged model" if verified.merge else f"{self._qtype()} adapter"
        if verified.ok:
            text = f"Wrote {path} ({kind}, {human_bytes(size)}); the file reloads. {verified.verdict()}"
        else:
            text = f"Wrote {path}, but the file reloads with different logits: {verified.verdict()}"
        self._show(text, error=not verified.ok)
        self.sig_exported.emit(path)

    def _failed(self, message: str) -> None:
        self.export_button.setEnabled(True)
        self._show(f"Export failed: {message}", error=True)

    def _show(self, text: str, error: bool = False) -> None:
        self.result_label.setStyleSheet("QLabel { color: #b03a2e; }" if error else "")
        self.result_label.setText(text)
