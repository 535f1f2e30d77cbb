"""The Export page: write the trained adapter in the type llama.cpp should load, or merge it into the
base model, then reload the written file to check it.

Exports run off the UI thread (merging a large model takes a while). The adapter defaults to the
one the last training run wrote.
"""

from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
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

from engine import GGUFFile, LoraAdapter, export_adapter, export_merged

from .project import ModelInfo, Project
from .tasks import run_task


class ExportPage(QWidget):
    sig_exported = Signal(str)

    def __init__(self, project: Project, parent: QWidget | None = None):
        super().__init__(parent)
        self.project = project
        self.info: ModelInfo | None = None
        self.task = None
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
        self.type_combo.setToolTip("Tensor type of the written adapter. Default F32.")
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
        self.export_button = QPushButton("Export")
        self.export_button.setToolTip("Write the file, then reload it to check it")
        self.export_button.clicked.connect(self.export)
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
                "<h3>Export</h3>Write an adapter llama.cpp loads with <code>--lora</code>, or a merged model."
            )
        )
        layout.addLayout(form)
        layout.addWidget(self.export_button, 0, Qt.AlignLeft)
        layout.addWidget(self.result_label)
        layout.addStretch(1)
        self.adapter_edit.textChanged.connect(self._suggest_out)
        self.merge_check.toggled.connect(self._suggest_out)

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
            self.out_edit.setText(path)

    def _suggest_out(self) -> None:
        src = self.adapter_edit.text().strip()
        if src:
            stem = os.path.splitext(src)[0]
            kind = "merged" if self.merge_check.isChecked() else self.type_combo.currentData().lower()
            self.out_edit.setText(f"{stem}.{kind}.gguf")

    def export(self) -> None:
        src, out = self.adapter_edit.text().strip(), self.out_edit.text().strip()
        qtype = self.type_combo.currentData()
        merge = self.merge_check.isChecked()
        base = self.project.model_path
        if not src or not out:
            self._show("Choose the adapter and where to write.", error=True)
            return
        if merge and not base:
            self._show("Open the base model on the Model page before merging.", error=True)
            return

        def work() -> str:
            adapter = LoraAdapter.load(src)
            if merge:
                report = export_merged(base, adapter, out, qtype=None if qtype == "F32" else qtype)
                GGUFFile(out)  # reload: the header and every tensor's extent are checked
                return f"Wrote {report.path}: {len(report.merged)} tensors merged; the file reloads."
            path = export_adapter(adapter, out, qtype=qtype)
            back = LoraAdapter.load(path)
            return f"Wrote {path}: {len(back.pairs)} adapted tensors ({qtype}); the file reloads."

        self.export_button.setEnabled(False)
        self._show("Exporting…")
        self.task = run_task(self, work, self._done, self._failed)

    def _done(self, message: str) -> None:
        self.export_button.setEnabled(True)
        self._show(message)
        self.sig_exported.emit(self.out_edit.text().strip())

    def _failed(self, message: str) -> None:
        self.export_button.setEnabled(True)
        self._show(f"Export failed: {message}", error=True)

    def _show(self, text: str, error: bool = False) -> None:
        self.result_label.setStyleSheet("QLabel { color: #b03a2e; }" if error else "")
        self.result_label.setText(text)
