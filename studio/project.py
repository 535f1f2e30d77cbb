"""The project: what the person is working on, as plain Python that pages observe.

A `Project` holds the model path, the dataset path, an optional chat-template file and the
training settings (an engine `TrainConfig`, targets included), and is saved as JSON. Pages change
it with `project.update(...)` / `project.update_config(...)` and subscribe to hear about changes
(`project.subscribe(callback)`, callback(changed: set[str])). No Qt here, so it is tested and used
without a display; the main window turns its notifications into UI updates. `to_json` and
`restore` carry its state through the window's autosave (`studio.autosave`).

`ModelInfo` is what the pages need to know about the open model without loading its weights:
its summary (architecture, tensors), tokenizer and chat template. Reading one is fast (the
header only).

Outputs: each project has one home for its runs, `Project.output_folder()`: the chosen
`output_dir`, else the open model's own folder under the app's data folder
(`model_runs_folder(model)`: `user_data_folder()/runs/<model stem>-<8 hex digits of its path>`), so
that the runs of a model are found again after a relaunch whatever was opened last, and never
written beside an input that may be read-only (a downloaded model's folder, the installed demo).
`legacy_output_folder()` names where older versions wrote (`tune-studio-out` beside the project
file, the dataset or the model), still listed when it exists. Nothing is created by asking.

Hyperparameter presets: `HYPER_PRESETS` (quick, balanced, thorough) set the training settings for a
model's size and the dataset (`preset_settings(name, n_params, data)`, described by
`describe_preset`): the learning rate by size, the context from the longest sample, the batch from
the tokens, and enough optimizer steps to change the model (a 16-sample dataset gets many epochs).
`Project.reset_hyperparameters()` (a new model) sets the default preset, `DEFAULT_PRESET`, and keeps
what the Targets and Model pages chose (targets, rank, alpha, full-weight tensors, device).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from engine import (
    ChatTemplate,
    EngineError,
    EngineSession,
    GGUFFile,
    ModelSummary,
    SamplingConfig,
    TargetSpec,
    TensorInfo,
    Tokenizer,
    TrainConfig,
    atomic_write,
    check_outputs,
    summarize,
    template_for,
    user_data_folder,
)

PROJECT_VERSION = 1
OUTPUT_FOLDER_NAME = "tune-studio-out"  # where older versions wrote runs, beside the project (or dataset)
# the installed program: the packages and the bundled resources (the demo model and dataset)
_INSTALL_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALLED_FOLDERS = tuple(os.path.join(_INSTALL_ROOT, name) for name in ("studio", "engine", "resources"))


def model_runs_folder(model_path: str | None) -> str:
    """The runs home of a model: user_data_folder()/runs/<model stem>-<8 hex digits of its real path>
    (two files of the same name get two folders); user_data_folder()/runs without a model."""
    root = os.path.join(user_data_folder(), "runs")
    if not model_path:
        return root
    real = os.path.realpath(model_path)
    stem = os.path.splitext(os.path.basename(real))[0] or "model"
    digest = hashlib.sha1(os.path.normcase(real).encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return os.path.join(root, f"{stem}-{digest}")


def is_installed_path(path: str) -> bool:
    """`path` is inside the installed program (its packages, its resources, site-packages)."""
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    for root in INSTALLED_FOLDERS:
        root = os.path.realpath(root)
        if real == root or real.startswith(root + os.sep):
            return True
    return False


# --- hyperparameter presets -----------------------------------------------------------------------
HYPER_PRESETS = ("quick", "balanced", "thorough")
DEFAULT_PRESET = "balanced"  # what a new model starts with, scaled to its size and the dataset
PRESET_MEANING = {
    "quick": "a first look at whether training helps: a short run",
    "balanced": "enough steps to teach a small dataset, a tenth held out for validation when the dataset "
    "is large enough to spare it (the default)",
    "thorough": "twice the steps at half the learning rate, more gradient accumulation, regular "
    "evaluations and checkpoints",
}
# sizes by parameter count: (upper bound, name, base learning rate, longest context of
# quick/balanced/thorough, most tokens in one micro-batch). LoRA on a small dataset needs about
# lr × steps >= 0.01-0.05 to change the answers (SmolLM2-135M learns a made-up fact with lr 1e-3 × 40
# steps); larger models need smaller rates.
SIZE_CLASSES = (
    (100e6, "tiny (under 100M parameters)", 2e-3, (256, 512, 1024), 4096),
    (1.5e9, "small (under 1.5B parameters)", 1e-3, (256, 512, 1024), 2048),
    (10e9, "medium (1.5B to 10B parameters)", 4e-4, (256, 512, 1024), 1024),
    (math.inf, "large (10B parameters or more)", 2e-4, (256, 512, 512), 512),
)
# per preset: (fewest optimizer steps, epochs, gradient accumulation, warm-up share, weight decay)
PRESET_SHAPE = {
    "quick": (30, 1.0, 1, 0.0, 0.0),
    "balanced": (60, 2.0, 1, 0.05, 0.0),
    "thorough": (120, 3.0, 2, 0.1, 0.01),
}
MIN_VAL_SAMPLES = 50  # below this many samples nothing is held out: every sample is needed to learn
# what the presets change; every other setting keeps its value
PRESET_FIELDS = (
    "lr", "epochs", "steps", "n_ctx", "batch_size", "grad_accum", "warmup_steps", "weight_decay",
    "val_split", "eval_every", "checkpoint_every",
)  # fmt: skip
# what a new model does not reset: the Targets page's choices and the Model page's device
KEPT_ON_RESET = ("targets", "rank", "alpha", "lora_init", "full", "device")


@dataclass(frozen=True)
class DataStats:
    """The dataset as the presets see it (from the Train page's check of the next run)."""

    n_samples: int  # samples with a token to learn from (both sides of a validation split)
    n_tokens: int  # their tokens
    longest: int  # tokens of the longest one (as encoded for `measured_ctx`)
    measured_ctx: int  # the context length the samples were encoded with (longer ones were cut)

    @property
    def truncated(self) -> bool:
        return self.longest >= self.measured_ctx


def size_class(n_params: int | None) -> tuple[str, float, tuple[int, int, int], int]:
    """(name, base learning rate, context lengths of quick/balanced/thorough, tokens per micro-batch)
    for a model size (None: unknown, treated as small)."""
    n = 1e9 if n_params is None else n_params
    for bound, name, lr, contexts, tokens in SIZE_CLASSES:
        if n < bound:
            return name, lr, contexts, tokens
    raise AssertionError("unreachable")


def _context_for(longest: int, most: int) -> int:
    """The smallest power of two (at least 64) longer than a sample of `longest` tokens, at most `most`
    (longer, not equal: a sample as long as the context it was measured with may have been cut)."""
    ctx = 64
    while ctx <= longest and ctx < most:
        ctx *= 2
    return min(ctx, most)


def preset_settings(name: str, n_params: int | None, data: DataStats | None = None) -> dict[str, Any]:
    """The TrainConfig settings preset `name` gives a model of `n_params` parameters and a dataset
    (`data`; None: not known yet). The learning rate follows the model's size; the context fits the
    longest sample; the batch fills the micro-batch's tokens; and the step total is at least the
    preset's fewest steps, more epochs over a small dataset (16 samples of a fact are seen ~20 times),
    its epochs over a large one."""
    if name not in HYPER_PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(HYPER_PRESETS)}")
    _, base_lr, contexts, micro_tokens = size_class(n_params)
    i = HYPER_PRESETS.index(name)
    fewest, epochs, accum, warm_share, decay = PRESET_SHAPE[name]
    lr = base_lr / 2 if name == "thorough" else base_lr
    most_ctx = contexts[i]
    if data is None or not data.n_samples:
        n_ctx, batch, steps, val = most_ctx, 1, 0, 0.0
        warmup = int(round(warm_share * fewest))
        total = fewest
    else:
        n_ctx = most_ctx if data.truncated else _context_for(data.longest, most_ctx)
        windows = max(1, math.ceil(data.n_tokens / n_ctx))
        batch = max(1, min(windows, micro_tokens // n_ctx, 8))
        batches = math.ceil(windows / batch)
        from_epochs = math.ceil(epochs * batches / accum)
        steps = fewest if from_epochs < fewest else 0
        total = max(fewest, from_epochs)
        val = 0.1 if name != "quick" and data.n_samples >= MIN_VAL_SAMPLES else 0.0
        warmup = int(round(warm_share * total))
    every = max(10, total // 4)
    return {
        "lr": lr, "epochs": epochs, "steps": steps, "n_ctx": n_ctx, "batch_size": batch, "grad_accum": accum,
        "warmup_steps": warmup, "weight_decay": decay, "val_split": val,
        "eval_every": every if name == "thorough" and val else 0,
        "checkpoint_every": 0 if name == "quick" else every,
    }  # fmt: skip


def describe_preset(name: str, n_params: int | None, data: DataStats | None = None) -> str:
    """One line for a tooltip: what the preset is for and the values it sets for this size and data."""
    s = preset_settings(name, n_params, data)
    val = f"validation split {s['val_split']:g}" if s["val_split"] else "no validation split"
    evals = f", evaluate every {s['eval_every']} steps" if s["eval_every"] else ""
    ckpt = f", checkpoint every {s['checkpoint_every']} steps" if s["checkpoint_every"] else ""
    decay = f", weight decay {s['weight_decay']:g}" if s["weight_decay"] else ""
    steps = f"{s['steps']} steps" if s["steps"] else f"{s['epochs']:g} epochs"
    for_data = f" for {data.n_samples} samples" if data is not None and data.n_samples else ""
    return (
        f"{name}: {PRESET_MEANING[name]}. Sets{for_data} learning rate {s['lr']:g}, {steps}, context "
        f"{s['n_ctx']} tokens, batch {s['batch_size']} × {s['grad_accum']} accumulated, "
        f"{s['warmup_steps']} warm-up steps{decay}, {val}{evals}{ckpt}."
    )


def matching_preset(config: TrainConfig, n_params: int | None, data: DataStats | None = None) -> str | None:
    """The preset whose settings `config` has ("defaults" for TrainConfig's own), or None."""
    defaults = TrainConfig()
    if all(_same(getattr(config, f), getattr(defaults, f)) for f in PRESET_FIELDS):
        return "defaults"
    for name in HYPER_PRESETS:
        if all(_same(getattr(config, f), v) for f, v in preset_settings(name, n_params, data).items()):
            return name
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-15)
    return a == b


@dataclass(frozen=True)
class SampleAnswerSettings:
    """The Train page's sample answers, saved with the project: which prompts are answered during
    training (typed ones, or those of the run's validation split) and how often."""

    prompts: tuple[str, ...] = ()  # typed, one a line
    source: str = "typed"  # "typed" | "validation" (the first `count` held-out samples' prompts)
    count: int = 3  # prompts taken from the validation split
    every: int = 10  # steps between sample answers

    SOURCES = ("typed", "validation")

    def config_changes(self) -> dict[str, Any]:
        """The TrainConfig settings of a run with these sample answers (none: sample_every 0)."""
        prompts = self.prompts if self.source == "typed" else ()
        count = self.count if self.source == "validation" else 0
        return {
            "sample_prompts": prompts,
            "sample_from_validation": count,
            "sample_every": self.every if prompts or count else 0,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "prompts": list(self.prompts),
            "source": self.source,
            "count": self.count,
            "every": self.every,
        }

    @classmethod
    def from_json(cls, d: Any) -> SampleAnswerSettings:
        """ValueError naming what is wrong."""
        if not isinstance(d, dict):
            raise ValueError(f"sample answers must be an object, got {type(d).__name__}")
        default = cls()
        prompts = d.get("prompts", [])
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise ValueError("sample answers: 'prompts' must be a list of texts")
        source = d.get("source", default.source)
        if source not in cls.SOURCES:
            raise ValueError(f"sample answers: source {source!r} is not one of {', '.join(cls.SOURCES)}")
        numbers = {}
        for name, low in (("count", 1), ("every", 1)):
            value = d.get(name, getattr(default, name))
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"sample answers: {name!r} must be a whole number >= {low}, got {value!r}")
            numbers[name] = value
        return cls(tuple(prompts), source, **numbers)


class ProjectError(Exception):
    """A project file that cannot be read or written; the message says which and why."""


@dataclass
class ModelInfo:
    """The open model as the pages see it: facts, tensor directory, tokenizer, chat template."""

    path: str
    summary: ModelSummary
    tensors: dict[str, TensorInfo]
    tokenizer: Tokenizer
    template: ChatTemplate
    metadata: dict = field(repr=False)

    @classmethod
    def read(cls, path: str, template_file: str | None = None) -> ModelInfo:
        """Header, tokenizer and template of a model file; EngineError if it cannot be used."""
        summary = summarize(path)
        f = GGUFFile(path)
        tokenizer = Tokenizer.from_metadata(f.metadata, path)
        template = template_for(f.metadata, template_file)
        return cls(path, summary, dict(f.tensors), tokenizer, template, dict(f.metadata))

    @classmethod
    def from_session(cls, session: EngineSession, template_file: str | None = None) -> ModelInfo:
        """The facts of the model an engine session holds: nothing is read again, the tokenizer is
        the session's own (its summary must have been read in the worker: `session.summary`)."""
        md = session.model.metadata
        template = (
            session.template if template_file == session.template_file else template_for(md, template_file)
        )
        return cls(
            session.path, session.summary, dict(session.model.tensors), session.tokenizer, template, dict(md)
        )


Listener = Callable[[set[str]], None]


class Project:
    """Observable project state. Fields: model_path, dataset_path, template_file, output_dir,
    device, config (TrainConfig), sample_answers (SampleAnswerSettings), path (the JSON file it was
    loaded from or saved to), dirty.

    The file's format is version `PROJECT_VERSION`; keys added since (sample_answers) are optional,
    so a file written before them opens with their defaults, and an older version reading a newer
    file without a newer version number ignores what it does not know."""

    FIELDS = (
        "model_path",
        "dataset_path",
        "template_file",
        "output_dir",
        "device",
        "config",
        "sample_answers",
    )

    def __init__(self) -> None:
        self.model_path: str | None = None
        self.dataset_path: str | None = None
        self.template_file: str | None = None  # overrides the model's chat template
        self.output_dir: str | None = None  # adapters and checkpoints; default: beside the project/dataset
        self.config: TrainConfig = TrainConfig()  # its `device` is the project's device
        self.sample_answers = SampleAnswerSettings()  # the Train page's prompts answered during training
        self.path: str | None = None
        self.dirty = False
        self.chat_sampling: SamplingConfig | None = None  # last used on the Chat page (not saved)
        self._listeners: list[Listener] = []

    @property
    def device(self) -> str:
        """ "cpu", or "cuda:N" where the engine can use one: travels to the engine in the TrainConfig."""
        return self.config.device

    @device.setter
    def device(self, value: str) -> None:
        self.config = replace(self.config, device=value)

    # --- observing --------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _notify(self, changed: set[str]) -> None:
        for listener in list(self._listeners):
            listener(changed)

    # --- changing ---------------------------------------------------------------------------
    def update(self, **changes: Any) -> None:
        """Set fields (model_path=..., dataset_path=..., ...); listeners hear the ones that changed."""
        changed = set()
        for name, value in changes.items():
            if name not in self.FIELDS:
                raise AttributeError(f"Project has no field {name!r}; fields: {', '.join(self.FIELDS)}")
            if getattr(self, name) != value:
                setattr(self, name, value)
                changed.add(name)
        if changed:
            self.dirty = True
            self._notify(changed)

    def update_config(self, **changes: Any) -> None:
        """Change training settings (rank=8, lr=1e-4, targets=TargetSpec(...), ...)."""
        new = replace(self.config, **changes)
        if new != self.config:
            self.config = new
            self.dirty = True
            self._notify({"config", *(f"config.{k}" for k in changes)})

    def update_targets(self, **changes: Any) -> None:
        """Change the LoRA target spec (preset=..., patterns=..., layers=..., exclude=...)."""
        self.update_config(targets=replace(self.config.targets, **changes))

    def reset(self) -> None:
        """A new, empty project."""
        for name, value in Project().__dict__.items():
            if not name.startswith("_"):
                setattr(self, name, value)
        self._notify(set(self.FIELDS) | {"path"})

    # --- files ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "version": PROJECT_VERSION,
            "model_path": self.model_path,
            "dataset_path": self.dataset_path,
            "template_file": self.template_file,
            "output_dir": self.output_dir,
            "device": self.device,
            "config": self.config.to_json(),
            "sample_answers": self.sample_answers.to_json(),
        }

    def save(self, path: str | None = None) -> str:
        """Write the project as JSON atomically (temporary file, then rename)."""
        path = path or self.path
        if not path:
            raise ProjectError("the project has no file name yet: use Save As")
        try:  # never over a file the project names (Save As onto the model would replace it)
            check_outputs({"project file": path}, {"model": self.model_path, "dataset": self.dataset_path,
                                                   "chat template": self.template_file})  # fmt: skip
        except EngineError as exc:
            raise ProjectError(str(exc)) from exc
        try:
            with atomic_write(path, "w", encoding="utf-8") as f:
                json.dump(self.to_json(), f, indent=2)
        except OSError as exc:
            raise ProjectError(f"{path}: the project could not be saved ({exc})") from exc
        self.path = path
        self.dirty = False
        self._notify({"path"})
        return path

    def load(self, path: str) -> None:
        """Replace this project's state with a saved one; ProjectError naming what is wrong."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError) as exc:
            raise ProjectError(f"{path}: cannot be read ({exc})") from exc
        except json.JSONDecodeError as exc:
            raise ProjectError(
                f"{path}: not a project file (JSON error on line {exc.lineno}: {exc.msg})"
            ) from exc
        self._take_json(data, path)
        self.path = path
        self.dirty = False
        self._notify(set(self.FIELDS) | {"path"})

    def restore(self, data: dict, path: str | None) -> None:
        """Take the state of a recovered copy (`to_json()` written by the autosave): `path` is the
        project file it was edited from (None: never saved); the project stays dirty until saved.
        ProjectError when the copy is not a project."""
        self._take_json(data, path or "the recovered project")
        self.path = path
        self.dirty = True
        self._notify(set(self.FIELDS) | {"path"})

    def _take_json(self, data: Any, source: str) -> None:
        if not isinstance(data, dict) or "config" not in data:
            raise ProjectError(f"{source}: not a Tune Studio project (no 'config')")
        if data.get("version", 1) > PROJECT_VERSION:
            raise ProjectError(f"{source}: made by a newer Tune Studio (project version {data['version']})")
        try:
            config = TrainConfig.from_json(data["config"])
        except (TypeError, ValueError) as exc:
            raise ProjectError(f"{source}: training settings are not valid ({exc})") from exc
        try:  # not in files written before sample answers were saved: the defaults
            samples = SampleAnswerSettings.from_json(data.get("sample_answers", {}))
        except ValueError as exc:
            raise ProjectError(f"{source}: {exc}") from exc
        self.model_path = data.get("model_path")
        self.dataset_path = data.get("dataset_path")
        self.template_file = data.get("template_file")
        self.output_dir = data.get("output_dir")
        self.config = config
        self.sample_answers = samples
        self.device = data.get("device") or config.device

    def reset_hyperparameters(self, n_params: int | None = None, data: DataStats | None = None) -> None:
        """Training settings for a new model: the default preset for its size and the dataset (the rest
        TrainConfig's defaults), keeping what the Targets and Model pages chose (`KEPT_ON_RESET`)."""
        kept = {name: getattr(self.config, name) for name in KEPT_ON_RESET}
        new = TrainConfig(**kept, **preset_settings(DEFAULT_PRESET, n_params, data))
        if new != self.config:
            changed = [
                f.name for f in fields(TrainConfig) if getattr(new, f.name) != getattr(self.config, f.name)
            ]
            self.config = new
            self.dirty = True
            self._notify({"config", *(f"config.{k}" for k in changed)})

    def apply_preset(self, name: str, n_params: int | None, data: DataStats | None = None) -> None:
        """Set the training settings of a preset ("defaults", or one of HYPER_PRESETS) for a model
        of `n_params` parameters and a dataset (`data`)."""
        if name == "defaults":
            defaults = TrainConfig()
            self.update_config(**{f: getattr(defaults, f) for f in PRESET_FIELDS})
        else:
            self.update_config(**preset_settings(name, n_params, data))

    # --- derived ----------------------------------------------------------------------------
    def output_folder(self) -> str:
        """The project's home for runs: output_dir, else the open model's folder under the app's data
        folder (`model_runs_folder`; see the module docstring)."""
        if self.output_dir:
            return self.output_dir
        return model_runs_folder(self.model_path)

    def default_output_folder(self) -> str:
        """Where runs go when no folder is chosen: the model's folder under the app's data folder."""
        return model_runs_folder(self.model_path)

    def legacy_output_folder(self) -> str | None:
        """The tune-studio-out folder older versions wrote beside the project file (or the dataset,
        or the model), when it exists: its runs are still listed."""
        for anchor in (self.path, self.dataset_path, self.model_path):
            if anchor:
                folder = os.path.join(os.path.dirname(os.path.abspath(anchor)), OUTPUT_FOLDER_NAME)
                if os.path.isdir(folder) and not is_installed_path(folder):
                    return folder
        return None

    def targets(self) -> TargetSpec:
        return self.config.targets


__all__ = [
    "DEFAULT_PRESET",
    "HYPER_PRESETS",
    "DataStats",
    "EngineError",
    "ModelInfo",
    "Project",
    "ProjectError",
    "SampleAnswerSettings",
    "describe_preset",
    "is_installed_path",
    "matching_preset",
    "model_runs_folder",
    "preset_settings",
    "size_class",
    "user_data_folder",
]
