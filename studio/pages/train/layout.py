"""The Train page's widgets and where they sit, made onto the page as its attributes (as a Qt
Designer `setupUi` does): the settings on the left; on the right the banner, the run's buttons, why
Start is unavailable, the progress bar and stats line, the run's paths with the output folder and
processes, and the figures (curves, layers, preferences, sample answers) above the event log.

`RunLog` is the event log: it keeps its last lines only and follows new lines unless the person
scrolled up. `show_objective` shows the figures of a run's objective. What the widgets show is
decided by studio.pages.train.page and its controller.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ...project import Project
from ...widgets.banner import MessageBar
from ...widgets.buttons import PrimaryButton, action_button
from ...widgets.elided_label import ElidedLabel
from ...widgets.page_layout import scroll_area, splitter
from ...widgets.plots import TrainPlotsWidget
from ...widgets.preference_plots import PreferencePlotsWidget
from ...widgets.sample_answers import SampleAnswersWidget
from ...widgets.wrapping_label import wrapping_label
from .settings import TrainSettingsWidget

# The log keeps its last lines only: a QPlainTextEdit lays out every line it holds, about 7 KB each
# (5,000 lines were 35 MiB, the app's largest growth in `bench/soak.py app`); every run's events stay
# in its events file and its record (Runs page).
LOG_MAX_LINES = 1000


class RunLog(QPlainTextEdit):
    """The run's events, one line each, in a monospace font; the last LOG_MAX_LINES lines."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setReadOnly(True)
        self.setMaximumBlockCount(LOG_MAX_LINES)
        self.setLineWrapMode(QPlainTextEdit.WidgetWidth)  # long lines wrap: nothing hides sideways
        self.setPlaceholderText("Events of the run appear here.")
        self.setMinimumHeight(50)
        font = self.font()
        font.setStyleHint(font.StyleHint.Monospace)
        font.setFamily("monospace")
        self.setFont(font)

    def add(self, line: str, stamp: bool = True) -> None:
        """Append a line; the view follows new lines unless the person scrolled up."""
        bar = self.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 1
        keep = bar.value()
        self.appendPlainText((time.strftime("[%H:%M:%S] ") if stamp else "") + line)
        if at_end:
            bar.setValue(bar.maximum())
        else:
            bar.setValue(min(keep, bar.maximum()))


def _run_buttons(page) -> QHBoxLayout:
    """Start, Pause, Resume, Stop, From checkpoint… and the state, in a row."""
    page.start_button = action_button(
        "Start", page.start, "Start a new training run with these settings (Ctrl+Enter).", "Ctrl+Return",
        button=PrimaryButton("Start"),
    )  # fmt: skip
    page.pause_button, page.resume_button, page.stop_button = (
        action_button(text, slot, tip, keys) for text, slot, tip, keys in (
            ("Pause", page.pause, "Stop after the current step and keep the run in memory; Resume "
             "continues from it (Ctrl+P).", "Ctrl+P"),
            ("Resume", page.resume, "Continue this run: in memory after Pause, else from its latest "
             "checkpoint (Ctrl+Shift+Enter).", "Ctrl+Shift+Return"),
            ("Stop", page.stop, "End the run after the current step; the adapter and a checkpoint are "
             "written (Ctrl+.).", "Ctrl+.")
        )
    )  # fmt: skip
    page.resume_from_button = action_button(
        "From checkpoint…", page.choose_checkpoint,
        "Continue training from a checkpoint folder of the open model (ckpt-NNNNNN, or a folder of them: "
        "the newest).",
    )  # fmt: skip
    page.state_label = QLabel()
    page.state_label.setAlignment(Qt.AlignRight | Qt.AlignVCenter)
    page.state_label.setToolTip("The state of the training run.")
    row = QHBoxLayout()
    row.setSpacing(4)
    for b in (page.start_button, page.pause_button, page.resume_button, page.stop_button):
        row.addWidget(b)
    row.addSpacing(6)
    row.addWidget(page.resume_from_button)
    row.addStretch(1)
    row.addWidget(page.state_label)
    return row


