"""Output folders of a run as the Train page checks and tidies them: can files be written there
(asked without creating the folder), which folders a run would create, and removing what a run
that failed before its first checkpoint left behind (its empty checkpoint folder, its run record,
and the folders it created).

No Qt; nothing here starts or stops a run.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile

RUN_FILE = "run.json"  # the run record the trainer writes in its checkpoint folder (engine.train.runs)
CHECKPOINT_META = "trainer.json"  # inside each ckpt-NNNNNN folder: the step, config and model


def folder_problem(folder: str) -> str | None:
    """None if files can be created in `folder` (it and its missing parents made when a run writes),
    else the reason in plain words. Creates nothing: a probe file in the nearest existing folder is
    removed at once."""
    probe = os.path.abspath(folder)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return f"{probe} does not exist"
        probe = parent
    if not os.path.isdir(probe):
        return f"{probe} is a file, not a folder"
    try:
        fd, path = tempfile.mkstemp(prefix=".tune-studio-write-test-", dir=probe)
        os.close(fd)
        os.remove(path)
    except OSError as exc:
        return f"{exc.strerror or 'it cannot be written'} in {probe}"
    return None


def missing_folders(*paths: str) -> list[str]:
    """The folders among `paths` and their parents that do not exist yet, deepest first."""
    out: list[str] = []
    for path in paths:
        p = os.path.abspath(path)
        while p and not os.path.exists(p) and p not in out:
            out.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
    return sorted(out, key=lambda p: -p.count(os.sep))


def has_checkpoint(folder: str | None) -> bool:
    return (
        bool(folder)
        and os.path.isdir(folder)
        and any(name.startswith("ckpt-") for name in os.listdir(folder))
    )


def clean_failed_run(checkpoint_dir: str | None, created: list[str]) -> list[str]:
    """After a run that failed before its first checkpoint: remove its run record and temporary
    files from `checkpoint_dir`, then each folder in `created` (deepest first) that is left empty.
    Folders with anything else in them are kept. Returns the folders removed."""
    if not checkpoint_dir or has_checkpoint(checkpoint_dir):
        return []
    if os.path.isdir(checkpoint_dir):
        for path in [
            os.path.join(checkpoint_dir, RUN_FILE),
            *glob.glob(os.path.join(checkpoint_dir, ".tmp-*")),
        ]:
            with contextlib.suppress(OSError):
                if os.path.isdir(path):
                    os.rmdir(path)
                else:
                    os.remove(path)
    removed = []
    for folder in sorted({os.path.abspath(checkpoint_dir), *created}, key=lambda p: -p.count(os.sep)):
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only when empty
            removed.append(folder)
    return removed


def checkpoint_model(checkpoint: str) -> str | None:
    """The model file a checkpoint folder (ckpt-NNNNNN) was trained on, when it says."""
    try:
        with open(os.path.join(checkpoint, CHECKPOINT_META), encoding="utf-8") as f:
            model = json.load(f).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    return model if isinstance(model, str) else None


__all__ = [
    "checkpoint_model",
    "clean_failed_run",
    "folder_problem",
    "has_checkpoint",
    "missing_folders",
]
