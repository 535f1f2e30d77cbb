"""The Model page: open a GGUF file and see what it is (architecture, sizes, tensor kinds, tokenizer).

Reads the file with `engine.summarize`, which validates it without loading weights, so opening a
multi-gigabyte model is instant. Errors are shown on the page with what to do next.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import EngineError, ModelSummary, summarize


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return str(n)


class ModelPage(QWidget):
    """Shows one model's summary; emits sig_model_opened(path) when a file opens successfully."""

    sig_model_opened = Signal(str)
    sig_error = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.summary: ModelSummary | None = None
        self.setAcceptDrops(True)

        self.open_button = QPushButton("Open model…")
        self.open_button.setToolTip(
            "Open a .gguf model file (Ctrl+O). You can also drop a file on this page."
        )
        self.open_button.clicked.connect(self.choose_file)
        self.path_label = QLabel("No model open. Open a .gguf file or drop one here.")
        self.path_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("QLabel { color: #c0392b; font-weight: bold; }")
        self.error_label.hide()

        self.facts = QFormLayout()
        self.fact_labels: dict[str, QLabel] = {}
        for key in (
            "Architecture",
            "Parameters",
            "Layers",
            "Attention",
            "Feed-forward",
            "Context",
            "Tokenizer",
            "Chat template",
            "File",
        ):
            label = QLabel("–")
            label.setTextInteractionFlags(Qt.TextSelectableByMouse)
            self.fact_labels[key] = label
            self.facts.addRow(f"{key}:", label)

        self.kinds = QTableWidget(0, 5)
        self.kinds.setHorizontalHeaderLabels(["Tensor kind", "Count", "Shape", "Types", "Size"])
        self.kinds.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.kinds.verticalHeader().hide()
        self.kinds.setEditTriggers(QTableWidget.NoEditTriggers)
        self.kinds.setSortingEnabled(True)

        top = QHBoxLayout()
        top.addWidget(self.open_button)
        top.addWidget(self.path_label, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.error_label)
        layout.addLayout(self.facts)
        layout.addWidget(self.kinds, 1)

    # --- opening ---------------------------------------------------------------------------------
    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open GGUF model", "", "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.open_path(path)

    def open_path(self, path: str | Path) -> bool:
        path = str(path)
        try:
            summary = summarize(path)
        except EngineError as exc:
            self.show_error(
                f"{exc}\n\nChoose another file: Tune Studio reads GGUF models of the architectures "
                "llama (Mixtral too), qwen2, qwen3, qwen2moe, qwen3moe and olmoe."
            )
            return False
        self.error_label.hide()
        self.summary = summary
        self._fill(summary)
        self.sig_model_opened.emit(path)
        return True

    def show_error(self, message: str) -> None:
        self.error_label.setText(message)
        self.error_label.show()
        self.sig_error.emit(message)

    def _fill(self, s: ModelSummary) -> None:
        c = s.config
        self.path_label.setText(s.path)
        f = self.fact_labels
        f["Architecture"].setText(f"{c.arch}" + (f"  ({c.name})" if c.name else ""))
        f["Parameters"].setText(f"{human_count(s.n_params)} in {s.n_tensors} tensors, mostly {s.file_type}")
        f["Layers"].setText(f"{c.L} layers, {c.C} wide")
        f["Attention"].setText(
            f"{c.NH} query heads, {c.NKV} key/value heads, head size {c.HS}, RoPE {c.rope}"
            + (f", q/k norm ({c.qk_norm})" if c.qk_norm else "")
        )
        if c.is_moe:
            ffn = f"{c.E} experts, {c.K} per token, width {c.F_exp}" + (
                f", shared expert {c.F_shexp}" if c.F_shexp else ""
            )
        else:
            ffn = f"dense SwiGLU, width {c.F}"
        f["Feed-forward"].setText(ffn)
        f["Context"].setText(f"{c.n_ctx_train} tokens")
        pre = f", {s.tokenizer_pre}" if s.tokenizer_pre else ""
        f["Tokenizer"].setText(f"{s.tokenizer_model}{pre}, {s.vocab_size} tokens")
        f["Chat template"].setText("from the model" if s.has_chat_template else "none (ChatML will be used)")
        f["File"].setText(human_bytes(s.file_bytes))
        self.kinds.setSortingEnabled(False)
        self.kinds.setRowCount(len(s.kinds))
        for row, k in enumerate(sorted(s.kinds, key=lambda k: k.kind)):
            types = ", ".join(sorted(k.types))
            values = [k.kind, k.count, " × ".join(str(d) for d in k.shape), types, human_bytes(k.n_bytes)]
            for col, v in enumerate(values):
                item = QTableWidgetItem()
                item.setData(Qt.DisplayRole, v)
                self.kinds.setItem(row, col, item)
        self.kinds.setSortingEnabled(True)
        self.kinds.sortItems(0, Qt.AscendingOrder)
        self.kinds.resizeColumnsToContents()
        self.kinds.resizeRowsToContents()

    # --- drag and drop ---------------------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt override
        urls = event.mimeData().urls()
        if urls and urls[0].toLocalFile().lower().endswith(".gguf"):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt override
        urls = event.mimeData().urls()
        if urls:
            self.open_path(urls[0].toLocalFile())
