"""The window's recent files (models, datasets, projects), kept in its QSettings, newest first,
one entry per file however it was named, and the File menu's lists of them."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSettings

from .menus import make_action

MAX_RECENT = 10


def recent_paths(settings: QSettings, key: str) -> list[str]:
    """The paths of the list `key`, newest first."""
    value = settings.value(key, [])
    if isinstance(value, str):
        value = [value]
    return [p for p in (value or []) if isinstance(p, str)]


def add_recent(w, key: str, path: str) -> None:
    """`path` first in the list `key` ("recent/models", "recent/datasets", "recent/projects")."""
    path = os.path.realpath(path)  # one entry per file, however it was named (links, "..")
    paths = [path] + [p for p in recent_paths(w.settings, key) if os.path.realpath(p) != path and p != path]
    w.settings.setValue(key, paths[:MAX_RECENT])
    refresh_recent_menus(w)


def refresh_recent_menus(w) -> None:
    """The File menu's recent lists and the Model page's recent models, of the files that exist."""
    for menu, key, opener in (
        (w.recent_models_menu, "recent/models", w.open_model),
        (w.recent_datasets_menu, "recent/datasets", w.open_dataset),
        (w.recent_projects_menu, "recent/projects", w.open_project),
    ):
        menu.clear()
        paths = list(
            dict.fromkeys(os.path.realpath(p) for p in recent_paths(w.settings, key) if os.path.exists(p))
        )
        for p in paths:
            menu.addAction(make_action(w, Path(p).name, lambda _=False, p=p, opener=opener: opener(p), tip=p))
        menu.setEnabled(bool(paths))
        if key == "recent/models":
            w.model_page.set_recent(paths)
