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

Made of: studio.pages.targets.layout (the widgets and where they sit), .views (the grid and the
tree) and .selection (the selection's rules); this module decides what they show.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QItemSelectionModel, QModelIndex, Qt, Signal
from PySide6.QtWidgets import (
    QHeaderView,
    QListWidgetItem,
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
from ...widgets.theme import is_dark
from .layout import PRESET_BUTTONS, setup_ui
from .selection import SelectionStats, TargetSelection, kind_help
from .views import (
    GROUP_COLORS,
    GROUP_NAMES,
    TargetGridModel,
    TargetTreeModel,
)

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
        setup_ui(self)
        self.error_label.setStyleSheet(error_style(self._dark))
        self._style_indicators()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.stack)

        self._sync_hyperparameters()
        listener = self._on_project
        project.subscribe(listener)
        self.destroyed.connect(lambda *_: project.unsubscribe(listener))

    # --- building ---------------------------------------------------------------------------
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
