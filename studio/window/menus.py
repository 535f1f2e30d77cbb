"""The window's menus (File, Dataset, View, Help), made onto the window as its attributes (the
recent-files menus, the actions tests and the quick start name), and what Help shows: the quick
start's steps with the window's real shortcuts, and every keyboard shortcut read from the widgets.
Functions of the window `w` (studio.main_window.MainWindow)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence, QShortcut
from PySide6.QtWidgets import QAbstractButton, QMessageBox, QWidget

from ..widgets.theme import THEMES

THEME_LABELS = {"system": "&System", "light": "&Light", "dark": "&Dark"}


def plain_text(text: str) -> str:
    """A menu or button text without its mnemonic marks ("&Save" -> "Save", "R&&D" -> "R&D")."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").strip()


def make_action(parent: QWidget, text: str, slot, shortcut=None, tip: str = "") -> QAction:
    """A QAction of `parent` that calls `slot`, with its shortcut and its tip (tooltip and status tip)."""
    a = QAction(text, parent)
    if shortcut is not None:
        a.setShortcut(QKeySequence(shortcut))
    if tip:
        a.setStatusTip(tip)
        a.setToolTip(tip)
    a.triggered.connect(slot)
    return a


def build_menus(w) -> None:
    m = w.menuBar().addMenu("&File")
    m.addAction(make_action(w, "&New project", w.new_project, QKeySequence.New, "Start a new, empty project"))
    m.addAction(
        make_action(
            w, "&Open project…", w.open_project_dialog, "Ctrl+Shift+P", "Open a saved project (.json)"
        )
    )
    w.recent_projects_menu = m.addMenu("Recent projects")
    m.addAction(
        make_action(
            w, "&Save", w.save_all, QKeySequence.Save, "Save the project and the dataset if it changed"
        )
    )
    m.addAction(
        make_action(
            w, "Save project &as…", w.save_project_as, "Ctrl+Alt+S", "Save the project under a new name"
        )
    )
    m.addSeparator()
    w.action_open_model = make_action(
        w, "Open &model…", w.model_page.choose_file, QKeySequence.Open, "Open a .gguf model"
    )
    m.addAction(w.action_open_model)
    w.recent_models_menu = m.addMenu("Recent models")
    dataset_actions = w.dataset_page.actions()
    w.action_open_dataset = w.dataset_page.action_open
    w.action_open_dataset.setShortcutContext(Qt.WindowShortcut)  # works from every page
    m.addAction(w.action_open_dataset)
    w.recent_datasets_menu = m.addMenu("Recent datasets")
    m.addSeparator()
    m.addAction(make_action(w, "&Quit", w.close, QKeySequence.Quit, "Quit Tune Studio"))
    edit = w.menuBar().addMenu("&Dataset")
    for action in dataset_actions:
        if action.shortcut() == QKeySequence(QKeySequence.Save):
            action.setShortcut(QKeySequence())  # File > Save (Ctrl+S) saves the dataset and the project
        edit.addAction(action)

    view = w.menuBar().addMenu("&View")
    w.page_actions: list[QAction] = []
    for i, name in enumerate(w.page_names):
        action = make_action(
            w,
            name,
            lambda _=False, i=i: w.show_page(i),
            f"Ctrl+{i + 1}" if i < 9 else None,
            f"Go to the {name} page",
        )
        view.addAction(action)
        w.page_actions.append(action)
    view.addSeparator()
    w.action_first_steps = make_action(
        w,
        "&Getting started strip",
        lambda on: w.set_first_steps_shown(on),
        tip="Show the strip of first steps (model, dataset, targets, training) above the pages",
    )
    w.action_first_steps.setCheckable(True)
    view.addAction(w.action_first_steps)
    theme_menu = view.addMenu("&Theme")
    group = QActionGroup(w)
    w.theme_actions: dict[str, QAction] = {}
    for theme in THEMES:
        tip = {
            "system": "The desktop's own colours (default)",
            "light": "Light colours",
            "dark": "Dark colours",
        }[theme]
        action = make_action(w, THEME_LABELS[theme], lambda _=False, t=theme: w.set_theme(t), tip=tip)
        action.setCheckable(True)
        group.addAction(action)
        theme_menu.addAction(action)
        w.theme_actions[theme] = action

    help_menu = w.menuBar().addMenu("&Help")
    help_menu.addAction(
        make_action(w, "&Quick start", w.show_quick_start, QKeySequence.HelpContents, "The steps of the work")
    )
    help_menu.addAction(
        make_action(
            w,
            "&Keyboard shortcuts",
            w.show_shortcuts,
            "Ctrl+/",
            "Every keyboard shortcut of the window and its pages",
        )
    )
    help_menu.addSeparator()
    help_menu.addAction(make_action(w, "&About Tune Studio", lambda _=False: show_about(w)))


