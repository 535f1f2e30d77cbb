"""The Targets page: choose which weight tensors get LoRA adapters, at what rank and alpha.

A layers × tensor-kinds grid and a tree of the real GGUF tensor names, both views of one
`TargetSelection`; presets (attention, MLP, experts, router, all linear, none) with a layer range;
rank and alpha; an optional "train in full" list; and a live summary of what the selection costs
(trainable parameters, adapter size, share of the model, training memory), all from tensor shapes,
no weights loaded.

The page keeps `project.config.targets` equal to what it shows: a preset with a layer range is
stored as TargetSpec(preset, layers); any edit of cells or tree items as TargetSpec("none",
patterns=explicit names). A project's spec that does not fit the model is shown as an inline error
and left as it is until the person chooses something else. When the person opens another model, the
targets are carried over: tensors (and train-in-full patterns, and layers of the range) that exist in
the new model are kept, the others dropped, and a message on the page says which.

Colours follow the palette (light or dark): hints use the placeholder-text role, errors and warnings
a red and an amber readable on either.

One module (about 800 lines) on purpose: the views are studio.pages.targets.views and the
selection's rules studio.pages.targets.selection; what stays are the page's own controls (presets,
layers, rank and alpha, train in full, the summary), each both editing the project and showing it,
and they read best beside the handlers they call.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QItemSelectionModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSpinBox,
    QStackedWidget,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from engine import (
    PRESETS,
    ModelError,
    TargetSpec,
    human_bytes,
    human_count,
    left_out,
    parse_layers,
    select_full,
    select_targets,
)

from ...project import ModelInfo, Project
from ...widgets.banner import MessageBar
from ...widgets.page_layout import splitter
from ...widgets.spinbox import spin_box
from ...widgets.theme import is_dark
from .census import CensusPanel
from .selection import SelectionStats, TargetSelection, kind_help
from .views import (
    GROUP_COLORS,
    GROUP_NAMES,
    TargetGridModel,
    TargetGridView,
    TargetTreeModel,
)

PRESET_BUTTONS: tuple[tuple[str, str, str], ...] = (
    ("attention", "&Attention", "attn_q, attn_k, attn_v, attn_output in every layer"),
    ("mlp", "&MLP", "ffn_gate, ffn_up, ffn_down and the shared expert's, in every layer"),
    ("experts", "&Experts", "the routed expert stacks ffn_{gate,up,down}_exps: one A/B pair per expert"),
    ("router", "&Router", "the router ffn_gate_inp (expert gating logits)"),
    ("all", "All &linear", "every 2-D/3-D weight inside the layers (attention, MLP, experts, router); "
     "not token_embd or output"),
    ("none", "&None", "nothing: clears the LoRA selection"),
)  # fmt: skip
PRESET_LABELS = {key: text.replace("&", "") for key, text, _ in PRESET_BUTTONS}

# (light, dark) palettes: each readable on its background (contrast 4.5:1 or more)
ERROR_COLOURS = ("#b03a2e", "#ff8a80")
WARN_COLOURS = ("#8a4b00", "#ffcc80")
BAD_EDIT_COLOURS = (("#c0392b", "#fdecea"), ("#e57373", "#4a1f1f"))  # border, background
INDICATOR_STYLE_DARK = (
    "QAbstractItemView::indicator:unchecked { border: 1px solid #8a8d91; border-radius: 2px;"
    " background: palette(base); }"
)
MAX_LISTED = 6  # dropped tensors named in the carry-over message


def error_style(dark: bool = False) -> str:
    return f"QLabel {{ color: {ERROR_COLOURS[dark]}; font-weight: bold; }}"


def warn_style(dark: bool = False) -> str:
    return f"QLabel {{ color: {WARN_COLOURS[dark]}; }}"


def bad_edit_style(dark: bool = False) -> str:
    border, background = BAD_EDIT_COLOURS[dark]
    return f"QLineEdit {{ border: 1px solid {border}; background: {background}; }}"


def listed(names: list[str], limit: int = MAX_LISTED) -> str:
    """ "a, b, c and 4 more" """
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _layer_text(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (the layer-range syntax)."""
    parts: list[str] = []
    for x in layers:
        if parts and "-" in parts[-1] and int(parts[-1].split("-")[1]) == x - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{x}"
        elif parts and "-" not in parts[-1] and int(parts[-1]) == x - 1:
            parts[-1] = f"{parts[-1]}-{x}"
        else:
            parts.append(str(x))
    return ",".join(parts)


