"""What a checkpoint says about its run, so that resuming continues that run and not another one.

A training checkpoint (`engine.train.checkpoint`, written by `Trainer.save_checkpoint`) carries its
run's plan and settings in `trainer.json`: the step, the planned total, the `TrainConfig`, the model,
the dataset (its path and SHA-256, or a copy of the samples the app trained from its editor,
`SAMPLES_FILE` in the run's checkpoint folder), the tokens processed and the training time.

- `read_checkpoint_info(path)` -> `CheckpointInfo`: those facts, for a `ckpt-NNNNNN` folder or a
  folder of them (its newest). `info.data()` is what to train on to continue the same trajectory.
- `trajectory_changes(old, new)`: the settings in which a config differs from the checkpoint's
  and that change what the run computes (context, batch, learning rate, schedule, seed, targets,
  the step total, the objective and its beta or lambda...), each as one line ("context 128 ->
  512"); settings that only change how it computes (device, cache, layer checkpointing, where
  files go) are not listed.
- `describe_settings(config)`: the settings that define a run, in one line for people.

The CLI (`tune-engine train --resume`) and the app ask before anything `trajectory_changes` lists.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..errors import ModelError
from ..io.hashes import file_sha256
from .checkpoint import SAMPLES_FILE, STATE_FILE, latest_checkpoint
from .config import CONFIG_FILE
from .trainer import TrainConfig

# TrainConfig fields that change what a resumed run computes, with the words people know them by
TRAJECTORY_FIELDS: dict[str, str] = {
    "n_ctx": "context",
    "batch_size": "batch",
    "grad_accum": "gradient accumulation",
    "steps": "steps",
    "epochs": "epochs",
    "val_split": "validation split",
    "train_on_prompt": "train on prompt",
    "prompt_format": "prompt format",
    "skip_unreached_experts": "leaving out unreached experts",
    "router_aux_coef": "load-balancing coefficient",
    "seed": "seed",
    "lr": "learning rate",
    "schedule": "schedule",
    "warmup_steps": "warm-up steps",
    "min_lr_ratio": "minimum LR ratio",
    "weight_decay": "weight decay",
    "gclip": "element clip",
    "max_grad_norm": "max gradient norm",
    "reward_mode": "reward mode",
    "kl_coef": "KL coefficient",
    "targets": "targets",
    "rank": "rank",
    "alpha": "alpha",
    "lora_init": "LoRA init",
    "full": "full-weight tensors",
    "objective": "objective",
    "dpo_beta": "DPO beta",
    "orpo_lambda": "ORPO lambda",
}
# a preference setting changes the trajectory only of a run with its objective (either side's)
_OBJECTIVE_OF = {"dpo_beta": "dpo", "orpo_lambda": "orpo"}


@dataclass(frozen=True)
class CheckpointInfo:
    """A training checkpoint's facts (see the module docstring)."""

    path: str  # the ckpt-NNNNNN folder
    step: int  # optimizer steps taken
    total_steps: int  # the run's planned total (0 when the checkpoint predates the plan's record)
    config: TrainConfig  # the run's settings
    model: str | None  # the model file it trained
    dataset: str | None  # the dataset file it trained (None: samples from the editor)
    dataset_sha256: str | None
    samples_file: str | None  # the copy of its samples in the run folder, when it has one
    tokens: int  # sample tokens processed so far
    seconds: float  # training time so far (pauses excluded)

    @property
    def run_dir(self) -> str:
        """The run's checkpoint folder (its record, its other checkpoints, its copy of the samples)."""
        return os.path.dirname(self.path)

    def data(self) -> str | None:
        """The file to resume on: the run's copy of its samples, else its dataset file when it still
        holds the same bytes; None when neither is at hand."""
        if self.samples_file and os.path.isfile(self.samples_file):
            return self.samples_file
        if self.dataset and os.path.isfile(self.dataset) and self.same_data(self.dataset):
            return self.dataset
        return None

    def same_data(self, path: str | None) -> bool:
        """`path` holds the data this run trained (its own copy, or a file with the same SHA-256)."""
        if not path or not os.path.isfile(path):
            return False
        if self.samples_file and _same_file(path, self.samples_file):
            return True
        return bool(self.dataset_sha256) and file_sha256(path) == self.dataset_sha256

    @property
    def knows_data(self) -> bool:
        """The checkpoint records its dataset (older checkpoints do not: their data cannot be checked)."""
        return bool(self.dataset_sha256 or self.samples_file)

    def describe_data(self) -> str:
        if self.dataset:
            return self.dataset
        return f"the samples it was trained on ({self.samples_file or 'no copy kept'})"


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def read_checkpoint_info(path: str) -> CheckpointInfo:
    """The facts of a checkpoint folder (ckpt-NNNNNN, or a folder of them: the newest); ModelError
    naming what is wrong when it is not a training checkpoint."""
    if not os.path.isdir(path):
        raise ModelError(f"{path}: no such checkpoint folder")
    if not os.path.isfile(os.path.join(path, STATE_FILE)):
        latest = latest_checkpoint(path, CONFIG_FILE)
        if latest is None:
            raise ModelError(
                f"{path}: holds no complete checkpoint (a ckpt-NNNNNN folder with {STATE_FILE} and "
                f"{CONFIG_FILE})"
            )
        path = latest
    try:
        with open(os.path.join(path, CONFIG_FILE), encoding="utf-8") as f:
            meta = json.load(f)
        config = TrainConfig.from_json(meta["config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{path}: not a readable training checkpoint ({exc})") from exc
    samples = meta.get("samples_file")
    return CheckpointInfo(
        path=os.path.abspath(path),
        step=int(meta.get("step", 0)),
        total_steps=int(meta.get("total_steps", 0) or 0),
        config=config,
        model=meta.get("model"),
        dataset=meta.get("dataset"),
        dataset_sha256=meta.get("dataset_sha256"),
        samples_file=os.path.join(os.path.dirname(os.path.abspath(path)), samples) if samples else None,
        tokens=int(meta.get("tokens", 0) or 0),
        seconds=float(meta.get("seconds", 0.0) or 0.0),
    )


def _show(name: str, value) -> str:
    if name == "targets":
        parts = [value.preset] if value.preset != "none" or not value.patterns else []
        parts += list(value.patterns)
        if value.layers:
            parts.append(f"layers {value.layers}")
        return " + ".join(parts) or "none"
    if name == "steps" and not value:
        return "from epochs"
    if name == "objective":
        return value.upper()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    return str(value)


def trajectory_changes(old: TrainConfig, new: TrainConfig) -> list[str]:
    """The settings of `new` that differ from the checkpoint's `old` and change the run's trajectory,
    one line each: "context 128 -> 512"."""
    out = []
    for name, words in TRAJECTORY_FIELDS.items():
        a, b = getattr(old, name), getattr(new, name)
        if name == "epochs" and old.steps and new.steps:
            continue  # epochs do not count when steps are set
        if name in _OBJECTIVE_OF and _OBJECTIVE_OF[name] not in (old.objective, new.objective):
            continue  # DPO's beta does not count in an ORPO or SFT run, nor ORPO's lambda in the others
        if a != b:
            out.append(f"{words} {_show(name, a)} -> {_show(name, b)}")
    return out


def describe_settings(config: TrainConfig, total_steps: int = 0) -> str:
    """The settings that define a run, in one line: "60 steps, context 128, batch 4, lr 0.001 ..."."""
    steps = f"{total_steps} steps" if total_steps else (
        f"{config.steps} steps" if config.steps else f"{config.epochs:g} epochs"
    )  # fmt: skip
    accum = f" × {config.grad_accum} accumulated" if config.grad_accum > 1 else ""
    objective = {"dpo": f", DPO (beta {config.dpo_beta:g})",
                 "orpo": f", ORPO (lambda {config.orpo_lambda:g})"}.get(config.objective, "")  # fmt: skip
    return (
        f"{steps}, context {config.n_ctx}, batch {config.batch_size}{accum}, learning rate {config.lr:g} "
        f"({config.schedule}, {config.warmup_steps} warm-up), rank {config.rank}, alpha {config.alpha:g}, "
        f"targets {_show('targets', config.targets)}, seed {config.seed}{objective}"
    )


__all__ = [
    "SAMPLES_FILE",
    "TRAJECTORY_FIELDS",
    "CheckpointInfo",
    "describe_settings",
    "read_checkpoint_info",
    "trajectory_changes",
]
