"""The Model page: open a GGUF file and see what it is; choose the device; estimate training memory.

The model opens in the engine worker (header, tokenizer, chat template, the weight store: no
weights are read), off the UI thread, with a busy state; the session it opens serves every page.
Errors are shown on the page with what to do next. The memory
estimate follows the project's targets and training settings live.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import (
    EngineError,
    available_devices,
    estimate_memory,
    human_bytes,
    human_count,
    lora_param_count,
    select_full,
    select_targets,
    supported_architectures,
)

from ..project import ModelInfo, Project, ProjectError
from ..widgets.banner import MessageBar
from ..widgets.buttons import action_button
from ..widgets.page_layout import splitter
from ..worker import Engine


class ModelPage(QWidget):
    """Shows the open model; emits sig_model_opened(info) when a file opens successfully."""

    sig_model_opened = Signal(object)  # ModelInfo
    sig_error = Signal(str)

    def __init__(self, project: Project, engine: Engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.project = project
        self.engine = engine
        self.info: ModelInfo | None = None
        self.opening: str | None = None  # a model being opened in the worker
        self.setAcceptDrops(True)

        self.open_button = action_button(
            "Open model…",
            self.choose_file,
            "Open a .gguf model file (Ctrl+O). You can also drop a file on the window.",
        )
        self.path_label = QLabel("No model open. Open a .gguf file or drop one here.")
        self.path_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.error_label = MessageBar()  # readable on light and dark palettes; hidden until an error

        facts_box = QGroupBox("Model")
        self.facts = QFormLayout(facts_box)
        self.fact_labels: dict[str, QLabel] = {}
        for key in (
            "Architecture",
            "Parameters",
            "Layers",
            "Attention",
            "Feed-forward",
            "Also",
            "Context",
            "Tokenizer",
            "Chat template",
            "File",
        ):
            label = QLabel("–")
            label.setTextInteractionFlags(Qt.TextSelectableByMouse)
            label.setWordWrap(True)
            self.fact_labels[key] = label
            self.facts.addRow(f"{key}:", label)

        run_box = QGroupBox("Training on this machine")
        run = QFormLayout(run_box)
        self.device_combo = QComboBox()
        self.device_combo.setToolTip(
            "Where training and generation run. CPU uses NumPy; a CUDA GPU needs CuPy "
            "(pip install -e '.[cuda]'). Default: CPU."
        )
        for i, d in enumerate(available_devices()):
            if d.usable:
                self.device_combo.addItem(d.label if d.name == "cpu" else f"{d.name}: {d.label}", d.name)
            else:
                self.device_combo.addItem(f"CUDA GPU ({d.name}) — not available: {d.reason}", None)
                self.device_combo.model().item(i).setEnabled(False)
                self.device_combo.setItemData(i, d.reason, Qt.ToolTipRole)
        # a GPU that is not available says why in a long item: the box itself stays narrow
        self.device_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.device_combo.setMinimumContentsLength(24)
        self.device_combo.currentIndexChanged.connect(self._device_changed)
        run.addRow("Device:", self.device_combo)
        self.memory_label = QLabel("–")
        self.memory_label.setWordWrap(True)
        self.memory_label.setToolTip(
            "Estimated peak memory of a training run with the current targets and settings: the model "
            "file (weights stay quantized), the cache of dequantized weights (Train page: cache budget), "
            "trainable parameters with their gradients and Adam moments, activations and the output head."
        )
        run.addRow("Memory estimate:", self.memory_label)

        self.kinds = QTableWidget(0, 5)
        self.kinds.setHorizontalHeaderLabels(["Tensor kind", "Count", "Shape", "Types", "Size"])
        self.kinds.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.kinds.verticalHeader().hide()
        self.kinds.setEditTriggers(QTableWidget.NoEditTriggers)
        self.kinds.setSortingEnabled(True)
        self.kinds.setAlternatingRowColors(True)

        self.recent_list = QListWidget()
        self.recent_list.setToolTip("Recently opened models: double-click to open")
        self.recent_list.itemActivated.connect(lambda item: self.open_path(item.data(Qt.UserRole)))
        recent_box = QGroupBox("Recent models")
        QVBoxLayout(recent_box).addWidget(self.recent_list)

        top = QHBoxLayout()
        top.addWidget(self.open_button)
        top.addWidget(self.path_label, 1)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(facts_box)
        left_layout.addWidget(run_box)
        left_layout.addStretch(1)
        # the recent models go under the tensor kinds, where there is room: the left column's height
        # is the facts and the estimate, so the page fits a 640-pixel window with an error shown
        self.recent_list.setMinimumHeight(3 * self.recent_list.fontMetrics().height())
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.kinds, 3)
        right_layout.addWidget(recent_box, 1)
        split = splitter(Qt.Horizontal, (left, right), stretch=(0, 1), sizes=(420, 580), collapsible=True)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.error_label)
        layout.addWidget(split, 1)
        self.project.subscribe(self._project_changed)

    # --- opening ---------------------------------------------------------------------------------
    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open GGUF model", "", "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.open_path(path)

    def open_path(self, path: str | Path) -> bool:
        """Open a model in the engine worker (the header, the tokenizer and the weight store load
        there, off the UI thread); sig_model_opened(info) or sig_error(message) follows. False when
        it cannot even start (no such file)."""
        path = str(path)
        if not os.path.isfile(path):
            self._open_failed(path, f"{path}: no such file")
            return False
        self.opening = path
        self.open_button.setEnabled(False)
        self.path_label.setText(f"Opening {Path(path).name}…")
        if self.project.model_path != path:  # jobs submitted from now on use it (queued after this one)
            self.project.update(model_path=path)
        template_file = self.project.template_file

        def describe(session) -> ModelInfo:  # on the worker thread: only these facts cross over
            try:
                return ModelInfo.from_session(session, template_file)
            except ProjectError as exc:
                raise EngineError(str(exc)) from exc

        self.engine.open_model(
            path,
            device=self.project.device,
            describe=describe,
            on_done=lambda info: self._opened(path, info),
            on_error=lambda message: self._open_failed(path, message),
        )
        return True

    def _opened(self, path: str, info: ModelInfo) -> None:
        self.opening = None
        self.open_button.setEnabled(True)
        self.error_label.hide()
        self.info = info
        self._fill(info)
        if self.project.model_path != path:
            self.project.update(model_path=path)
        self._update_estimate()
        self.sig_model_opened.emit(info)

    def _open_failed(self, path: str, message: str) -> None:
        self.opening = None
        self.open_button.setEnabled(True)
        if self.project.model_path == path and self.info is not None and self.info.path != path:
            self.project.update(model_path=self.info.path)  # the model that is still open
        if self.info is not None:
            self.path_label.setText(self.info.path)
        else:
            self.path_label.setText("No model open. Open a .gguf file or drop one here.")
        self.show_error(
            f"{message}\n\nChoose another file: Tune Studio reads GGUF models of the architectures "
            f"{', '.join(supported_architectures())} (Mixtral is llama with experts)."
        )

    def clear(self) -> None:
        """No model open (a new project): the facts, the tensor kinds and the estimate are emptied."""
        self.info = None
        self.opening = None
        self.open_button.setEnabled(True)
        self.error_label.hide()
        self.path_label.setText("No model open. Open a .gguf file or drop one here.")
        for label in self.fact_labels.values():
            label.setText("–")
        self.kinds.setRowCount(0)
        self.memory_label.setText("–")

    def show_error(self, message: str) -> None:
        self.error_label.show_message("error", message)
        self.sig_error.emit(message)

    def set_recent(self, paths: list[str]) -> None:
        self.recent_list.clear()
        for p in paths:
            item = QListWidgetItem(Path(p).name)
            item.setToolTip(p)
            item.setData(Qt.UserRole, p)
            self.recent_list.addItem(item)

    def _device_changed(self) -> None:
        device = self.device_combo.currentData()
        if device:
            self.project.update(device=device)

    def _project_changed(self, changed: set[str]) -> None:
        if "config" in changed:
            self._update_estimate()
        if "device" in changed:
            i = self.device_combo.findData(self.project.device)
            if i >= 0:
                self.device_combo.setCurrentIndex(i)

    def _update_estimate(self) -> None:
        info = self.info
        if info is None:
            self.memory_label.setText("–")
            return
        cfg = self.project.config
        c = info.summary.config
        try:
            names = (
                select_targets(info.tensors, cfg.targets, c.L)
                if cfg.targets.preset != "none" or cfg.targets.patterns
                else []
            )
            full = select_full(info.tensors, cfg.full, c.L) if cfg.full else []
        except EngineError as exc:
            self.memory_label.setText(f"– ({exc})")
            return
        n_train = lora_param_count(info.tensors, names, cfg.rank) + sum(
            info.tensors[n].n_elements for n in full
        )
        est = estimate_memory(c, info.tensors, n_train, cfg, lora_targets=names)
        text = (
            f"{est.describe(cfg)}; {human_count(n_train)} trainable parameters in {len(names)} "
            "adapted tensors"
        )
        if not est.fits():
            text += f". Does not fit: {est.advice(cfg)}"
        self.memory_label.setText(text)

    def _fill(self, info: ModelInfo) -> None:
        s = info.summary
        c = s.config
        self.path_label.setText(s.path)
        f = self.fact_labels
        f["Architecture"].setText(f"{c.arch}" + (f"  ({c.name})" if c.name else ""))
        f["Parameters"].setText(f"{human_count(s.n_params)} in {s.n_tensors} tensors, mostly {s.file_type}")
        f["Layers"].setText(f"{c.L} layers, {c.C} wide")
        # the engine's words for the layout (MLA ranks, sinks, sliding windows, dense-then-MoE
        # layers, shared experts), as `tune-engine inspect` prints them
        f["Attention"].setText(s.attention_text)
        f["Feed-forward"].setText(s.ffn_text)
        f["Also"].setText("\n".join(s.features) or "–")
        self.facts.setRowVisible(f["Also"], bool(s.features))
        f["Context"].setText(f"{c.n_ctx_train} tokens")
        pre = f", {s.tokenizer_pre}" if s.tokenizer_pre else ""
        f["Tokenizer"].setText(f"{s.tokenizer_model}{pre}, {s.vocab_size} tokens")
        if self.project.template_file:
            tpl = f"from {Path(self.project.template_file).name}"
        else:
            # the default the engine chose: Gemma's turns for a Gemma vocabulary, else ChatML
            default = f"none in the file (the {info.template.name} is used)"
            tpl = "from the model" if s.has_chat_template else default
        f["Chat template"].setText(tpl)
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
