"""The Targets page's widgets and where they sit, made onto the page as its attributes (as a Qt
Designer `setupUi` does): the placeholder shown before a model is open, and the page itself: the
preset buttons, the layer range, rank and alpha, the message and error lines, the layers × kinds
grid with its legend and the summary of what the selection costs, and on the right the tree of
tensor names over the "train in full" list and the routing census.

Layout only: the widgets call the page's handlers, and what they show is decided by
studio.pages.targets.page.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSpinBox,
    QStackedWidget,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from ...widgets.banner import MessageBar
from ...widgets.page_layout import splitter
from ...widgets.spinbox import spin_box
from .census import CensusPanel
from .views import TargetGridView

PRESET_BUTTONS: tuple[tuple[str, str, str], ...] = (
    ("attention", "&Attention", "attn_q, attn_k, attn_v, attn_output in every layer"),
    ("mlp", "&MLP", "ffn_gate, ffn_up, ffn_down and the shared expert's, in every layer"),
    ("experts", "&Experts", "the routed expert stacks ffn_{gate,up,down}_exps: one A/B pair per expert"),
    ("router", "&Router", "the router ffn_gate_inp (expert gating logits)"),
    ("all", "All &linear", "every 2-D/3-D weight inside the layers (attention, MLP, experts, router); "
     "not token_embd or output"),
    ("none", "&None", "nothing: clears the LoRA selection"),
)  # fmt: skip


def setup_ui(page) -> None:
    """Make the page's widgets onto `page` (a TargetsPage whose state is set)."""
    page.placeholder = QLabel("Open a model to choose targets")
    page.placeholder.setAlignment(Qt.AlignCenter)
    page.placeholder.setStyleSheet("QLabel { font-size: 14pt; }")
    page.placeholder.setForegroundRole(QPalette.PlaceholderText)

    hint = QLabel("Open a .gguf file on the Model page (Ctrl+O); its tensors appear here.")
    hint.setAlignment(Qt.AlignCenter)
    hint.setWordWrap(True)
    hint.setForegroundRole(QPalette.PlaceholderText)
    page.hint_label = hint
    empty = QWidget()
    el = QVBoxLayout(empty)
    el.addStretch(1)
    el.addWidget(page.placeholder)
    el.addWidget(hint)
    el.addStretch(1)

    page.stack = QStackedWidget()
    page.stack.addWidget(empty)
    page.empty_panel = empty
    page.stack.addWidget(_content(page))


