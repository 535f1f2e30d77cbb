"""The Export page: write the trained adapter in the type llama.cpp should load, or merge it into the
base model; checked before writing and verified after (the file is reloaded and its logits compared
with the model in memory).

One export action: **Export** (Ctrl+E) checks, writes and verifies with the settings on the page,
in the engine worker; afterwards the page offers "Open folder", "Copy path" and a ready
`llama-cli` command. **More options…** (Ctrl+Shift+E) opens the `ExportDialog` for what the page
does not show: a run's checkpoints, the merge scale, every check listed, merge progress with
Cancel and the logits per prompt.

The adapter comes from the run history (`engine.find_runs`): by default the latest finished run of
the open model (`engine.latest_finished`; after rating rounds the reward-tuned adapter, labelled
so). Any run or file can be chosen; a stopped run is listed but never chosen by itself. An adapter
made for another model is named at once (its header against the model's tensors), before anything
is written. Nothing here blocks the UI thread.
"""

from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
)

from engine import (
    VERIFY_PROMPTS,
    EngineError,
    ExportError,
    ExportRequest,
    check_export,
    export_modelfile,
    human_bytes,
    load_jsonl,
    quarantine,
    suggest_out,
    verify_export,
    write_export,
)

from ...project import ModelInfo
from ...widgets.buttons import action_button, shortcut_text
from ...widgets.engine_page import RUNS_MOVED, EnginePage
from ...widgets.faint_label import FaintLabel
from ...widgets.page_layout import PageLayout
from ...widgets.runs import RunChoiceWidget, fit_message
from ...widgets.theme import is_dark
from ...widgets.wrapping_label import wrapping_label
from .dialog import ExportDialog
from .result import ExportResultWidget
from .types import ExportTypeCombo, modelfile_check, modelfile_outcome

RUN_PROMPTS = 3  # prompts of the run's own dataset the verification adds to the generic ones


def run_prompts(dataset: str | None) -> tuple[str, ...]:
    """The verification's prompts: the first user turns of the run's dataset (when its file is at
    hand) and the generic ones (`engine.VERIFY_PROMPTS`). Reads the file: call it in the worker."""
    own: list[str] = []
    if dataset:
        try:
            samples, _ = load_jsonl(dataset)
        except (EngineError, OSError):
            samples = []
        for sample in samples:
            user = next((m.get("content") for m in sample.messages if m.get("role") == "user"), None)
            if isinstance(user, str) and user.strip() and user not in own:
                own.append(user)
            if len(own) == RUN_PROMPTS:
                break
    return (*own, *VERIFY_PROMPTS)