def _paths_row(page) -> QHBoxLayout:
    """Where the run writes, the Output folder… button, the processes and Across machines…"""
    page.processes = QSpinBox()
    page.processes.setRange(1, 64)
    page.processes.setPrefix("Processes: ")
    page.processes.setToolTip(
        "Train on this many processes of this machine (data parallel over MPI: each takes a share of "
        "every step's windows; the same steps as one process). 1 (default): in the app, with Pause. "
        "Needs the mpi extra (pip install 'tune-studio[mpi]'). DPO and ORPO train in one process."
    )
    page.processes.valueChanged.connect(lambda _n: page._update_start())
    page.machines_button = action_button(
        "Across machines…", page.show_machines,
        "The command that runs this training on several machines (mpiexec); the Runs page follows it.",
    )  # fmt: skip
    page.paths_label = ElidedLabel()
    page.paths_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    page.output_button = action_button(
        "Output folder…",
        page.choose_output_folder,
        "Choose where adapters and checkpoints are written. Default: a tune-studio-out folder "
        "beside the project file (or the dataset), or your data folder when that one is inside "
        "the program or cannot be written.",
    )
    row = QHBoxLayout()
    row.addWidget(page.paths_label, 1)
    row.addWidget(page.output_button, 0, Qt.AlignTop)
    row.addWidget(page.processes, 0, Qt.AlignTop)
    row.addWidget(page.machines_button, 0, Qt.AlignTop)
    return row


def _progress(page) -> None:
    """Why Start is unavailable, the progress bar and the two-line stats."""
    # why Start is disabled, with a link to the page that fixes it
    page.reason_label = wrapping_label(text_format=Qt.RichText, interaction=Qt.TextBrowserInteraction)
    page.reason_label.linkActivated.connect(page._link)
    page.reason_label.hide()
    page.progress = QProgressBar()
    page.progress.setRange(0, 1)
    page.progress.setValue(0)
    page.progress.setTextVisible(True)
    page.progress.setFormat("steps: waiting for a model and a dataset")
    page.progress.setToolTip("Steps of the run: before Start, the step total of the current settings.")
    page.stats_label = QLabel("Not started.")
    page.stats_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    page.stats_label.setWordWrap(True)
    page.stats_label.setAlignment(Qt.AlignLeft | Qt.AlignTop)
    # its text changes at every tick: never let that re-layout the page (two lines, always)
    page.stats_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)
    page.stats_label.setFixedHeight(2 * page.stats_label.fontMetrics().lineSpacing() + 2)


def _figures(page, project: Project) -> None:
    """The curves and layers (TrainPlotsWidget), with the Preferences tab of a DPO / ORPO run (shown
    while such a run is on them) and the Sample answers tab."""
    page.plots = TrainPlotsWidget()
    page.plots.timer.timeout.connect(page._refresh_progress)
    page.preference_plots = PreferencePlotsWidget()
    page.plots.tabs.addTab(page.preference_plots, "Preferences")
    page.plots.tabs.setTabVisible(page.plots.tabs.count() - 1, False)
    page.plots.timer.timeout.connect(page.preference_plots.redraw)
    page.plots.sig_link_activated.connect(page._link)
    page.sample_answers = SampleAnswersWidget(project)  # prompts answered every N steps, the answers
    page.plots.tabs.addTab(page.sample_answers, "Sample answers")


def show_objective(page, objective: str, total_steps: int, held_out: bool = True) -> None:
    """The figures of a run with this objective: the Preferences tab for DPO and ORPO."""
    tabs = page.plots.tabs
    index = tabs.indexOf(page.preference_plots)
    preference = objective != "sft"
    tabs.setTabVisible(index, preference)
    page.plots.set_loss_title(
        f"Loss ({objective.upper()} objective)" if preference else "Loss (mean cross-entropy)"
    )
    if preference:
        page.preference_plots.set_run(objective, total_steps, held_out)
        tabs.setCurrentIndex(index)  # the figures a preference run is watched by


def setup_ui(page, project: Project) -> None:
    """Make the Train page's widgets onto `page` and lay them out; their signals go to its slots."""
    page.settings = TrainSettingsWidget(project)
    scroll = scroll_area(page.settings)
    scroll.setMinimumWidth(
        page.settings.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width() + 4
    )
    page.settings_scroll = scroll
    page.banner = MessageBar()
    page.banner.label.setTextFormat(Qt.RichText)
    page.banner.label.setTextInteractionFlags(Qt.TextBrowserInteraction)
    page.banner.label.linkActivated.connect(page._link)
    buttons = _run_buttons(page)
    _progress(page)
    paths_row = _paths_row(page)
    _figures(page, project)
    page.log = RunLog()
    vsplit = splitter(Qt.Vertical, (page.plots, page.log), stretch=(4, 1), sizes=(480, 120))

    right = QWidget()
    rl = QVBoxLayout(right)
    rl.setContentsMargins(0, 0, 0, 0)
    rl.setSpacing(4)
    rl.addWidget(page.banner)
    rl.addLayout(buttons)
    rl.addWidget(page.reason_label)
    rl.addWidget(page.progress)
    rl.addWidget(page.stats_label)
    rl.addLayout(paths_row)
    rl.addWidget(vsplit, 1)

    page.splitter = splitter(Qt.Horizontal, (scroll, right), stretch=(0, 1))
    layout = QVBoxLayout(page)
    layout.setContentsMargins(6, 6, 6, 6)
    layout.addWidget(page.splitter)