def is_custom(spec: TargetSpec) -> bool:
    """Whether a spec is the explicit-names form the page writes for cell and tree edits."""
    return spec.preset == "none" and bool(spec.patterns)


class TargetsPage(QWidget):
    """Pick LoRA targets for the open model; writes project.config.targets / rank / alpha / full.

    sig_selection_changed(list) carries the selected tensor names (file order) after every change.
    """

    sig_selection_changed = Signal(list)

    def __init__(self, project: Project, engine=None, parent: QWidget | None = None):
        """engine: the app's engine worker (studio.worker.Engine), which counts the routing census of a
        MoE model; None: no census."""
        super().__init__(parent)
        self.project = project
        self.engine = engine
        self.info: ModelInfo | None = None
        self.selection: TargetSelection | None = None
        self.grid_model: TargetGridModel | None = None
        self.tree_model: TargetTreeModel | None = None
        self.stats: SelectionStats | None = None
        self._spec: TargetSpec | None = None  # the spec shown; equals project.config.targets when in step
        self._storing = False  # writing our own spec to the project

        self._dark = is_dark(self.palette())
        self._project_opened = False  # a project was just opened: its model's targets are its own
        self.placeholder = QLabel("Open a model to choose targets")
        self.placeholder.setAlignment(Qt.AlignCenter)
        self.placeholder.setStyleSheet("QLabel { font-size: 14pt; }")
        self.placeholder.setForegroundRole(QPalette.PlaceholderText)

        hint = QLabel("Open a .gguf file on the Model page (Ctrl+O); its tensors appear here.")
        hint.setAlignment(Qt.AlignCenter)
        hint.setWordWrap(True)
        hint.setForegroundRole(QPalette.PlaceholderText)
        self.hint_label = hint
        empty = QWidget()
        el = QVBoxLayout(empty)
        el.addStretch(1)
        el.addWidget(self.placeholder)
        el.addWidget(hint)
        el.addStretch(1)

        self.stack = QStackedWidget()
        self.stack.addWidget(empty)
        self.empty_panel = empty
        self.stack.addWidget(self._build_content())
        self._style_indicators()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.stack)

        self._sync_hyperparameters()
        listener = self._on_project
        project.subscribe(listener)
        self.destroyed.connect(lambda *_: project.unsubscribe(listener))

    # --- building ---------------------------------------------------------------------------
    def _build_content(self) -> QWidget:
        content = QWidget()
        outer = QVBoxLayout(content)
        outer.setContentsMargins(8, 8, 8, 8)
        outer.setSpacing(6)

        # two rows, so that the page fits a 1024-pixel window: presets, then layers, rank and alpha
        bar = QHBoxLayout()
        bar.setSpacing(4)
        bar.addWidget(QLabel("Presets:"))
        self.preset_buttons: dict[str, QPushButton] = {}
        for key, text, what in PRESET_BUTTONS:
            button = QPushButton(text)
            button.setCheckable(True)
            button.setAutoDefault(False)
            button.setToolTip(
                f"Select {what}, within the layer range (Alt+{text[text.index('&') + 1]}). "
                "The default target is Attention."
            )
            button.setProperty("tip", button.toolTip())
            button.clicked.connect(lambda _=False, k=key: self.apply_preset(k))
            bar.addWidget(button)
            self.preset_buttons[key] = button
        bar.addStretch(1)
        outer.addLayout(bar)
        bar = QHBoxLayout()
        bar.setSpacing(4)
        layers_label = QLabel("La&yers:")
        self.layer_edit = QLineEdit()
        self.layer_edit.setPlaceholderText("all layers")
        self.layer_edit.setMaximumWidth(110)
        self.layer_edit.setToolTip(
            "Which layers the presets apply to, e.g. 0-11 or 0-3,8 (default: empty = every layer).\n"
            "Enter applies it: a preset is re-applied on these layers; a custom selection drops the\n"
            "tensors outside them. Global tensors (token_embd, output) are not affected."
        )
        layers_label.setBuddy(self.layer_edit)
        self.layer_edit.textChanged.connect(lambda text: self._check_layer_text(text, quiet=True))
        self.layer_edit.editingFinished.connect(lambda: self.set_layer_range(self.layer_edit.text()))
        bar.addWidget(layers_label)
        bar.addWidget(self.layer_edit)
        bar.addSpacing(12)

        rank_label = QLabel("Ran&k:")
        self.rank_spin = spin_box(QSpinBox, 1, 256, 16)
        self.rank_spin.setToolTip(
            "LoRA rank r: the inner width of each adapter (A is r × n_in, B is n_out × r). Higher ranks\n"
            "learn more and cost more parameters; the adapter's output is scaled by alpha / r. Default 16."
        )
        rank_label.setBuddy(self.rank_spin)
        self.rank_spin.valueChanged.connect(lambda v: self.project.update_config(rank=int(v)))
        alpha_label = QLabel("Al&pha:")
        self.alpha_spin = spin_box(QDoubleSpinBox, 0.0, 4096.0, 32.0, decimals=1)
        self.alpha_spin.setToolTip(
            "LoRA alpha: the adapter's output is multiplied by alpha / r, so with alpha fixed, changing\n"
            "the rank keeps the update's size comparable. 0 means a scale of 1 (as llama.cpp). Default 32."
        )
        alpha_label.setBuddy(self.alpha_spin)
        self.alpha_spin.valueChanged.connect(lambda v: self.project.update_config(alpha=float(v)))
        self.scale_label = QLabel()
        self.scale_label.setToolTip("The adapter's scale alpha / r, applied to (x Aᵀ) Bᵀ.")
        for w in (rank_label, self.rank_spin, alpha_label, self.alpha_spin, self.scale_label):
            bar.addWidget(w)
        bar.addStretch(1)
        outer.addLayout(bar)

        self.message = MessageBar()  # what a change of model kept and dropped
        outer.addWidget(self.message)
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(error_style(self._dark))
        self.error_label.hide()
        outer.addWidget(self.error_label)
        self.selection_label = QLabel()
        self.selection_label.setToolTip("How the selection is saved in the project (targets).")
        outer.addWidget(self.selection_label)

        self.grid_view = TargetGridView()
        self.grid_view.setToolTip("")
        self.grid_view.horizontalHeader().sectionClicked.connect(self._column_clicked)
        self.grid_view.verticalHeader().sectionClicked.connect(self._row_clicked)
        self.grid_view.sig_cell_pressed.connect(self._grid_cell_pressed)
        legend = QLabel()
        legend.setWordWrap(True)
        legend.setForegroundRole(QPalette.PlaceholderText)  # readable grey on light and dark
        self.legend_label = legend
        self.tree_view = QTreeView()
        self.tree_view.setUniformRowHeights(True)
        self.tree_view.setIndentation(14)
        self.tree_view.header().setDefaultSectionSize(40)  # the last (Note) column takes what is left
        self.tree_view.setAlternatingRowColors(True)
        self.tree_view.setSelectionMode(QAbstractItemView.SingleSelection)
        self.tree_view.setToolTip("")
        self.tree_view.setEditTriggers(QAbstractItemView.NoEditTriggers)

        summary_box = QGroupBox("Summary")
        summary_box.setToolTip("What the selection costs, from tensor shapes alone (no weights loaded).")
        form = QFormLayout(summary_box)
        form.setContentsMargins(8, 6, 8, 6)
        form.setVerticalSpacing(3)
        self.summary_labels: dict[str, QLabel] = {}
        self._summary_rows: dict[str, QLabel] = {}
        for key, tip in (
            ("Adapted tensors", "Tensors that get a LoRA pair (A, B)."),
            ("Trainable parameters", "Elements of all A and B factors at this rank (plus full tensors)."),
            ("Expert parameters", "The part of the LoRA parameters on routed expert stacks."),
            ("Share of model", "Trainable parameters as a share of the model's parameters."),
            ("Adapter file (F32)", "Approximate size of the adapter GGUF in F32: 4 bytes per parameter "
             "plus a small header."),
            ("Train in full", "Tensors trained as a whole (listed on the right), not as LoRA."),
            ("Memory (estimate)", "Peak training memory: the model file (weights stay quantized), the "
             "cache of dequantized weights, trainable state (parameters, gradients, two Adam moments), "
             "activations for the batch size and context on the Train page, and the output head. An "
             "estimate, not a measurement."),
        ):  # fmt: skip
            value = QLabel("–")
            value.setTextInteractionFlags(Qt.TextSelectableByMouse)
            value.setToolTip(tip)
            name = QLabel(key + ":")
            name.setToolTip(tip)
            form.addRow(name, value)
            self.summary_labels[key] = value
            self._summary_rows[key] = name

        full_box = QGroupBox("Train in full (not LoRA)")
        full_box.setToolTip(
            "Small tensors that cannot take LoRA (norms, biases, gates) or the router can be trained as a\n"
            "whole instead. They are saved into a full model on export, not into the LoRA adapter.\n"
            "Default: none."
        )
        fl = QVBoxLayout(full_box)
        fl.setContentsMargins(6, 6, 6, 6)
        self.full_list = QListWidget()
        self.full_list.setToolTip(full_box.toolTip())
        self.full_list.itemChanged.connect(self._full_changed)
        fl.addWidget(self.full_list)

        # left: grid, legend, summary; right: tree over "train in full"
        grid_panel = QWidget()
        grid_panel.setMinimumWidth(430)
        gl = QVBoxLayout(grid_panel)
        gl.setContentsMargins(0, 0, 0, 0)
        gl.setSpacing(4)
        gl.addWidget(self.grid_view, 1)
        gl.addWidget(legend)
        gl.addWidget(summary_box)
        gl.addStretch(0)

        self.census_panel = CensusPanel(self.project, self.engine)  # MoE models only
        self.census_panel.hide()
        self.census_panel.sig_census.connect(lambda _c: self._update_summary())
        right = splitter(Qt.Vertical, (self.tree_view, full_box, self.census_panel), stretch=(4, 1, 4))
        self.right_splitter = right

        self.splitter = splitter(Qt.Horizontal, (grid_panel, right), stretch=(0, 1))
        outer.addWidget(self.splitter, 1)
        return content

    # --- public API -------------------------------------------------------------------------
    def set_model_info(self, info: ModelInfo | None) -> None:
        """Show the targets of a newly opened model (None: no model, the page says so). When it
        replaces another model, the targets that exist in the new one are kept and the page says
        which were dropped; a project just opened keeps its targets as they are saved."""
        previous = self.info
        carry = (
            previous is not None
            and info is not None
            and previous.path != info.path
            and not self._project_opened
        )
        self._project_opened = False
        self.message.hide()
        self.info = info
        self.grid_view.setModel(None)
        self.tree_view.setModel(None)
        for model in (self.grid_model, self.tree_model):
            if model is not None:
                model.deleteLater()
        self.selection = self.grid_model = self.tree_model = None
        self.stats = None
        if info is None:
            self.full_list.clear()
            self._show_error("")
            self.stack.setCurrentWidget(self.empty_panel)
            return
        self.selection = TargetSelection(info.tensors, info.summary.config.L)
        self.selection.subscribe(self._on_selection)
        rank = self.project.config.rank
        self.grid_model = TargetGridModel(self.selection, rank, self)
        self.tree_model = TargetTreeModel(self.selection, rank, self)
        self.grid_view.setModel(self.grid_model)
        self.grid_view.fit_columns()
        self.tree_view.setModel(self.tree_model)
        self.tree_view.selectionModel().currentChanged.connect(self._tree_current_changed)
        self.tree_view.expandAll()
        header = self.tree_view.header()
        header.setSectionResizeMode(QHeaderView.Interactive)
        header.setStretchLastSection(True)
        widths = self.tree_model.column_widths(self.tree_view.fontMetrics(), self.tree_view.indentation())
        for col, width in enumerate(widths):
            self.tree_view.setColumnWidth(col, width)
        grid_width = self.grid_view.content_width()
        self.grid_view.setMinimumWidth(min(grid_width, 700))
        self.grid_view.setMaximumHeight(self.grid_view.content_height())
        self.splitter.setSizes([max(grid_width, 320), max(self.width() - grid_width, 400)])
        for key, button in self.preset_buttons.items():
            ok = self.selection.has_preset(key)
            button.setEnabled(ok)
            missing = f"This model has no {', '.join(PRESETS[key])}."
            button.setToolTip(button.property("tip") if ok else missing)
        self.census_panel.setVisible(info.summary.config.is_moe)
        if info.summary.config.is_moe:  # the census's heatmap gets as much height as the tensor tree
            h = max(self.right_splitter.height(), 600)
            self.right_splitter.setSizes([int(h * 0.42), int(h * 0.16), int(h * 0.42)])
        self.census_panel.check_current()
        self._summary_rows["Expert parameters"].setVisible(info.summary.config.is_moe)
        self.summary_labels["Expert parameters"].setVisible(info.summary.config.is_moe)
        notes = self._carry_over(previous, info) if carry else []
        self._fill_full_list()
        self._fill_legend()
        self.stack.setCurrentIndex(1)
        self._show_spec(self.project.config.targets)
        if notes:
            self.message.show_message("info", " ".join(notes))

    def _carry_over(self, previous: ModelInfo, info: ModelInfo) -> list[str]:
        """Fit the project's targets to a model that replaces `previous`: keep the tensors, layers and
        train-in-full patterns that exist in it, drop the others; sentences saying what happened."""
        assert self.selection is not None
        cfg = self.project.config
        spec = cfg.targets
        n_layers = self.selection.n_layers
        name = Path(info.path).name
        notes: list[str] = []
        new_spec = spec
        if is_custom(spec):
            kept = [
                n for n in spec.patterns if n in self.selection.by_name and self.selection.by_name[n].lora_ok
            ]
            dropped = [n for n in spec.patterns if n not in kept]
            new_spec = TargetSpec(preset="none", patterns=tuple(kept))
            if dropped:
                notes.append(
                    f"Targets carried over to {name}: kept {len(kept)} of {len(spec.patterns)} tensors; "
                    f"dropped {len(dropped)} that this model does not have ({listed(dropped)})."
                )
        else:
            layers = spec.layers
            try:
                parse_layers(layers, n_layers)
            except ModelError:
                old_layers = parse_layers(layers, previous.summary.config.L) or set()
                keep = sorted(x for x in old_layers if x < n_layers)
                layers = _layer_text(keep) if keep else None
                gone = sorted(x for x in old_layers if x >= n_layers)
                where = f"layers {layers}" if layers else "every layer"
                notes.append(
                    f"This model has {n_layers} layers: layers {_layer_text(gone)} of the range "
                    f"{spec.layers} were dropped; the preset now applies to {where}."
                )
            patterns = []
            for pattern in spec.patterns:
                try:
                    select_targets(info.tensors, TargetSpec(preset="none", patterns=(pattern,)), n_layers)
                    patterns.append(pattern)
                except ModelError:
                    notes.append(f"Dropped the target {pattern!r}: this model has no such tensor.")
            new_spec = TargetSpec(spec.preset, tuple(patterns), layers, spec.exclude)
            if not self.selection.has_preset(spec.preset):
                notes.append(
                    f"This model has no {', '.join(PRESETS[spec.preset])}: the "
                    f"{PRESET_LABELS.get(spec.preset, spec.preset)} preset selects nothing here; "
                    "choose another preset."
                )
        full = []
        for pattern in cfg.full:
            try:
                select_full(info.tensors, (pattern,), n_layers)
                full.append(pattern)
            except ModelError:
                notes.append(f"Dropped {pattern!r} from Train in full: this model has no such tensor.")
        if new_spec != spec:
            self._store(new_spec)
        if tuple(full) != tuple(cfg.full):
            self.project.update_config(full=tuple(full))
        return notes

    def selected_names(self) -> list[str]:
        """Names of the tensors that get LoRA adapters, in file order."""
        return self.selection.names() if self.selection else []

    def apply_preset(self, name: str) -> bool:
        """Select a preset ("attention", "mlp", "experts", "router", "all", "none") on the layer range;
        False (and an inline error) when it cannot be applied."""
        if self.selection is None:
            self._show_error("Open a model to choose targets.")
            return False
        if name not in PRESETS:
            self._show_error(f"Unknown preset {name!r}; presets: {', '.join(PRESETS)}.")
            return False
        layers = self.layer_edit.text().strip() or None
        spec = TargetSpec(preset=name, layers=layers)
        try:
            names = self.selection.resolve(spec)
        except ModelError as exc:
            self._show_error(f"{exc}. The selection is unchanged.")
            self._sync_preset_buttons()
            return False
        self._show_error("")
        self._store(spec)
        self.selection.replace(names, origin="spec")
        return True

    def set_layer_range(self, text: str) -> bool:
        """Restrict to layers like "0-11" or "0-3,8" ("" = all). A preset is re-applied on them; a
        custom selection loses its tensors outside them. A bad range shows an error and changes nothing."""
        text = text.strip()
        if self.layer_edit.text().strip() != text:
            self.layer_edit.setText(text)
        if self.selection is None:
            return False
        if not self._check_layer_text(text):
            return False
        keep = parse_layers(text or None, self.selection.n_layers)
        spec = self._spec or TargetSpec()
        if is_custom(spec):
            names = [
                n
                for n in self.selection.names()
                if keep is None or self.selection.by_name[n].layer in keep | {None}
            ]
            new = TargetSpec(preset="none", patterns=tuple(names))
        else:
            new = TargetSpec(spec.preset, spec.patterns, text or None, spec.exclude)
            try:
                names = self.selection.resolve(new)
            except ModelError as exc:
                self._show_error(f"{exc}. The selection is unchanged.")
                return False
        self._show_error("")
        if new != self._spec or names != self.selection.names():
            self._store(new)
            self.selection.replace(names, origin="spec")
        return True

    # --- selection <-> project --------------------------------------------------------------
    def _store(self, spec: TargetSpec) -> None:
        self._spec = spec
        self._storing = True  # the summary is updated by the caller, once
        try:
            self.project.update_targets(
                preset=spec.preset, patterns=spec.patterns, layers=spec.layers, exclude=spec.exclude
            )
        finally:
            self._storing = False

    def _show_spec(self, spec: TargetSpec) -> None:
        """Resolve a spec from the project and show it; a spec that does not fit stays in the project."""
        self._spec = spec
        self.layer_edit.blockSignals(True)
        self.layer_edit.setText("" if is_custom(spec) else spec.layers or "")
        self.layer_edit.blockSignals(False)
        self._check_layer_text(self.layer_edit.text(), quiet=True)
        try:
            names = self.selection.resolve(spec)
            self._show_error("")
        except ModelError as exc:
            names = []
            self._show_error(
                f"The project's targets do not fit this model: {exc}. "
                "Choose a preset or tick cells to replace them."
            )
        self.selection.replace(names, origin="spec")

    def _on_selection(self, origin: str, changed: set[str]) -> None:
        names = self.selection.names()
        if origin == "user":
            self._show_error("")
            self._store(TargetSpec(preset="none", patterns=tuple(names)))
        self.grid_model.refresh(changed)
        self.tree_model.refresh(changed)
        self._sync_preset_buttons()
        self._update_summary()
        self.sig_selection_changed.emit(names)

    def _on_project(self, changed: set[str]) -> None:
        if {"path", "model_path"} <= changed:  # a project opened (or new): its targets are its own
            self._project_opened = True
        self.census_panel.check_current()
        if "config" not in changed:
            return
        self._sync_hyperparameters()
        if self.selection is None:
            return
        cfg = self.project.config
        if cfg.rank != self.grid_model.rank:
            self.grid_model.rank = self.tree_model.rank = cfg.rank
            self.grid_model.refresh()
            self.tree_model.refresh()
        if "config.full" in changed or changed >= {"config", "path"}:
            self._fill_full_list()
        if cfg.targets != self._spec:
            self._show_spec(cfg.targets)  # updates the summary through _on_selection
        elif not self._storing:
            self._update_summary()

    def _sync_hyperparameters(self) -> None:
        cfg = self.project.config
        for spin, value in ((self.rank_spin, cfg.rank), (self.alpha_spin, cfg.alpha)):
            if spin.value() != value:
                spin.blockSignals(True)
                spin.setValue(value)
                spin.blockSignals(False)
        scale = cfg.alpha / cfg.rank if cfg.alpha else 1.0
        self.scale_label.setText(f"scale α/r = {scale:.3g}")

    def _sync_preset_buttons(self) -> None:
        spec = self._spec
        for key, button in self.preset_buttons.items():
            on = spec is not None and not is_custom(spec) and spec.preset == key
            button.setChecked(on)
            font = button.font()
            if font.bold() != on:  # the chosen preset reads as chosen on light and dark alike
                font.setBold(on)
                button.setFont(font)
        if spec is None:
            self.selection_label.setText("")
        elif is_custom(spec):
            n = len(self.selected_names())
            self.selection_label.setText(f"Custom selection: {plural(n, 'tensor')}, saved by name.")
        else:
            text = f"Preset {PRESET_LABELS.get(spec.preset, spec.preset)}"
            text += f", layers {spec.layers}" if spec.layers else ", all layers"
            if spec.patterns:
                text += f", plus {', '.join(spec.patterns)}"
            if spec.exclude:
                text += f", minus {', '.join(spec.exclude)}"
            self.selection_label.setText(text + ".")

    # --- grid and tree events ---------------------------------------------------------------
    def _column_clicked(self, section: int) -> None:
        self.selection.toggle_kind(self.selection.columns[section].kind)

    def _row_clicked(self, section: int) -> None:
        self.selection.toggle_layer(self.selection.rows[section])

    def _grid_cell_pressed(self, index: QModelIndex) -> None:
        c = self.grid_model.candidate(index)
        if c is not None:
            leaf = self.tree_model.index_of(c.name)
            self.tree_view.scrollTo(leaf)
            flags = QItemSelectionModel.ClearAndSelect | QItemSelectionModel.Rows
            self.tree_view.selectionModel().setCurrentIndex(leaf, flags)

    def _tree_current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        c = self.tree_model.leaf(current)
        if c is not None:
            cell = self.grid_model.index_of(c.name)
            self.grid_view.setCurrentIndex(cell)
            self.grid_view.scrollTo(cell)

    # --- layer range field ------------------------------------------------------------------
    def _check_layer_text(self, text: str, quiet: bool = False) -> bool:
        if self.selection is None:
            return True
        try:
            parse_layers(text.strip() or None, self.selection.n_layers)
        except ModelError as exc:
            self.layer_edit.setStyleSheet(bad_edit_style(self._dark))
            if not quiet:
                self._show_error(f"{exc}. The selection is unchanged.")
            return False
        self.layer_edit.setStyleSheet("")
        if self.error_label.text().startswith("layer range"):
            self._show_error("")  # the range that was wrong has been corrected
        return True

    def _show_error(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))

    def _fill_legend(self) -> None:
        groups = {c.group for c in self.selection.columns}
        keys = [g for g in GROUP_NAMES if g in groups]
        text = "&nbsp;&nbsp; ".join(
            f"<span style='color:{GROUP_COLORS[g]}'>■</span>&nbsp;{GROUP_NAMES[g].replace(' ', '&nbsp;')}"
            for g in keys
        )
        text += (
            "<br>Click a cell to toggle it, drag to paint; click a kind or a layer header to toggle it all."
        )
        if "experts" in groups:
            text += " <b>E×</b>: an expert stack, one A/B pair per expert."
        self.legend_label.setText(text)

    # --- train in full ----------------------------------------------------------------------
    def _fill_full_list(self) -> None:
        self.full_list.blockSignals(True)
        self.full_list.clear()
        if self.selection is not None:
            full = tuple(self.project.config.full)
            entries = self.selection.full_kinds() + [p for p in full if p not in self.selection.full_kinds()]
            for pattern in entries:
                try:
                    names = select_full(self.selection.tensors, (pattern,), self.selection.n_layers)
                except ModelError:
                    names = []
                n = sum(self.selection.tensors[x].n_elements for x in names)
                item = QListWidgetItem(f"{pattern} — {plural(len(names), 'tensor')}, {n:,} params")
                item.setData(Qt.UserRole, pattern)
                item.setFlags(Qt.ItemIsEnabled | Qt.ItemIsUserCheckable)
                item.setCheckState(Qt.Checked if pattern in full else Qt.Unchecked)
                item.setToolTip(
                    f"{pattern}: {kind_help(pattern)}. Tick to train these {len(names)} tensors in full "
                    "(default: off)."
                )
                self.full_list.addItem(item)
        self.full_list.blockSignals(False)

    def _full_changed(self, _item: QListWidgetItem) -> None:
        full = tuple(
            self.full_list.item(i).data(Qt.UserRole)
            for i in range(self.full_list.count())
            if self.full_list.item(i).checkState() == Qt.Checked
        )
        self.project.update_config(full=full)

    # --- summary ----------------------------------------------------------------------------
    def _update_summary(self) -> None:
        if self.selection is None or self.info is None:
            return
        summary = self.info.summary
        st = self.selection.stats(self.project.config, summary.config, summary.n_params)
        self.stats = st
        lab = self.summary_labels
        experts = f", {st.n_expert_tensors} of them expert stacks" if st.n_expert_tensors else ""
        lab["Adapted tensors"].setText(f"{st.n_tensors}{experts}")
        lab["Trainable parameters"].setText(self._trainable_text(st.trainable))
        lab["Trainable parameters"].setWordWrap(True)  # with the census's note it takes two lines
        if st.lora_params:
            pct = 100.0 * st.expert_params / st.lora_params
            lab["Expert parameters"].setText(
                f"{human_count(st.expert_params, exact=True)} — {pct:.0f} % of LoRA"
            )
        else:
            lab["Expert parameters"].setText("0")
        lab["Share of model"].setText(f"{100.0 * st.share:.3g} % of {summary.n_params:,}")
        lab["Adapter file (F32)"].setText(
            f"≈ {human_bytes(st.adapter_bytes)}" if st.n_tensors else "no adapter"
        )
        if st.full_error:
            lab["Train in full"].setText(st.full_error)
            lab["Train in full"].setStyleSheet(error_style(self._dark))
        else:
            lab["Train in full"].setStyleSheet("")
            lab["Train in full"].setText(
                f"{plural(st.full_tensors, 'tensor')}, {st.full_params:,} params"
                if st.full_tensors
                else "none"
            )
        m = st.memory
        cfg = self.project.config
        lab["Memory (estimate)"].setText(
            m.describe(cfg) + ("" if m.fits() else f". Does not fit: {m.advice(cfg)}")
        )
        lab["Memory (estimate)"].setWordWrap(True)
        if not st.n_tensors and not st.full_tensors and not self.error_label.isVisible():
            lab["Adapted tensors"].setText("0 — nothing to train: choose a preset or tick cells")
            lab["Adapted tensors"].setStyleSheet(warn_style(self._dark))
        else:
            lab["Adapted tensors"].setStyleSheet("")

    def _trainable_text(self, trainable: int) -> str:
        """The trainable-parameter figure, with what the routing census says of the selected expert
        factors (the unreached ones subtracted when they are left out)."""
        panel = self.census_panel
        cfg = self.project.config
        shapes = {
            n: tuple(self.info.tensors[n].shape) for n in self.selected_names() if n in self.info.tensors
        }
        panel.set_targets(shapes, cfg.rank)
        out = left_out(panel.census, shapes, cfg.rank) if panel.census is not None else None
        if out is None or not out.n_sets:
            return human_count(trainable, exact=True)
        if cfg.skip_unreached_experts:
            kept = human_count(trainable - out.params, exact=True)
            return (
                f"{kept} ({out.params:,} left out: {out.n_sets} of {out.n_total_sets} expert factor sets "
                "are never reached by this data)"
            )
        return f"{human_count(trainable, exact=True)} — {out.describe()}"

    # --- light and dark -----------------------------------------------------------------------
    def _style_indicators(self) -> None:
        """Fusion outlines an unchecked box with a shade of the window colour, which vanishes on a dark
        base: give the tree's and the list's unchecked boxes a visible border there."""
        sheet = INDICATOR_STYLE_DARK if self._dark else ""
        for view in (self.tree_view, self.full_list):
            if view.styleSheet() != sheet:
                view.setStyleSheet(sheet)

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.type() == QEvent.PaletteChange and self._dark != is_dark(self.palette()):
            self._dark = is_dark(self.palette())
            self._style_indicators()
            self.error_label.setStyleSheet(error_style(self._dark))
            self._check_layer_text(self.layer_edit.text(), quiet=True)
            self._update_summary()
        super().changeEvent(event)