def _content(page) -> QWidget:
    """The page shown once a model is open."""
    content = QWidget()
    outer = QVBoxLayout(content)
    outer.setContentsMargins(8, 8, 8, 8)
    outer.setSpacing(6)

    # two rows, so that the page fits a 1024-pixel window: presets, then layers, rank and alpha
    bar = QHBoxLayout()
    bar.setSpacing(4)
    bar.addWidget(QLabel("Presets:"))
    page.preset_buttons: dict[str, QPushButton] = {}
    for key, text, what in PRESET_BUTTONS:
        button = QPushButton(text)
        button.setCheckable(True)
        button.setAutoDefault(False)
        button.setToolTip(
            f"Select {what}, within the layer range (Alt+{text[text.index('&') + 1]}). "
            "The default target is Attention."
        )
        button.setProperty("tip", button.toolTip())
        button.clicked.connect(lambda _=False, k=key: page.apply_preset(k))
        bar.addWidget(button)
        page.preset_buttons[key] = button
    bar.addStretch(1)
    outer.addLayout(bar)
    bar = QHBoxLayout()
    bar.setSpacing(4)
    layers_label = QLabel("La&yers:")
    page.layer_edit = QLineEdit()
    page.layer_edit.setPlaceholderText("all layers")
    page.layer_edit.setMaximumWidth(110)
    page.layer_edit.setToolTip(
        "Which layers the presets apply to, e.g. 0-11 or 0-3,8 (default: empty = every layer).\n"
        "Enter applies it: a preset is re-applied on these layers; a custom selection drops the\n"
        "tensors outside them. Global tensors (token_embd, output) are not affected."
    )
    layers_label.setBuddy(page.layer_edit)
    page.layer_edit.textChanged.connect(lambda text: page._check_layer_text(text, quiet=True))
    page.layer_edit.editingFinished.connect(lambda: page.set_layer_range(page.layer_edit.text()))
    bar.addWidget(layers_label)
    bar.addWidget(page.layer_edit)
    bar.addSpacing(12)

    rank_label = QLabel("Ran&k:")
    page.rank_spin = spin_box(QSpinBox, 1, 256, 16)
    page.rank_spin.setToolTip(
        "LoRA rank r: the inner width of each adapter (A is r × n_in, B is n_out × r). Higher ranks\n"
        "learn more and cost more parameters; the adapter's output is scaled by alpha / r. Default 16."
    )
    rank_label.setBuddy(page.rank_spin)
    page.rank_spin.valueChanged.connect(lambda v: page.project.update_config(rank=int(v)))
    alpha_label = QLabel("Al&pha:")
    page.alpha_spin = spin_box(QDoubleSpinBox, 0.0, 4096.0, 32.0, decimals=1)
    page.alpha_spin.setToolTip(
        "LoRA alpha: the adapter's output is multiplied by alpha / r, so with alpha fixed, changing\n"
        "the rank keeps the update's size comparable. 0 means a scale of 1 (as llama.cpp). Default 32."
    )
    alpha_label.setBuddy(page.alpha_spin)
    page.alpha_spin.valueChanged.connect(lambda v: page.project.update_config(alpha=float(v)))
    page.scale_label = QLabel()
    page.scale_label.setToolTip("The adapter's scale alpha / r, applied to (x Aᵀ) Bᵀ.")
    for w in (rank_label, page.rank_spin, alpha_label, page.alpha_spin, page.scale_label):
        bar.addWidget(w)
    bar.addStretch(1)
    outer.addLayout(bar)

    page.message = MessageBar()  # what a change of model kept and dropped
    outer.addWidget(page.message)
    page.error_label = QLabel()
    page.error_label.setWordWrap(True)
    page.error_label.hide()
    outer.addWidget(page.error_label)
    page.selection_label = QLabel()
    page.selection_label.setToolTip("How the selection is saved in the project (targets).")
    outer.addWidget(page.selection_label)

    page.grid_view = TargetGridView()
    page.grid_view.setToolTip("")
    page.grid_view.horizontalHeader().sectionClicked.connect(page._column_clicked)
    page.grid_view.verticalHeader().sectionClicked.connect(page._row_clicked)
    page.grid_view.sig_cell_pressed.connect(page._grid_cell_pressed)
    legend = QLabel()
    legend.setWordWrap(True)
    legend.setForegroundRole(QPalette.PlaceholderText)  # readable grey on light and dark
    page.legend_label = legend
    page.tree_view = QTreeView()
    page.tree_view.setUniformRowHeights(True)
    page.tree_view.setIndentation(14)
    page.tree_view.header().setDefaultSectionSize(40)  # the last (Note) column takes what is left
    page.tree_view.setAlternatingRowColors(True)
    page.tree_view.setSelectionMode(QAbstractItemView.SingleSelection)
    page.tree_view.setToolTip("")
    page.tree_view.setEditTriggers(QAbstractItemView.NoEditTriggers)

    summary_box = QGroupBox("Summary")
    summary_box.setToolTip("What the selection costs, from tensor shapes alone (no weights loaded).")
    form = QFormLayout(summary_box)
    form.setContentsMargins(8, 6, 8, 6)
    form.setVerticalSpacing(3)
    page.summary_labels: dict[str, QLabel] = {}
    page._summary_rows: dict[str, QLabel] = {}
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
        page.summary_labels[key] = value
        page._summary_rows[key] = name

    full_box = QGroupBox("Train in full (not LoRA)")
    full_box.setToolTip(
        "Small tensors that cannot take LoRA (norms, biases, gates) or the router can be trained as a\n"
        "whole instead. They are saved into a full model on export, not into the LoRA adapter.\n"
        "Default: none."
    )
    fl = QVBoxLayout(full_box)
    fl.setContentsMargins(6, 6, 6, 6)
    page.full_list = QListWidget()
    page.full_list.setToolTip(full_box.toolTip())
    page.full_list.itemChanged.connect(page._full_changed)
    fl.addWidget(page.full_list)

    # left: grid, legend, summary; right: tree over "train in full"
    grid_panel = QWidget()
    grid_panel.setMinimumWidth(430)
    gl = QVBoxLayout(grid_panel)
    gl.setContentsMargins(0, 0, 0, 0)
    gl.setSpacing(4)
    gl.addWidget(page.grid_view, 1)
    gl.addWidget(legend)
    gl.addWidget(summary_box)
    gl.addStretch(0)

    page.census_panel = CensusPanel(page.project, page.engine)  # MoE models only
    page.census_panel.hide()
    page.census_panel.sig_census.connect(lambda _c: page._update_summary())
    right = splitter(Qt.Vertical, (page.tree_view, full_box, page.census_panel), stretch=(4, 1, 4))
    page.right_splitter = right

    page.splitter = splitter(Qt.Horizontal, (grid_panel, right), stretch=(0, 1))
    outer.addWidget(page.splitter, 1)
    return content