class ExportPage(EnginePage):
    """Export the chosen adapter; see the module docstring."""

    sig_exported = Signal(str)  # a file written and verified
    sig_export_failed = Signal(str)  # a file that failed its check (renamed *.failed.gguf)

    def __init__(self, *args, **kwargs):
        """EnginePage's arguments: project, engine, parent, settings."""
        super().__init__(*args, **kwargs)
        self.job = None  # the export job in flight
        self.dialog: ExportDialog | None = None
        self._out_auto = True
        self.adapter_choice = RunChoiceWidget(
            placeholder="No finished run of this model yet: train one, or choose a file"
        )
        self.adapter_choice.sig_changed.connect(self._adapter_changed)
        self.adapter_path_label = FaintLabel(wrap=True, squeeze=True)
        self.adapter_path_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.merge_check = QCheckBox("Merge into the base model (a full model file)")
        self.merge_check.setToolTip(
            "Write base + adapter as one GGUF model: the adapted tensors in a type that keeps the "
            "fine-tune (Type), every other tensor as the base stores it. Default: off (an adapter file, "
            "loaded with --lora)."
        )
        self.modelfile_check = modelfile_check()
        self.type_combo = ExportTypeCombo()  # one control: the adapter's type, or the merge's
        self.out_edit = QLineEdit()
        self.out_edit.setToolTip(
            "Where the file is written (atomically: a temporary file, then renamed). Default: beside the "
            "adapter, named after it and the type."
        )
        out_browse = action_button("Choose…", self._choose_out, "Choose where to write the file")
        out_row = QHBoxLayout()
        out_row.addWidget(self.out_edit, 1)
        out_row.addWidget(out_browse)

        self.export_button = QPushButton("Export")
        self.export_button.setShortcut(QKeySequence("Ctrl+E"))
        self.export_button.setToolTip(
            f"Check, write the file, then reload it and compare its logits with the model in memory "
            f"({shortcut_text('Ctrl+E')})"
        )
        self.export_button.setDefault(True)
        self.export_button.setMinimumHeight(32)
        self.export_button.setMinimumWidth(120)
        font = self.export_button.font()
        font.setBold(True)
        self.export_button.setFont(font)
        self.export_button.clicked.connect(self.export)
        self.dialog_button = QPushButton("More options…")
        self.dialog_button.setFlat(True)
        self.dialog_button.setShortcut(QKeySequence("Ctrl+Shift+E"))
        self.dialog_button.setToolTip(
            "The export dialog, for what this page does not show: a run's checkpoints, the merge scale, "
            "every check listed, merge progress with Cancel, logits per prompt "
            f"({shortcut_text('Ctrl+Shift+E')})"
        )
        self.dialog_button.clicked.connect(self.open_dialog)
        buttons = QHBoxLayout()
        buttons.addWidget(self.export_button)
        buttons.addWidget(self.dialog_button)
        buttons.addStretch(1)
        self.result_label = wrapping_label(interaction=Qt.TextSelectableByMouse)
        self.result = ExportResultWidget()

        form = QFormLayout()
        form.addRow("Adapter:", self.adapter_choice)
        form.addRow("", self.adapter_path_label)
        form.addRow("", self.merge_check)
        form.addRow("Type:", self.type_combo)
        form.addRow("Write to:", out_row)
        form.addRow("", self.modelfile_check)
        intro = wrapping_label(
            "<h3>Export</h3>Write an adapter llama.cpp loads with <code>--lora</code>, or a merged model. "
            "Every export is checked before writing and reloaded afterwards to compare its logits."
        )
        layout = PageLayout(self)  # fills the height it is given: the buttons stay in view
        layout.addWidget(intro)
        layout.addWidget(self.banner)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.result_label)
        layout.addWidget(self.result)
        layout.addStretch(1)
        self.merge_check.toggled.connect(self.type_combo.set_merge)
        self.merge_check.toggled.connect(self._suggest_out)
        self.type_combo.currentIndexChanged.connect(self._suggest_out)
        self.out_edit.textEdited.connect(self._out_edited)
        self.refresh_runs()

    # --- public API ---------------------------------------------------------------------------
    def set_model_info(self, info: ModelInfo | None) -> None:
        """The open model: the list of runs follows it (its latest finished run by default)."""
        self.info = info
        self.refresh_runs()
        self._check_fit()

    def refresh_runs(self) -> None:
        """Read the run history again; the default is the latest finished run of the open model (after
        rating rounds: the reward-tuned adapter), unless the person chose one."""
        self.adapter_choice.refresh(self.project, self.settings, self.model_path())

    def set_adapter(self, path: str | None) -> None:
        """Export this adapter (a run's, or any file); None goes back to the default."""
        if path:
            self.adapter_choice.set_path(path)
        else:
            self.adapter_choice.reset()

    def adapter_path(self) -> str:
        return self.adapter_choice.current_path() or ""

    def reset(self) -> None:
        """A new project: no adapter chosen, no result, the default type and name."""
        self.adapter_choice.files = []
        self.adapter_choice.reset()
        self.merge_check.setChecked(False)
        self.type_combo.set_qtype("F32")
        self.result.clear()
        self.result_label.setText("")
        self.out_edit.clear()
        self._out_auto = True
        self.banner.hide()

    def shutdown(self) -> None:
        """The app is quitting: close the dialog (a merge in flight stops between tensors); the window
        then waits for the engine worker."""
        if self.dialog is not None:
            self.dialog.close()

    # --- the adapter ----------------------------------------------------------------------------
    def _adapter_changed(self, path: object, _label: str) -> None:
        self.adapter_path_label.setText(str(path) if path else "")
        self.adapter_path_label.setToolTip(str(path) if path else "")
        self.result.clear()
        self.result_label.setText("")
        self._suggest_out()
        self._check_fit()

    def _check_fit(self) -> bool:
        """Name at once an adapter made for another model (headers only); True when it fits."""
        return self.warn_fit(self.adapter_path())

    def _choose_out(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export to", self.out_edit.text(), "GGUF (*.gguf)")
        if path:
            self._out_auto = False
            self.out_edit.setText(path)

    def _out_edited(self, _text: str) -> None:
        self._out_auto = False

    def _suggest_out(self, *_: object) -> None:
        src = self.adapter_path()
        if src and (self._out_auto or not self.out_edit.text().strip()):
            merge = self.merge_check.isChecked()
            self.out_edit.setText(suggest_out(src, merge, self._qtype()))

    def _qtype(self) -> str | None:
        return self.type_combo.qtype()

    def request(self) -> ExportRequest:
        return ExportRequest(
            source=self.adapter_path(),
            out=self.out_edit.text().strip(),
            base=self.project.model_path,
            merge=self.merge_check.isChecked(),
            qtype=self._qtype(),
            modelfile=self.modelfile_check.isChecked(),
            sampling=self.project.chat_sampling,
        )

    # --- the dialog ------------------------------------------------------------------------------
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
        dialog.set_runs([r for r in self.adapter_choice.runs], self.model_path())
        dialog.set_adapter(self.adapter_path() or None)
        dialog.set_kind(self.merge_check.isChecked())
        dialog.type_combo.set_qtype(self._qtype())
        dialog.modelfile_check.setChecked(self.modelfile_check.isChecked())
        dialog.open()
        return dialog

    def _dialog_verified(self, report) -> None:
        self._show_verified(report)

    # --- export ----------------------------------------------------------------------------------
    def export(self) -> None:
        """Check, write and verify with the page's settings, in a worker; sig_exported(path) when written."""
        req = self.request()
        if not req.source or not req.out:
            self._show("Choose the adapter (train one, or File…) and where to write.", error=True)
            return
        if not req.base:
            self._show("Open the base model on the Model page first: the export is checked against it.", True)
            return
        if not self._check_fit():
            problems = self.fit_problems(req.source)
            self._show(f"Export failed: {fit_message(req.source, self.info, problems)}", error=True)
            return
        template = self.info.template if self.info is not None and self.info.path == req.base else None
        run = self.adapter_choice.current_run()
        dataset = run.dataset if run is not None and os.path.isfile(run.dataset or "") else None

        def work(session, job):
            report = check_export(req)
            if not report.ok or report.adapter is None:
                raise ExportError(report.summary())
            path = write_export(req, report.adapter)
            prompts = run_prompts(dataset)  # the run's own prompts, besides the generic ones
            if session is not None and os.path.samefile(session.path, req.base):
                verified = session.verify_export(req, report.adapter, path, prompts=prompts)
            else:
                verified = verify_export(req, report.adapter, path, template=template, prompts=prompts)
            verified = quarantine(verified)  # a file that failed is renamed *.failed.gguf
            modelfile = export_modelfile(req) if verified.ok else None
            return path, verified, modelfile, report.notes

        self.export_button.setEnabled(False)
        self.result.clear()
        self._show("Checking, exporting and verifying…")
        self.job = self.engine.submit("exporting", work, on_done=self._done, on_error=self._failed,
                                      needs_session=False)  # fmt: skip

    def _done(self, result) -> None:
        path, verified, modelfile, notes = result
        self.export_button.setEnabled(True)
        self._show_verified(verified)
        if verified.ok and self.modelfile_check.isChecked():
            self.result_label.setText(f"{self.result_label.text()} {modelfile_outcome(modelfile, notes)}")
        if verified.ok:
            self.sig_exported.emit(path)
        else:
            self.sig_export_failed.emit(verified.failed_path or path)

    def _show_verified(self, verified) -> None:
        """The verdict, and what to do with the file: run it when it passed; when it failed, where it
        was put aside (never a command that runs it)."""
        path = verified.path
        if verified.ok:
            size = os.path.getsize(path) if os.path.exists(path) else 0
            kind = "merged model" if verified.merge else "adapter"
            self._show(f"Wrote {path} ({kind}, {human_bytes(size)}); the file reloads. {verified.verdict()}")
            self.result.set_result(path, self.project.model_path, bool(verified.merge))
        else:
            self._show(f"The export failed its check: {verified.verdict()}", error=True)
            self.result.set_failed(verified.failed_path or path)

    def _failed(self, message: str) -> None:
        self.export_button.setEnabled(True)
        self._show(f"Export failed: {message}", error=True)

    def _show(self, text: str, error: bool = False) -> None:
        red = "#ff8a80" if is_dark(self.palette()) else "#b03a2e"
        self.result_label.setStyleSheet(f"QLabel {{ color: {red}; }}" if error else "")
        self.result_label.setText(text)

    def _project_changed(self, changed: set[str]) -> None:
        if changed & RUNS_MOVED:
            self.refresh_runs()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self.refresh_runs()


__all__ = ["ExportPage"]
