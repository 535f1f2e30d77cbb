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
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from engine import (
    ChatTemplate,
    EngineError,
    EngineSession,
    GGUFFile,
    ModelSummary,
    TargetSpec,
    TensorInfo,
    Tokenizer,
    TrainConfig,
    summarize,
    template_for,
)

PROJECT_VERSION = 1


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
    device, config (TrainConfig), path (the JSON file it was loaded from or saved to), dirty."""

    FIELDS = ("model_path", "dataset_path", "template_file", "output_dir", "device", "config")

    def __init__(self) -> None:
        self.model_path: str | None = None
        self.dataset_path: str | None = None
        self.template_file: str | None = None  # overrides the model's chat template
        self.output_dir: str | None = None  # adapters and checkpoints; default: beside the project/dataset
        self.config: TrainConfig = TrainConfig()  # its `device` is the project's device
        self.path: str | None = None
        self.dirty = False
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
        }

    def save(self, path: str | None = None) -> str:
        """Write the project as JSON atomically (temporary file, then rename)."""
        path = path or self.path
        if not path:
            raise ProjectError("the project has no file name yet: use Save As")
        folder = os.path.dirname(os.path.abspath(path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_json(), f, indent=2)
            os.replace(tmp, path)
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
        self.model_path = data.get("model_path")
        self.dataset_path = data.get("dataset_path")
        self.template_file = data.get("template_file")
        self.output_dir = data.get("output_dir")
        self.config = config
        self.device = data.get("device") or config.device

    # --- derived ----------------------------------------------------------------------------
    def output_folder(self) -> str:
        """Where adapters and checkpoints go: output_dir, else beside the project file or dataset."""
        if self.output_dir:
            return self.output_dir
        anchor = self.path or self.dataset_path or self.model_path
        return os.path.join(
            os.path.dirname(os.path.abspath(anchor)) if anchor else os.getcwd(), "tune-studio-out"
        )

    def targets(self) -> TargetSpec:
        return self.config.targets


__all__ = ["EngineError", "ModelInfo", "Project", "ProjectError"]