def quick_start_steps(w) -> list[tuple[str, str, str]]:
    """(page, title, text) of each page's step, with the window's real shortcuts."""

    def keys(action: QAction | QAbstractButton | None) -> str:
        seq = action.shortcut() if action is not None else QKeySequence()
        return f" ({seq.toString(QKeySequence.NativeText)})" if not seq.isEmpty() else ""

    start = getattr(w.train_page, "start_button", None)
    texts = {
        "Model": (
            "Open a model",
            f"open a .gguf file (File › Open model{keys(w.action_open_model)}) or drop one on the "
            "window; the page shows what it is and how much memory training needs.",
        ),
        "Dataset": (
            "Write the dataset",
            f"open a JSON Lines file{keys(w.action_open_dataset)} or add samples (chat turns, "
            "prompt and response, or text); the token view shows which tokens are trained.",
        ),
        "Targets": (
            "Choose what to train",
            "pick a preset (attention, MLP, experts, all linear) or tick tensors in the grid; rank "
            "and alpha set the adapter's size.",
        ),
        "Train": (
            "Train",
            f"press Start{keys(start)} and watch the loss fall; pause, resume or stop at any step.",
        ),
        "Chat": (
            "Talk to it",
            "chat with the model, with or without the adapter, or side by side; the live run's "
            "adapter is there while it trains.",
        ),
        "Rewards": (
            "Rate answers (optional)",
            "generate several answers to a prompt, rate each (keys 1–5) and apply a step.",
        ),
        "Export": (
            "Export",
            "write the adapter (or a merged model) that llama.cpp loads with --lora; it is "
            "reloaded and checked after writing.",
        ),
        "Runs": (
            "Look back",
            "every run and rating session with its loss curve; compare runs, and chat with, rate or "
            "export any of their adapters.",
        ),
    }
    out = []
    for i, name in enumerate(w.page_names):
        if name in texts:
            title, text = texts[name]
            out.append((name, f"{title}{keys(w.page_actions[i])}", text))
    return out


def shortcut_rows(w) -> list[tuple[str, str, str]]:
    """(where, what, keys) of every keyboard shortcut: the menus' actions, then each page's
    actions, buttons and shortcuts, read from the widgets as they are now."""
    rows: list[tuple[str, str, str]] = []
    seen: set[int] = set()

    def add(where: str, what: str, sequences, obj) -> None:
        keys = ", ".join(q.toString(QKeySequence.NativeText) for q in sequences if not q.isEmpty())
        if keys and id(obj) not in seen:
            seen.add(id(obj))
            rows.append((where, plain_text(what).rstrip(":"), keys))

    def walk(menu, where: str) -> None:
        for action in menu.actions():
            if action.menu() is not None:
                walk(action.menu(), f"{where} › {plain_text(action.text())}")
            elif not action.isSeparator():
                add(where, action.text(), action.shortcuts(), action)

    for action in w.menuBar().actions():
        if action.menu() is not None:
            walk(action.menu(), f"{plain_text(action.text())} menu")
    for name, page in zip(w.page_names, w.pages, strict=True):
        where = f"{name} page"
        for action in page.findChildren(QAction):
            add(where, action.text() or action.toolTip(), action.shortcuts(), action)
        for button in page.findChildren(QAbstractButton):
            text = button.text() or button.toolTip().split("\n")[0]
            add(where, text, [button.shortcut()], button)
        for shortcut in page.findChildren(QShortcut):
            add(where, shortcut.whatsThis() or "shortcut", shortcut.keys(), shortcut)
    return rows


def show_about(w) -> None:
    QMessageBox.about(
        w,
        "About Tune Studio",
        "Tune Studio fine-tunes GGUF models (dense and Mixture-of-Experts) with LoRA on your own "
        "machine, and exports adapters llama.cpp loads as they are.",
    )
