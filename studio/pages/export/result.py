"""What to do with a file once it is exported: open its folder, copy its path, run it in llama.cpp.

`ExportResultWidget.set_result(path, base, merged)` shows the file, an "Open folder" and a "Copy
path" button, and a ready command line (copyable): `llama-cli -m MODEL --lora ADAPTER` for an
adapter, `llama-cli -m MERGED` for a merged model. `llama_cli_command` builds that command with
the paths quoted for a shell. The Export page and the export dialog both show one.
"""

from __future__ import annotations

import os
import shlex

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from ...widgets.buttons import action_button
from ...widgets.wrapping_label import wrapping_label


def llama_cli_command(path: str, base: str | None, merged: bool) -> str:
    """The llama.cpp command that runs the export: the merged model alone, or the base with --lora."""
    if merged or not base:
        return f"llama-cli -m {shlex.quote(path)}"
    return f"llama-cli -m {shlex.quote(base)} --lora {shlex.quote(path)}"


class ExportResultWidget(QGroupBox):
    """The written file and what to do with it (see the module docstring); hidden until set."""

    sig_copied = Signal(str)  # the text put on the clipboard

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Written", parent)
        self.path = ""
        self.open_url = QDesktopServices.openUrl  # replaced in tests
        self.file_label = wrapping_label(interaction=Qt.TextSelectableByMouse)
        self.open_button = action_button(
            "Open folder", self.open_folder, "Show the file's folder in the file browser"
        )
        self.copy_path_button = action_button(
            "Copy path", self.copy_path, "Put the file's full path on the clipboard"
        )
        self.command_edit = QLineEdit()
        self.command_edit.setReadOnly(True)
        self.command_edit.setToolTip(
            "Run it with llama.cpp: llama-cli loads the base model and applies the adapter with --lora (a "
            'merged model needs no --lora). Add your own options (-p "prompt", -cnv for a chat).'
        )
        font = self.command_edit.font()
        font.setFamily("monospace")
        self.command_edit.setFont(font)
        self.copy_command_button = action_button(
            "Copy command", self.copy_command, "Put the llama-cli command on the clipboard"
        )
        self.hint = hint = QLabel("Run it with llama.cpp:")
        hint.setStyleSheet(f"QLabel {{ color: {self.palette().color(QPalette.PlaceholderText).name()}; }}")
        files = QHBoxLayout()
        files.addWidget(self.file_label, 1)
        files.addWidget(self.open_button)
        files.addWidget(self.copy_path_button)
        command = QHBoxLayout()
        command.addWidget(self.command_edit, 1)
        command.addWidget(self.copy_command_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.setSpacing(4)
        layout.addLayout(files)
        layout.addWidget(hint)
        layout.addLayout(command)
        self.hide()

    def set_result(self, path: str, base: str | None, merged: bool, summary: str = "") -> None:
        """Show a written file: `summary` is a line about it (kind, size, verification)."""
        self.path = path
        self.setTitle("Written")
        for w in (self.hint, self.command_edit, self.copy_command_button):
            w.show()
        self.file_label.setText(f"<b>{os.path.basename(path)}</b> in {os.path.dirname(path)}"
                                + (f"<br>{summary}" if summary else ""))  # fmt: skip
        self.file_label.setToolTip(path)
        self.command_edit.setText(llama_cli_command(path, base, merged))
        self.command_edit.setCursorPosition(0)
        self.show()

    def set_failed(self, path: str) -> None:
        """A file that failed its check: where it was put aside, and no command that runs it."""
        self.path = path
        self.setTitle("Failed its check: not usable")
        self.file_label.setText(
            f"<b>{os.path.basename(path)}</b> in {os.path.dirname(path)}<br>Kept for a bug report under a "
            "name nothing loads by mistake; export again with the default type."
        )
        self.file_label.setToolTip(path)
        self.command_edit.clear()
        for w in (self.hint, self.command_edit, self.copy_command_button):
            w.hide()
        self.show()

    def clear(self) -> None:
        self.path = ""
        self.hide()

    def command(self) -> str:
        return self.command_edit.text()

    def open_folder(self) -> None:
        if self.path:
            self.open_url(QUrl.fromLocalFile(os.path.dirname(os.path.abspath(self.path))))

    def copy_path(self) -> None:
        self._copy(self.path)

    def copy_command(self) -> None:
        self._copy(self.command())

    def _copy(self, text: str) -> None:
        if text:
            QGuiApplication.clipboard().setText(text)
            self.sig_copied.emit(text)


__all__ = ["ExportResultWidget", "llama_cli_command"]
