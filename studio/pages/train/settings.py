"""The Train page's hyperparameter form, bound both ways to `project.config` (an engine TrainConfig).

Each field is one row of `FIELDS`: the TrainConfig attribute, a label, an editor kind and what the
setting means; the tooltip adds the TrainConfig default. Editing a value calls
`project.update_config(...)`; a change made elsewhere (a project loaded from disk) refreshes the
editors. Rank, alpha and the targets belong to the Targets page and are not here.

Above the groups, a preset combo (quick, balanced, thorough: studio.project's presets, whose values
depend on the model's size, `set_model_size`, and on the dataset, `set_data_stats`; and the engine's
own defaults) sets several fields at once; it shows "custom" when the settings match no preset, and
its tooltip says what each preset sets. Settings that match a preset follow the dataset when it
changes; a setting changed by hand stays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine import TrainConfig

from ...project import (
    HYPER_PRESETS,
    DataStats,
    Project,
    describe_preset,
    matching_preset,
    preset_settings,
    size_class,
)
from ...widgets.spinbox import SciSpinBox

DEFAULTS = {f.name: getattr(TrainConfig(), f.name) for f in fields(TrainConfig)}


@dataclass(frozen=True)
class Field:
    name: str  # TrainConfig attribute
    label: str
    kind: str  # "int" | "float" | "sci" | "bool" | "choice"
    meaning: str  # what it does, for the tooltip
    lo: float = 0
    hi: float = 1e9
    step: float = 1
    decimals: int = 3
    choices: tuple[tuple[str, str], ...] = ()  # (value, shown text)
    special: str = ""  # text shown at the minimum value ("from epochs", "off")


GROUPS: tuple[tuple[str, tuple[Field, ...]], ...] = (
    ("Basics", (
        Field("lr", "Learning rate", "sci", "Peak learning rate of AdamW (after warm-up).",
              lo=1e-8, hi=1.0),
        Field("epochs", "Epochs", "float", "Passes over the training data; used when Steps is 0.",
              lo=0.01, hi=1000, step=0.5, decimals=2),
        Field("steps", "Steps", "int", "Optimizer steps of the whole run; 0 = computed from Epochs.",
              hi=10_000_000, special="from epochs"),
        Field("n_ctx", "Context length", "int",
              "Window length in tokens: samples are packed whole into windows of this size; longer "
              "samples are truncated (and reported). Memory grows with it.", lo=16, hi=131072, step=64),
        Field("batch_size", "Batch size", "int", "Windows per micro-batch (memory grows with it).",
              lo=1, hi=4096),
        Field("grad_accum", "Gradient accumulation", "int",
              "Micro-batches whose gradients are averaged into one optimizer step: a larger effective "
              "batch without more memory.", lo=1, hi=4096),
    )),
    ("Optimizer", (
        Field("schedule", "Schedule", "choice", "How the learning rate changes over the run.",
              choices=(("cosine", "cosine"), ("linear", "linear"), ("constant", "constant"))),
        Field("warmup_steps", "Warm-up steps", "int", "Steps of linear warm-up from 0 to the learning rate.",
              hi=1_000_000),
        Field("min_lr_ratio", "Minimum LR ratio", "float",
              "Floor of the decay, as a fraction of the learning rate.", hi=1, step=0.05),
        Field("weight_decay", "Weight decay", "float",
              "Decoupled (AdamW) weight decay on the trained matrices; 0 = off.",
              hi=10, step=0.01, decimals=4),
        Field("gclip", "Element clip (gclip)", "float",
              "Clip every gradient element to ±gclip (as llama.cpp's finetune); 0 = off.",
              hi=1e6, step=0.1, decimals=3, special="off"),
        Field("max_grad_norm", "Max gradient norm", "float",
              "Scale the gradient down when its global norm exceeds this; 0 = off.",
              hi=1e6, step=0.1, decimals=3, special="off"),
    )),
    ("Data", (
        Field("val_split", "Validation split", "float",
              "Fraction of the samples held out to measure validation loss; 0 = none.",
              hi=0.9, step=0.05, decimals=2),
        Field("eval_every", "Evaluate every", "int",
              "Steps between validation passes; 0 = only at the end (needs a validation split).",
              hi=1_000_000, special="at the end"),
        Field("train_on_prompt", "Train on prompt", "bool",
              "Compute the loss on prompt (system/user) tokens too, not only on the answers."),
        Field("prompt_format", "Prompt format", "choice",
              "How prompt/response samples become text: the model's chat template, or plain "
              "concatenation.", choices=(("chat", "chat template"), ("raw", "raw text"))),
        Field("seed", "Seed", "int",
              "Seed of the shuffling, the validation split and the LoRA initialisation.", hi=2**31 - 1),
        Field("router_aux_coef", "Load balancing", "sci",
              "MoE models whose router (ffn_gate_inp) is trained: weight of the Switch Transformer "
              "load-balancing loss, summed over the MoE layers and plotted as a series of its own; "
              "0 = off.", lo=0.0, hi=1000.0),
    )),
    ("Rewards", (
        Field("reward_mode", "Reward mode", "choice",
              "How sample rewards steer training: none; reward-weighted SFT (rewards clipped to [-1, 1] "
              "and scaled to [0, 1] weights); group-relative (GRPO-style advantages per prompt).",
              choices=(("none", "none"), ("weighted", "reward-weighted SFT"),
                       ("group", "group-relative (GRPO)"))),
        Field("kl_coef", "KL coefficient", "sci",
              "Group-relative mode: weight of the KL penalty to the base model (adapter off) per "
              "answer token; 0 = off.", lo=0.0, hi=100.0),
    )),
    ("Preferences", (
        Field("objective", "Objective", "choice",
              "What the run learns. SFT: the samples' answers (a preference pair: its chosen answer). DPO: "
              "from preference pairs (prompt, chosen, rejected), against the model with the adapter off. "
              "ORPO: from preference pairs with no reference, an SFT loss on the chosen answer beside it.",
              choices=(("sft", "SFT (learn the answers)"), ("dpo", "DPO (preference pairs)"),
                       ("orpo", "ORPO (preference pairs)"))),
        Field("dpo_beta", "DPO β", "float",
              "DPO: how strongly the adapter is held near the base model; higher keeps it closer. Common "
              "values 0.05-0.5.", lo=0.001, hi=100.0, step=0.05, decimals=3),
        Field("orpo_lambda", "ORPO λ", "float",
              "ORPO: the weight of the odds-ratio term (preferring the chosen answer) beside the SFT loss "
              "on it.", hi=100.0, step=0.05, decimals=3),
    )),
    ("Advanced", (
        Field("checkpoint_layers", "Layer checkpointing", "choice",
              "Recompute each block in the backward pass instead of keeping its activations: much "
              "less memory, about a third slower. Auto: on when the memory estimate says the "
              "activations would not fit.", choices=(("auto", "auto"), ("on", "on"), ("off", "off"))),
        Field("cache_budget", "Weight cache", "choice",
              "Weights stay quantized as the file stores them and are dequantized layer by layer when "
              "used; this much of the dequantized weights is kept between uses. More is faster, less "
              "fits bigger models. Auto: what memory is free after the rest of the run.",
              choices=(("auto", "auto (what is free)"), ("off", "off (least memory)"), ("1G", "1 GiB"),
                       ("2G", "2 GiB"), ("4G", "4 GiB"), ("8G", "8 GiB"), ("16G", "16 GiB"))),
        Field("checkpoint_every", "Checkpoint every", "int",
              "Steps between checkpoints (adapter + optimizer state, for Pause/Resume); 0 = only at "
              "the end and when paused or stopped.", hi=1_000_000, special="at the end"),
        Field("keep_checkpoints", "Keep checkpoints", "int", "How many of the newest checkpoints to keep.",
              lo=1, hi=1000),
        Field("norms_every", "LoRA norms every", "int", "Steps between LoRA-norm measurements (plots).",
              lo=1, hi=1_000_000),
        Field("out_type", "Adapter type", "choice",
              "Tensor type of the adapter GGUF written at the end.",
              choices=(("F32", "F32"), ("F16", "F16"), ("Q8_0", "Q8_0"))),
    )),
)  # fmt: skip

FIELDS: dict[str, Field] = {f.name: f for _, group in GROUPS for f in group}


def format_default(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class TrainSettingsWidget(QWidget):
    """Group boxes of TrainConfig editors; `editors[name]` is the widget of each field."""

    def __init__(self, project: Project, parent: QWidget | None = None):
        super().__init__(parent)
        self.project = project
        self.editors: dict[str, QWidget] = {}
        self._updating = False
        self.n_params: int | None = None  # of the open model: the presets depend on it
        self.data: DataStats | None = None  # the dataset as the last check saw it: the presets follow it
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        self.preset_combo = QComboBox()
        for name in (*HYPER_PRESETS, "defaults"):
            self.preset_combo.addItem("engine defaults" if name == "defaults" else name, name)
        self.preset_combo.addItem("custom", None)  # the settings match no preset
        self.preset_combo.activated.connect(self._preset_chosen)
        preset_form = QFormLayout()
        preset_form.setContentsMargins(6, 2, 6, 2)
        preset_form.addRow("Preset:", self.preset_combo)
        self.preset_label = preset_form.labelForField(self.preset_combo)
        layout.addLayout(preset_form)
        self.groups: dict[str, QGroupBox] = {}
        for title, group in GROUPS:
            box = QGroupBox(title)
            form = QFormLayout(box)
            form.setContentsMargins(6, 4, 6, 4)
            form.setVerticalSpacing(3)
            for f in group:
                editor = self._make_editor(f)
                tip = f"{f.meaning}\nDefault: {format_default(DEFAULTS[f.name])}."
                editor.setToolTip(tip)
                self.editors[f.name] = editor
                if f.kind == "bool":
                    form.addRow(editor)
                else:
                    form.addRow(f.label + ":", editor)
                    form.labelForField(editor).setToolTip(tip)
            self.groups[title] = box
            layout.addWidget(box)
        layout.addStretch(1)
        self.refresh()
        project.subscribe(self._project_changed)
        self.destroyed.connect(lambda *_: project.unsubscribe(self._project_changed))

    def _make_editor(self, f: Field) -> QWidget:
        name = f.name
        if f.kind == "bool":
            w = QCheckBox(f.label)
            w.toggled.connect(lambda v: self._set(name, bool(v)))
        elif f.kind == "choice":
            w = QComboBox()
            for value, text in f.choices:
                w.addItem(text, value)
            w.currentIndexChanged.connect(lambda i, w=w: self._set(name, w.itemData(i)))
        elif f.kind == "int":
            w = QSpinBox()
            w.setRange(int(f.lo), int(min(f.hi, 2**31 - 1)))
            w.setSingleStep(int(f.step))
            w.valueChanged.connect(lambda v: self._set(name, int(v)))
        elif f.kind == "sci":
            w = SciSpinBox()
            w.setRange(f.lo, f.hi)
            w.valueChanged.connect(lambda v: self._set(name, float(v)))
        else:
            w = QDoubleSpinBox()
            w.setDecimals(f.decimals)
            w.setRange(f.lo, f.hi)
            w.setSingleStep(f.step)
            w.valueChanged.connect(lambda v: self._set(name, float(v)))
        if isinstance(w, (QSpinBox, QDoubleSpinBox)):
            w.setKeyboardTracking(False)
            w.setAccelerated(True)
            if f.special:
                w.setSpecialValueText(f.special)
        return w

    def _set(self, name: str, value) -> None:
        if self._updating:
            return
        current = getattr(self.project.config, name)
        if isinstance(value, float) and isinstance(current, float):
            if math.isclose(value, current, rel_tol=1e-9):
                return
        changes = {name: value}
        if name == "objective" and value != "sft":  # preference pairs carry no rewards
            changes["reward_mode"] = "none"
        elif name == "reward_mode" and value != "none":
            changes["objective"] = "sft"
        self.project.update_config(**changes)
        self._sync_enabled()

    def _project_changed(self, changed: set[str]) -> None:
        if "config" in changed:
            self.refresh()

    def refresh(self) -> None:
        """Show the project's current settings (without writing them back)."""
        self._updating = True
        try:
            cfg = self.project.config
            for name, w in self.editors.items():
                value = getattr(cfg, name)
                if isinstance(w, QCheckBox):
                    w.setChecked(bool(value))
                elif isinstance(w, QComboBox):
                    i = w.findData(value)
                    if i < 0:  # a value this form does not list (a newer project file): show it anyway
                        w.addItem(str(value), value)
                        i = w.count() - 1
                    w.setCurrentIndex(i)
                else:
                    w.setValue(value)
        finally:
            self._updating = False
        self._sync_enabled()
        self._sync_preset()

    # --- presets ----------------------------------------------------------------------------
    def set_model_size(self, n_params: int | None) -> None:
        """The open model's parameter count (None: no model): the presets' values follow it."""
        self.n_params = n_params
        self._sync_preset()

    def set_data_stats(self, data: DataStats | None) -> None:
        """The dataset as the Train page's check measured it. Settings that are a preset's (quick,
        balanced, thorough) follow the dataset: the preset is applied again for it; settings the person
        changed by hand stay."""
        if data == self.data:
            return
        name = matching_preset(self.project.config, self.n_params, self.data)
        self.data = data
        if name in HYPER_PRESETS:
            settings = preset_settings(name, self.n_params, data)
            changed = {k: v for k, v in settings.items() if getattr(self.project.config, k) != v}
            if changed:
                self.project.update_config(**changed)
        self._sync_preset()

    def _preset_chosen(self, index: int) -> None:
        name = self.preset_combo.itemData(index)
        if name:
            self.project.apply_preset(name, self.n_params, self.data)
        self._sync_preset()

    def _sync_preset(self) -> None:
        """Show the preset the settings match ("custom" when none) and say what each one sets."""
        name = matching_preset(self.project.config, self.n_params, self.data)
        combo = self.preset_combo
        combo.blockSignals(True)
        combo.setCurrentIndex(combo.findData(name) if name else combo.count() - 1)
        combo.blockSignals(False)
        size = size_class(self.n_params)[0] if self.n_params is not None else "unknown until a model is open"
        lines = {
            "defaults": "engine defaults: the engine's own settings (TrainConfig: 1 epoch at learning rate "
            "2e-4, context 512), as tune-engine train uses them."
        }
        lines.update({p: describe_preset(p, self.n_params, self.data) for p in HYPER_PRESETS})
        lines[None] = "custom: the settings match no preset (choosing it changes nothing)."
        for i in range(combo.count()):
            combo.setItemData(i, lines[combo.itemData(i)], Qt.ToolTipRole)
        data = f"{self.data.n_samples} samples" if self.data is not None else "the dataset, once checked"
        tip = (
            f"Set several training settings at once for the model's size ({size}) and {data}. Only the "
            "settings named are changed; targets, rank and the advanced settings stay. A preset follows "
            "the dataset until you change a setting by hand. Default: balanced.\n\n"
            + "\n\n".join(lines[combo.itemData(i)] for i in range(combo.count()))
        )
        combo.setToolTip(tip)
        self.preset_label.setToolTip(tip)

    def _sync_enabled(self) -> None:
        cfg = self.project.config
        self.editors["kl_coef"].setEnabled(cfg.reward_mode == "group")
        self.editors["dpo_beta"].setEnabled(cfg.objective == "dpo")
        self.editors["orpo_lambda"].setEnabled(cfg.objective == "orpo")
        self.editors["epochs"].setEnabled(cfg.steps == 0)
        self.editors["eval_every"].setEnabled(cfg.val_split > 0)


__all__ = ["DEFAULTS", "FIELDS", "GROUPS", "Field", "TrainSettingsWidget"]
