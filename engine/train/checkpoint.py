"""The one checkpoint format of training runs and reward sessions, written and read here.

A checkpoint is a folder `ckpt-<step:06d>` holding:

- `state.npz`: the exact trainable parameters (`param.<name>`) and the optimizer's state
  (`optim.<key>`, `engine.train.optim.AdamW.state_dict`), plus whatever counters the writer adds
  (`trainer.step`, ...);
- `adapter.gguf`: the LoRA adapter as llama.cpp loads it (when there is one), so a checkpoint is
  also a usable adapter;
- a JSON file of facts named by the writer (`trainer.json` for runs, `session.json` for reward
  sessions): the step, the config, the model, targets, rank and alpha.

The folder is built under a temporary name and renamed into place (`engine.io.files.atomic_folder`),
so a crash leaves the previous checkpoint and at most a `.tmp-*` folder. Arrays are written from
the host: callers pass host copies of device parameters. This module knows nothing of models or
optimizers beyond these names.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..io.files import atomic_folder

STATE_FILE = "state.npz"
ADAPTER_FILE = "adapter.gguf"
PREFIX = "ckpt-"
SAMPLES_FILE = "data.jsonl"  # a run's samples (trained from the app's editor), beside its checkpoints


class CheckpointError(Exception):
    """A folder that is not a readable checkpoint (callers re-raise it as their own EngineError)."""


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def write_checkpoint(
    folder: str,
    step: int,
    *,
    params: Mapping[str, np.ndarray],
    optimizer: Mapping[str, Any],
    meta: Mapping[str, Any],
    meta_file: str,
    extra: Mapping[str, Any] | None = None,
    write_adapter: Callable[[str], object] | None = None,
    keep: int | None = None,
) -> str:
    """Write `folder/ckpt-<step>` atomically and return its path; with `keep`, only the newest `keep`
    checkpoints stay. OSError (a full disk) leaves the folder as it was."""
    final = os.path.join(folder, checkpoint_name(step))
    with atomic_folder(final) as tmp:
        state = {f"param.{k}": np.asarray(v) for k, v in params.items()}
        state.update({f"optim.{k}": np.asarray(v) for k, v in optimizer.items()})
        state.update({k: np.asarray(v) for k, v in (extra or {}).items()})
        np.savez(os.path.join(tmp, STATE_FILE), **state)
        if write_adapter is not None:
            write_adapter(os.path.join(tmp, ADAPTER_FILE))
        with open(os.path.join(tmp, meta_file), "w", encoding="utf-8") as f:
            json.dump(dict(meta), f, indent=1)
    if keep is not None:
        old = sorted(p for p in os.listdir(folder) if p.startswith(PREFIX))
        for p in old[: max(0, len(old) - keep)]:
            import shutil

            shutil.rmtree(os.path.join(folder, p), ignore_errors=True)
    return final


def read_checkpoint(path: str, meta_file: str) -> tuple[dict, dict[str, np.ndarray], dict[str, Any], dict]:
    """(meta, params, optimizer state, other arrays) of a checkpoint folder; CheckpointError naming
    what is wrong when it cannot be read, or naming the array when one holds a NaN or an infinity."""
    try:
        with open(os.path.join(path, meta_file), encoding="utf-8") as f:
            meta = json.load(f)
        with np.load(os.path.join(path, STATE_FILE)) as npz:
            state = dict(npz)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint ({exc})") from exc
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: {meta_file} is not a JSON object")
    for key, value in state.items():
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            n = int((~np.isfinite(value)).sum())
            raise CheckpointError(
                f"{path}: {key} holds {n} non-finite values (NaN or infinity) of {value.size}: the "
                "checkpoint is broken (a run that diverged, or a corrupt file) and cannot be used; resume "
                "from an earlier one"
            )
    params = {k[len("param.") :]: v for k, v in state.items() if k.startswith("param.")}
    optim = {k[len("optim.") :]: v for k, v in state.items() if k.startswith("optim.")}
    other = {k: v for k, v in state.items() if not k.startswith(("param.", "optim."))}
    return meta, params, optim, other


def is_checkpoint(path: str, meta_file: str) -> bool:
    """Whether `path` is a complete checkpoint folder (its state and its facts are there)."""
    return os.path.isfile(os.path.join(path, STATE_FILE)) and os.path.isfile(os.path.join(path, meta_file))


def latest_checkpoint(folder: str, meta_file: str) -> str | None:
    """The newest complete checkpoint in `folder`, or None."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    complete = sorted(
        p for p in names if p.startswith(PREFIX) and is_checkpoint(os.path.join(folder, p), meta_file)
    )
    return os.path.join(folder, complete[-1]) if complete else None
