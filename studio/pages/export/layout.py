"""The export dialog's widgets and where they sit, made onto the dialog as its attributes (as a Qt
Designer `setupUi` does): the source adapter and its base model, what to write (adapter or merged
model, its type and scale), the output file and its Modelfile, the checks, the progress bar and
status line, the result box, the verification table, and the buttons, which stay in view while the
body scrolls on a short screen.

Layout only: the widgets call the dialog's handlers; studio.pages.export.dialog decides what they
show and runs the jobs.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QTableWidget,
    QTreeWidget,
    QVBoxLayout,
    QWidget,
)

from engine import VERIFY_PROMPTS

from ...widgets.buttons import action_button
from ...widgets.faint_label import FaintLabel
from ...widgets.side_panel import SidePanelWidget
from .result import ExportResultWidget
from .types import ExportTypeCombo, modelfile_check


def setup_ui(dialog) -> None:
    """Make the widgets onto `dialog` (an ExportDialog whose state is set) and connect them."""
    dialog.body = QWidget()  # everything but the buttons, which stay in view: it scrolls when short
    layout = QVBoxLayout(dialog.body)
    layout.setContentsMargins(0, 0, 4, 0)

    src_box = QGroupBox("Source")
    dialog.source_combo = QComboBox()
    dialog.source_combo.setToolTip(
        "The adapter to export: the last training run's, one of its checkpoints, or any adapter file"
    )
    dialog.source_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
    browse = action_button("Choose file…", dialog._choose_source, "Export any LoRA adapter (.gguf)")
    row = QHBoxLayout()
    row.addWidget(dialog.source_combo, 1)
    row.addWidget(browse)
    dialog.source_label = FaintLabel()
    dialog.source_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    dialog.base_label = FaintLabel()
    dialog.base_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    src_form = QFormLayout(src_box)
    src_form.addRow("Adapter:", row)
    src_form.addRow("", dialog.source_label)
    src_form.addRow("Base model:", dialog.base_label)
    layout.addWidget(src_box)

    kind_box = QGroupBox("What to write")
    dialog.adapter_radio = QRadioButton("&Adapter GGUF — for llama-cli --lora and llama-export-lora")
    dialog.merged_radio = QRadioButton("&Merged model GGUF — the base model with the adapter folded in")
    dialog.adapter_radio.setChecked(True)
    dialog.kind_group = QButtonGroup(dialog)
    dialog.kind_group.addButton(dialog.adapter_radio)
    dialog.kind_group.addButton(dialog.merged_radio)
    dialog.type_combo = ExportTypeCombo()  # one control: the adapter's type, or the merge's
    dialog.scale_spin = QDoubleSpinBox()
    dialog.scale_spin.setRange(-10.0, 10.0)
    dialog.scale_spin.setSingleStep(0.1)
    dialog.scale_spin.setDecimals(3)
    dialog.scale_spin.setValue(1.0)
    dialog.scale_spin.setToolTip("How strongly the adapter is merged: W + scale·alpha/r·B·A. Default 1.")
    type_row, merged_opts = QWidget(), QWidget()
    f1 = QFormLayout(type_row)
    f1.setContentsMargins(0, 0, 0, 0)
    f1.addRow("Type:", dialog.type_combo)
    f2 = QFormLayout(merged_opts)
    f2.setContentsMargins(0, 0, 0, 0)
    f2.addRow("Scale:", dialog.scale_spin)
    dialog.type_row, dialog.merged_options = type_row, merged_opts
    merged_opts.hide()
    dialog.note_label = FaintLabel(wrap=True)
    kind_layout = QVBoxLayout(kind_box)
    kind_layout.addWidget(dialog.adapter_radio)
    kind_layout.addWidget(dialog.merged_radio)
    kind_layout.addWidget(type_row)
    kind_layout.addWidget(merged_opts)
    kind_layout.addWidget(dialog.note_label)
    layout.addWidget(kind_box)

    out_box = QGroupBox("Write to")
    dialog.out_edit = QLineEdit()
    dialog.out_edit.setToolTip(
        "The file to write (.gguf). It is written to a temporary name and renamed into place, so a "
        "failed or cancelled export leaves an existing file as it was."
    )
    out_browse = QPushButton("Choose…")
    out_browse.clicked.connect(dialog._choose_out)
    dialog.modelfile_check = modelfile_check()
    dialog.modelfile_check.toggled.connect(dialog._settings_changed)
    out_layout = QVBoxLayout(out_box)
    out_row = QHBoxLayout()
    out_row.addWidget(dialog.out_edit, 1)
    out_row.addWidget(out_browse)
    out_layout.addLayout(out_row)
    out_layout.addWidget(dialog.modelfile_check)
    layout.addWidget(out_box)

    check_box = QGroupBox("Checks")
    dialog.check_tree = QTreeWidget()
    dialog.check_tree.setColumnCount(2)
    dialog.check_tree.setHeaderLabels(["Check", "Result"])
    dialog.check_tree.setRootIsDecorated(False)
    dialog.check_tree.setWordWrap(True)
    dialog.check_tree.setSelectionMode(QAbstractItemView.NoSelection)
    dialog.check_tree.header().setSectionResizeMode(0, QHeaderView.ResizeToContents)
    dialog.check_tree.header().setStretchLastSection(True)
    dialog.check_tree.setMinimumHeight(150)
    cl = QVBoxLayout(check_box)
    cl.addWidget(dialog.check_tree)
    layout.addWidget(check_box, 1)

    dialog.progress = QProgressBar()
    dialog._bar("idle")
    dialog.status_label = QLabel()
    dialog.status_label.setWordWrap(True)
    dialog.status_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    layout.addWidget(dialog.progress)
    layout.addWidget(dialog.status_label)
    dialog.result = ExportResultWidget()  # after an export: open its folder, copy its path, run it
    layout.addWidget(dialog.result)

    verify_box = QGroupBox("Verification: the written file reloaded, logits compared")
    dialog.verify_table = QTableWidget(0, 5)
    dialog.verify_table.setHorizontalHeaderLabels(
        ["Prompt", "Tokens", "max |Δ|", "of largest logit", "Beyond tolerance"]
    )
    dialog.verify_table.horizontalHeaderItem(4).setToolTip(
        "Positions whose logits moved more than the written type allows"
    )
    dialog.verify_table.verticalHeader().hide()
    dialog.verify_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
    dialog.verify_table.setSelectionMode(QAbstractItemView.NoSelection)
    dialog.verify_table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
    for c in (1, 2, 3, 4):
        dialog.verify_table.horizontalHeader().setSectionResizeMode(c, QHeaderView.ResizeToContents)
    dialog.verify_table.verticalHeader().setDefaultSectionSize(24)
    rows = len(VERIFY_PROMPTS)
    dialog.verify_table.setFixedHeight(
        dialog.verify_table.horizontalHeader().sizeHint().height() + 24 * rows + 4
    )
    dialog.verdict_label = QLabel("Not verified yet: export first.")
    dialog.verdict_label.setWordWrap(True)
    dialog.verdict_label.setAlignment(Qt.AlignLeft | Qt.AlignTop)
    dialog.verdict_label.setMinimumHeight(dialog.verdict_label.fontMetrics().lineSpacing() * 4 + 4)
    dialog.verdict_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    vl = QVBoxLayout(verify_box)
    vl.addWidget(dialog.verify_table)
    vl.addWidget(dialog.verdict_label)
    layout.addWidget(verify_box)

    dialog.check_button = action_button(
        "&Check", dialog.check, "Run the checks before writing (Ctrl+K)", "Ctrl+K"
    )
    dialog.export_button = action_button(
        "&Export", dialog.export, "Write the file, then reload it and compare logits (Ctrl+E)", "Ctrl+E"
    )
    dialog.verify_button = action_button(
        "&Verify", dialog.verify, "Reload the written file and compare its logits again"
    )
    dialog.cancel_button = action_button(
        "Ca&ncel", dialog.cancel, "Stop a merge between tensors; the target is left as it was"
    )
    dialog.close_button = QPushButton("Close")
    dialog.close_button.clicked.connect(dialog.reject)
    buttons = QHBoxLayout()
    for b in (dialog.check_button, dialog.export_button, dialog.verify_button, dialog.cancel_button):
        b.setAutoDefault(False)
        buttons.addWidget(b)
    buttons.addStretch(1)
    dialog.close_button.setAutoDefault(False)
    buttons.addWidget(dialog.close_button)
    scroll = SidePanelWidget(dialog.body)  # scrolls up and down; never narrower than its controls
    outer = QVBoxLayout(dialog)
    outer.addWidget(scroll, 1)
    outer.addLayout(buttons)

    dialog.source_combo.currentIndexChanged.connect(dialog._source_changed)
    dialog.adapter_radio.toggled.connect(dialog._kind_changed)
    dialog.type_combo.currentIndexChanged.connect(dialog._settings_changed)
    dialog.scale_spin.valueChanged.connect(dialog._settings_changed)
    dialog.out_edit.textEdited.connect(dialog._out_edited)
    dialog.out_edit.textChanged.connect(lambda _: dialog._invalidate())
