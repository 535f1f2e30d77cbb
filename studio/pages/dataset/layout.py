"""The Dataset page's actions and widgets, made onto the page as its attributes (as a Qt Designer
`setupUi` does): the actions with their shortcuts (`setup_actions`), and the toolbar with the
search box, the path and stats line, the message bar, the reading strip (progress and Cancel),
the table of samples over the Problems list, the sample editor on the right and the token view
below (`setup_ui`).

Layout only: the actions and widgets call the page's handlers, and what they show is decided by
studio.pages.dataset.page.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListView,
    QMenu,
    QProgressBar,
    QSizePolicy,
    QTableView,
    QToolBar,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ...widgets.banner import MessageBar
from ...widgets.buttons import action_button
from ...widgets.page_layout import splitter
from .editor import SampleEditorWidget
from .problems import ProblemsBuilder
from .table import SamplesModel
from .tokens import TokenViewWidget


def _action(
    page, text: str, short: str, tip: str, slot: Callable[[], object], *keys: QKeySequence | str
) -> QAction:
    action = QAction(text, page)
    action.setIconText(short)  # the toolbar's label
    if keys:
        action.setShortcuts([QKeySequence(k) for k in keys])
        shortcut = action.shortcut().toString(QKeySequence.NativeText)
        tip = f"{tip} ({shortcut})"
    action.setToolTip(tip)
    action.setStatusTip(tip)
    action.setShortcutContext(Qt.WidgetWithChildrenShortcut)
    action.triggered.connect(lambda _checked=False: slot())
    page.addAction(action)
    return action


def setup_actions(page) -> None:
    a = functools.partial(_action, page)
    page.action_open = a(
        "Open dataset…", "Open…", "Open a JSON Lines dataset", page.choose_file, "Ctrl+Shift+O"
    )
    page.action_save = a("Save dataset", "Save", "Save the dataset to its file", page.save, "Ctrl+S")
    page.action_save_as = a(
        "Save dataset as…",
        "Save as…",
        "Save the dataset under a new name",
        page.choose_save_as,
        "Ctrl+Shift+S",
    )
    page.action_import = a(
        "Import CSV/ShareGPT/Alpaca…",
        "Import…",
        "Append the samples of another file (CSV or TSV with a column mapping, ShareGPT "
        "conversations, Alpaca instructions, preference pairs or any accepted shape) to this dataset",
        page.choose_import,
    )
    page.action_add = a(
        "Add sample",
        "Add",
        "Add an empty conversation after the selected sample (the arrow: other shapes)",
        page.add_sample,
        "Ctrl+Shift+N",
    )
    page.action_duplicate = a(
        "Duplicate", "Duplicate", "Duplicate the selected samples", page.duplicate_selected, "Ctrl+D"
    )
    page.action_delete = a("Delete", "Delete", "Delete the selected samples", page.delete_selected, "Delete")
    page.action_up = a(
        "Move up", "Up", "Move the selected sample up", lambda: page.move_current(-1), "Alt+Up"
    )
    page.action_down = a(
        "Move down", "Down", "Move the selected sample down", lambda: page.move_current(1), "Alt+Down"
    )
    page.action_undo = a("Undo", "Undo", "Undo the last change to the dataset", page.undo, "Ctrl+Z")
    page.action_redo = a("Redo", "Redo", "Redo the change just undone", page.redo, "Ctrl+Shift+Z", "Ctrl+Y")
    page.action_find = a("Find", "Find", "Search the samples' text", page.focus_search, "Ctrl+F")
    page._actions = [
        page.action_open,
        page.action_save,
        page.action_save_as,
        page.action_import,
        page.action_add,
        page.action_duplicate,
        page.action_delete,
        page.action_up,
        page.action_down,
        page.action_undo,
        page.action_redo,
        page.action_find,
    ]


def setup_ui(page) -> None:
    toolbar = QToolBar()
    toolbar.setToolButtonStyle(Qt.ToolButtonTextOnly)
    for action in (page.action_open, page.action_save, page.action_save_as, page.action_import):
        toolbar.addAction(action)
    toolbar.addSeparator()
    toolbar.addAction(page.action_add)
    add_button = toolbar.widgetForAction(page.action_add)
    if isinstance(add_button, QToolButton):
        menu = QMenu(add_button)
        for kind, label in (
            ("messages", "Conversation (messages)"),
            ("prompt", "Prompt and response"),
            ("text", "Plain text"),
            ("preference", "Preference pair (chosen / rejected)"),
        ):
            menu.addAction(label).triggered.connect(lambda _=False, kind=kind: page.add_sample(kind))
        add_button.setMenu(menu)
        add_button.setPopupMode(QToolButton.MenuButtonPopup)
    for action in (page.action_duplicate, page.action_delete, page.action_up, page.action_down):
        toolbar.addAction(action)
    toolbar.addSeparator()
    toolbar.addAction(page.action_undo)
    toolbar.addAction(page.action_redo)

    page.search = QLineEdit()
    page.search.setPlaceholderText("Search samples (Ctrl+F)")
    page.search.setClearButtonEnabled(True)
    page.search.setToolTip(
        "Show only the samples whose text (any turn, prompt, response or text) contains this, "
        "ignoring case. Esc clears it"
    )
    page.search.setMinimumWidth(220)
    page.search.textChanged.connect(page._search_changed)
    page.search.returnPressed.connect(page._select_first_visible)

    top = QHBoxLayout()
    top.addWidget(toolbar, 1)
    top.addWidget(page.search)

    page.path_label = QLabel()
    page.path_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    page.path_label.setToolTip("The dataset file being edited")
    page.path_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # long paths give way
    page.stats_label = QLabel()
    page.stats_label.setToolTip(
        "Samples in the dataset, how many have a reward, problems found, and tokens with the open "
        "model (trained tokens are the ones the loss is computed on)"
    )
    info = QHBoxLayout()
    info.addWidget(page.path_label, 1)
    info.addWidget(page.stats_label)

    page.message = MessageBar()

    # table
    page.table = QTableView()
    page.table.setModel(page.proxy)
    page.table.setSortingEnabled(True)
    page.table.sortByColumn(SamplesModel.COL_INDEX, Qt.AscendingOrder)
    page.table.setSelectionBehavior(QAbstractItemView.SelectRows)
    page.table.setSelectionMode(QAbstractItemView.ExtendedSelection)
    page.table.setAlternatingRowColors(True)
    page.table.setWordWrap(False)
    page.table.setTextElideMode(Qt.ElideRight)
    page.table.verticalHeader().hide()
    page.table.verticalHeader().setDefaultSectionSize(page.fontMetrics().height() + 8)
    page.table.setToolTip("")
    page.table.setContextMenuPolicy(Qt.ActionsContextMenu)
    for action in (
        page.action_add,
        page.action_duplicate,
        page.action_delete,
        page.action_up,
        page.action_down,
    ):
        page.table.addAction(action)
    header = page.table.horizontalHeader()
    header.setHighlightSections(False)
    fm = page.fontMetrics()
    widths = {
        SamplesModel.COL_INDEX: fm.horizontalAdvance("0000"),
        SamplesModel.COL_LINE: fm.horizontalAdvance("Line0"),
        SamplesModel.COL_SHAPE: fm.horizontalAdvance("messages0"),
        SamplesModel.COL_REWARD: fm.horizontalAdvance("Reward0"),
        SamplesModel.COL_TOKENS: fm.horizontalAdvance("Tokens0"),
        SamplesModel.COL_TRAINED: fm.horizontalAdvance("Trained0"),
        SamplesModel.COL_PROBLEMS: fm.horizontalAdvance("Problems0"),
    }
    for col, width in widths.items():
        header.setSectionResizeMode(col, QHeaderView.Interactive)
        page.table.setColumnWidth(col, width + 12)
    header.setSectionResizeMode(SamplesModel.COL_WORDS, QHeaderView.Stretch)
    page.table.selectionModel().currentRowChanged.connect(lambda *_: page._current_changed())
    page.table.selectionModel().selectionChanged.connect(lambda *_: page._update_actions())
    page.table.doubleClicked.connect(lambda _index: page.editor.focus_first_field())

    # problems
    page.problems_title = QLabel("<b>Problems</b>")
    page.problems = QListView()
    page.problems.setModel(page.problems_model)
    page.problems.setToolTip(
        "Problems found when reading the file or encoding the samples. Click one to select its "
        "sample. Errors: the sample is skipped by training; warnings: it is kept"
    )
    page.problems.setUniformItemSizes(True)  # a hundred thousand rows: no per-row layout
    page.problems.setTextElideMode(Qt.ElideRight)
    page.problems.setIconSize(QSize(16, 16))
    page.problems.clicked.connect(page.select_problem)
    page.problems.activated.connect(page.select_problem)
    page._problems_builder = ProblemsBuilder(
        page.problems_model,
        page.model,
        lambda: page.skipped,
        page._no_problems_text,
        page._problems_built,
        page,
    )
    problems_box = QWidget()
    pl = QVBoxLayout(problems_box)
    pl.setContentsMargins(0, 4, 0, 0)
    pl.addWidget(page.problems_title)
    pl.addWidget(page.problems, 1)

    left = splitter(
        Qt.Vertical, (page.table, problems_box), stretch=(3, 1), sizes=(380, 130), collapsible=True
    )

    # editor
    page.editor = SampleEditorWidget(page.document)
    page.editor.sig_edit.connect(page._edited)

    upper = splitter(Qt.Horizontal, (left, page.editor), stretch=(3, 2), sizes=(740, 420), collapsible=True)

    page.token_view = TokenViewWidget()
    page.splitter = splitter(Qt.Vertical, (upper, page.token_view), stretch=(3, 1), sizes=(520, 200))

    page.load_label = QLabel()
    page.load_bar = QProgressBar()
    page.load_bar.setRange(0, 1000)
    page.load_bar.setTextVisible(True)
    page.load_cancel = action_button(
        "Cancel", page.cancel_loading, "Stop reading the file; the dataset shown stays as it is"
    )
    page.load_strip = QWidget()
    strip = QHBoxLayout(page.load_strip)
    strip.setContentsMargins(0, 0, 0, 0)
    strip.addWidget(page.load_label)
    strip.addWidget(page.load_bar, 1)
    strip.addWidget(page.load_cancel)
    page.load_strip.hide()

    layout = QVBoxLayout(page)
    layout.addLayout(top)
    layout.addWidget(page.message)
    layout.addWidget(page.load_strip)
    layout.addLayout(info)
    layout.addWidget(page.splitter, 1)
