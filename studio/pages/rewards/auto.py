"""The Rewards page's Unattended tab: rounds of sample, score with checks, step, with nobody rating.

The person picks the prompts (the project's dataset as the editor shows it: a prompt/response or
conversation sample gives its prompt and, as the reference a check compares with, its answer; or a
prompts file: text or JSON Lines, `engine.load_prompts`), the checks (`ChecksWidget`: the built-in
ones with their option and weight, and their own Python file with `def reward(prompt, answer,
**sample)`, loaded only when a run starts with it ticked), the rounds and the prompts per round.
Start runs `engine.AutoRounds` on the page's reward session as one job of the engine worker: each
round samples the Answers setting's K answers per prompt, scores them, and takes one
group-relative step; its `RoundReport` adds a row to the table (mean and spread of the reward, the
share of prompts with no signal, answers, errors, loss), a point to the plot and example answers
with their scores and errors. Pause takes effect after the round and Start resumes with the next
one; Stop ends the rounds (a round cut short while sampling takes no step). Every scored answer is
appended to the ratings file, as ratings are.

What it is not: it decides nothing about answers itself (the checks do) and adds no steps of its own.

A little over 600 lines on purpose: the prompts, the checks, the rounds' start, pause and stop and
the report rows all act on one run of `AutoRounds`; the checks box (`ChecksWidget`) is the one part
that stands alone, and it is too short to be worth a module of its own.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import (
    AutoRounds,
    CheckSpec,
    EngineError,
    RoundProgress,
    RoundReport,
    RoundsConfig,
    Scorer,
    load_jsonl,
    load_prompts,
    prompt_from_json,
    sample_to_json,
)

from ...widgets.buttons import action_button
from ...widgets.faint_label import FaintLabel
from ...widgets.page_layout import scroll_area, splitter
from ...widgets.plot_parts import COLORS, make_legend, marker, plot_widget, style_plot
from ...widgets.wrapping_label import wrapping_label

# (check, option placeholder, default option, what it does)
BUILTIN_ROWS = (
    ("exact", ":i ignores case", "", "1 when the answer equals the reference answer (spaces collapsed)"),
    ("contains", ":i ignores case", "", "1 when the reference answer occurs in the answer"),
    ("regex", "pattern, e.g. ^[0-9]+$", "", "1 when the pattern (Python re) is found in the answer"),
    (
        "number",
        "tolerance, e.g. 0.01 or 1%",
        "",
        "1 when the answer's last number is within the tolerance of the reference's",
    ),
    ("json", "", "", "1 when the answer is valid JSON (a ```json block counts)"),
    ("length", "MIN-MAX characters", "1-400", "1 when the answer's length is within the bounds"),
)
COLUMNS = ("Round", "Mean", "Spread", "No signal", "Answers", "Errors", "Loss")


def prompts_of_samples(samples) -> list:
    """The dataset's samples as prompts for rounds (engine PromptItem): the prompt of each, and its
    answer (a preference pair: its chosen one) as the reference a check compares with; text samples
    have no prompt and are left out."""
    items, seen = [], set()
    for s in samples:
        if s.kind == "text":
            continue
        obj = sample_to_json(s)
        if s.kind == "preference":  # a pair's chosen answer is the reference
            obj = {k: v for k, v in obj.items() if k not in ("chosen", "rejected")} | {
                "reference": obj["chosen"]
            }
        item, _ = prompt_from_json(obj, s.line)
        if item is not None and (item.prompt, item.system) not in seen:
            seen.add((item.prompt, item.system))
            items.append(item)
    return items


class ChecksWidget(QGroupBox):
    """The checks of the rounds and their weights: built-in ones and the person's own Python file."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Checks", parent)
        self.rows: dict[str, tuple[QCheckBox, QLineEdit, QDoubleSpinBox]] = {}
        grid = QGridLayout(self)
        grid.setContentsMargins(6, 4, 6, 4)
        grid.setVerticalSpacing(2)
        grid.addWidget(QLabel("weight"), 0, 2)
        for r, (name, hint, default, meaning) in enumerate(BUILTIN_ROWS, start=1):
            box = QCheckBox(name)
            box.setToolTip(meaning)
            arg = QLineEdit(default)
            arg.setPlaceholderText(hint)
            arg.setToolTip(f"{meaning}. Option: {hint or 'none'}.")
            arg.setEnabled(bool(hint))
            weight = QDoubleSpinBox()
            weight.setRange(-100.0, 100.0)
            weight.setDecimals(2)
            weight.setSingleStep(0.1)
            weight.setValue(1.0)
            weight.setToolTip("This check's share of the reward: reward = sum of weight × check")
            self.rows[name] = (box, arg, weight)
            grid.addWidget(box, r, 0)
            grid.addWidget(arg, r, 1)
            grid.addWidget(weight, r, 2)
        self.rows["exact"][0].setChecked(True)
        r = len(BUILTIN_ROWS) + 1
        self.python_box = QCheckBox("Python file")
        self.python_box.setToolTip(
            "Your own check: a .py file with def reward(prompt, answer, **sample) -> float (sample: the "
            "prompt's line, its reference answer as reference). It runs only when a run starts with it "
            "ticked; an error is shown with the answer it failed on."
        )
        self.python_button = QPushButton("Choose…")
        self.python_button.clicked.connect(self.choose_python)
        self.python_path = ""
        self.python_weight = QDoubleSpinBox()
        self.python_weight.setRange(-100.0, 100.0)
        self.python_weight.setValue(1.0)
        self.python_box.setEnabled(False)
        grid.addWidget(self.python_box, r, 0)
        grid.addWidget(self.python_button, r, 1)
        grid.addWidget(self.python_weight, r, 2)
        r += 1
        self.rating_weight = QDoubleSpinBox()
        self.rating_weight.setRange(0.0, 100.0)
        self.rating_weight.setSingleStep(0.25)
        self.rating_weight.setValue(1.0)
        self.rating_weight.setToolTip(
            'With "Score with checks" on the Rate answers tab: the weight of your rating beside the checks '
            "(reward = checks + weight × rating); 0 = the checks alone. Default: 1."
        )
        label = QLabel("Your rating (Rate answers tab)")
        label.setToolTip(self.rating_weight.toolTip())
        grid.addWidget(label, r, 0, 1, 2)
        grid.addWidget(self.rating_weight, r, 2)
        grid.setColumnStretch(1, 1)

    def choose_python(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Your reward function", "", "Python files (*.py)")
        if path:
            self.set_python_file(path)

    def set_python_file(self, path: str) -> None:
        """Pick a Python file (it is not run here)."""
        self.python_path = path
        self.python_box.setText(f"{os.path.basename(path)}")
        self.python_box.setToolTip(path)
        self.python_box.setEnabled(True)
        self.python_box.setChecked(True)

    def set_check(self, name: str, on: bool, arg: str | None = None, weight: float | None = None) -> None:
        box, edit, spin = self.rows[name]
        box.setChecked(on)
        if arg is not None:
            edit.setText(arg)
        if weight is not None:
            spin.setValue(weight)

    def specs(self) -> list[CheckSpec]:
        """The ticked checks (CheckError is raised later, by the Scorer, for a bad option)."""
        out = []
        for name, (box, arg, weight) in self.rows.items():
            if box.isChecked():
                out.append(CheckSpec(name, arg.text().strip(), float(weight.value())))
        if self.python_box.isChecked() and self.python_path:
            out.append(CheckSpec("python", self.python_path, float(self.python_weight.value())))
        return out


class AutoRoundsWidget(QWidget):
    """Unattended rounds on the Rewards page (see the module docstring)."""

    sig_round = Signal(object)  # engine RoundReport of each round
    sig_state_changed = Signal(str)  # idle, running, pausing, paused, stopping, finished, failed

    def __init__(self, page, parent: QWidget | None = None):
        super().__init__(parent)
        self.page = page  # the RewardsPage: its session, settings, dataset and engine
        self._source_stale = True  # the prompt count waits until the tab is shown (show_source)
        self.state = "idle"
        self.job = None
        self.rounds: AutoRounds | None = None  # kept between Pause and Resume
        self.reports: list[RoundReport] = []
        self.prompts_file = ""

        self.source_combo = QComboBox()
        self.source_combo.addItem("The project's dataset", "dataset")
        self.source_combo.addItem("A prompts file…", "file")
        self.source_combo.setToolTip(
            "Where the prompts come from: the dataset the editor shows (each sample's prompt, its answer "
            'as the reference), or a text file (one prompt per line) or JSON Lines file ({"prompt", '
            '"reference"} and any fields your check reads).'
        )
        self.source_combo.activated.connect(self._source_chosen)
        self.source_label = FaintLabel(wrap=True)
        self.rounds_spin = QSpinBox()
        self.rounds_spin.setRange(1, 100000)
        self.rounds_spin.setValue(10)
        self.rounds_spin.setToolTip("Rounds to run: each samples, scores and takes one step. Default: 10.")
        self.per_round_spin = QSpinBox()
        self.per_round_spin.setRange(0, 100000)
        self.per_round_spin.setValue(8)
        self.per_round_spin.setSpecialValueText("all")
        self.per_round_spin.setToolTip(
            "Prompts each round samples answers for (the next ones, shuffled; 0 = all). The Answers "
            "setting on the left is the answers per prompt. Default: 8."
        )
        self.checks = ChecksWidget()
        self.start_button = action_button(
            "Start", self.start, "Run the rounds (a paused run goes on with its next round)"
        )
        self.pause_button = action_button(
            "Pause", self.pause, "Stop after the current round; Start goes on from the next one"
        )
        self.stop_button = action_button(
            "Stop", self.stop, "End the rounds now (a round being sampled takes no step)"
        )
        self.status = wrapping_label()

        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Prompts:", self.source_combo)
        form.addRow(self.source_label)
        form.addRow("Rounds:", self.rounds_spin)
        form.addRow("Prompts per round:", self.per_round_spin)
        buttons = QHBoxLayout()
        for b in (self.start_button, self.pause_button, self.stop_button):
            buttons.addWidget(b)
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addLayout(form)
        ll.addWidget(self.checks)
        ll.addLayout(buttons)
        ll.addWidget(self.status)
        ll.addStretch(1)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.itemSelectionChanged.connect(self._show_selected)
        self.plot_widget = plot_widget()
        plot = style_plot(self.plot_widget, "Reward per round", "reward", "round")
        self.plot_widget.setToolTip(
            "Mean reward of each round's answers (the band: ± their spread) and the share of prompts whose "
            "answers all scored alike (no signal: nothing to learn from them)."
        )
        make_legend(self.plot_widget, offset=(-10, 10))
        self.mean_curve = plot.plot(
            name="mean", pen=pg.mkPen(COLORS[0], width=2), **marker(COLORS[0], size=5)
        )
        self.upper = plot.plot(pen=pg.mkPen(None))
        self.lower = plot.plot(pen=pg.mkPen(None))
        band = pg.mkColor(COLORS[0])
        band.setAlpha(50)
        self.band = pg.FillBetweenItem(self.upper, self.lower, brush=pg.mkBrush(band))
        plot.addItem(self.band)
        self.flat_curve = plot.plot(
            name="no signal (share)", pen=pg.mkPen(COLORS[3], width=1.5, style=Qt.DashLine)
        )
        plot.enableAutoRange()
        self.examples = QPlainTextEdit()
        self.examples.setReadOnly(True)
        self.examples.setPlaceholderText(
            "Example answers of the selected round (the best and the worst) appear here."
        )
        right = splitter(Qt.Vertical, (self.table, self.plot_widget, self.examples), sizes=(160, 180, 160))
        # a narrow window scrolls the controls rather than cutting them
        scroll = scroll_area(left, sideways=True)
        scroll.setMinimumWidth(160)
        # the controls' whole width where the window has it (the checks' weights and Stop were cut at
        # 260 on a 1280-wide page); only a narrower window scrolls them
        split = splitter(
            Qt.Horizontal,
            (scroll, right),
            stretch=(0, 1),
            sizes=(left.sizeHint().width() + scroll.verticalScrollBar().sizeHint().width() + 2, 420),
        )
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(split)
        self.show_source()
        self._set_state("idle")

    # --- prompts --------------------------------------------------------------------------------
    def _source_chosen(self, index: int) -> None:
        if self.source_combo.itemData(index) == "file":
            path, _ = QFileDialog.getOpenFileName(
                self,
                "Prompts file",
                self.page.project.output_folder(),
                "Prompts (*.jsonl *.json *.txt);;All files (*)",
            )
            if path:
                self.set_prompts_file(path)
            elif not self.prompts_file:
                self.source_combo.setCurrentIndex(0)
        self.show_source()

    def set_prompts_file(self, path: str | None) -> None:
        """Take the prompts from this file (None: from the project's dataset)."""
        self.prompts_file = path or ""
        self.source_combo.setCurrentIndex(1 if path else 0)
        self.show_source()

    def _dataset_items(self) -> list:
        samples = self.page.samples
        if (
            samples is None
            and self.page.project.dataset_path
            and os.path.isfile(self.page.project.dataset_path)
        ):
            samples, _ = load_jsonl(self.page.project.dataset_path)
        return prompts_of_samples(samples or [])

    def show_source(self) -> None:
        """Say where the rounds' prompts come from. Counting a dataset's prompts reads every sample
        (about 2 s for 100,000 on the UI thread), so it waits until the tab is shown."""
        if not self.isVisible():
            self._source_stale = True
            return
        self._source_stale = False
        if self.source_combo.currentData() == "file" and self.prompts_file:
            self.source_label.setText(self.prompts_file)
        else:
            try:
                n = len(self._dataset_items())
            except (EngineError, OSError):
                n = 0
            self.source_label.setText(
                f"{n} prompt{'s' if n != 1 else ''} in the dataset"
                if n
                else "The dataset has no prompt yet: open one on the Dataset page, or choose a file."
            )

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if self._source_stale:
            self.show_source()

    # --- running --------------------------------------------------------------------------------
    def page_busy(self, busy: str) -> None:
        """The page runs another task (generating, applying, …): no Start meanwhile."""
        if busy and busy != "rounds":
            self.start_button.setEnabled(False)
        elif not busy:
            self._set_state(self.state)

    def _set_state(self, state: str) -> None:
        self.state = state
        running = state in ("running", "pausing", "stopping")
        self.start_button.setEnabled(state in ("idle", "paused", "finished", "failed"))
        self.start_button.setText("Resume" if state == "paused" else "Start")
        self.pause_button.setEnabled(state == "running")
        self.stop_button.setEnabled(state in ("running", "paused"))
        for w in (self.checks, self.source_combo, self.rounds_spin, self.per_round_spin):
            w.setEnabled(not running and state != "paused")
        self.sig_state_changed.emit(state)

    def start(self) -> bool:
        """Start (or resume) the rounds in the worker; False (and why, in the page) if they cannot."""
        page = self.page
        if page.busy or self.state in ("running", "pausing", "stopping"):
            return False
        resume = self.state == "paused" and self.rounds is not None and not self.rounds.finished
        config = page.ready_config("Start")
        if config is None:
            return False
        if config.mode != "group":
            page.show_error(
                "Unattended rounds take group-relative steps: set Mode to group on the left.", "info"
            )
            return False
        specs = self.checks.specs()
        if not resume and not specs:
            page.show_error("Tick at least one check: the rounds need something to score the answers with.")
            return False
        from_file = self.source_combo.currentData() == "file" and self.prompts_file
        items = None
        if not resume and not from_file:
            items = self._dataset_items()
            if not items:
                page.show_error(
                    "The dataset has no prompt to sample answers for: open one on the Dataset page, "
                    "or choose a prompts file."
                )
                return False
        page.banner.hide()
        open_session, model = page.session_opener(config)
        rounds = self.rounds if resume else None
        settings = RoundsConfig(
            rounds=int(self.rounds_spin.value()),
            prompts_per_round=int(self.per_round_spin.value()),
            seed=int(page.reward_settings.seed_spin.value()),
        )
        prompts_file = self.prompts_file

        def job(engine_session, job):
            s = open_session(engine_session)
            r = rounds
            problems = []
            if r is None:
                try:
                    scorer = Scorer(specs)  # a person's file runs here, now that they start with it
                    if items is None:
                        loaded, problems = load_prompts(prompts_file)
                    else:
                        loaded = items
                    r = AutoRounds(s, loaded, scorer, settings)
                except EngineError as exc:
                    return s, None, str(exc), []
            job.emit(r)
            try:
                r.run(job.emit, job.should_stop, job.should_pause)
            except EngineError as exc:
                return s, r, str(exc), problems
            return s, r, None, problems

        if not resume:
            self.reports = []
            self.table.setRowCount(0)
            self.examples.clear()
            self._plot()
        page._set_busy("rounds")
        self._set_state("running")
        self.status.setText("Loading the model…" if model else "Starting…")
        self.job = page.engine.submit(
            "unattended rounds",
            job,
            on_event=self._on_event,
            on_done=lambda result: self._done(result, model),
            on_error=self._failed,
            model=(page.info.path if page.info is not None else page.project.model_path, page.project.device),
        )
        page.job = self.job
        return True

    def pause(self) -> None:
        if self.state == "running" and self.job is not None:
            self.job.request_pause()
            self._set_state("pausing")
            self.status.setText("Pausing after this round…")

    def stop(self) -> None:
        if self.state in ("running", "pausing") and self.job is not None:
            self.job.request_stop()
            self._set_state("stopping")
            self.status.setText("Stopping…")
        elif self.state == "paused":
            if self.rounds is not None:
                self.rounds.stopped = True
            self._set_state("finished")
            self.status.setText(self._summary("Stopped"))

    def _on_event(self, event: object) -> None:
        if isinstance(event, AutoRounds):
            self.rounds = event
        elif isinstance(event, RoundProgress):
            self.status.setText(
                f"Round {event.round} of {event.rounds}: answers to prompt {event.index} of "
                f"{event.n_prompts}…"
            )
        elif isinstance(event, RoundReport):
            self.reports.append(event)
            self._add_row(event)
            self._plot()
            self.table.selectRow(self.table.rowCount() - 1)
            self.sig_round.emit(event)

    def _done(self, result, model) -> None:
        page = self.page
        s, rounds, error, problems = result
        self.job = None
        page.job = None
        page._set_busy("")
        page._adopt(s, model)
        page.history.set_rounds(s.history)
        page._show_paths()
        self.rounds = rounds
        if error is not None:
            self._set_state("failed")
            page.show_error(
                f"The rounds could not run: {error}. Fix the checks or the prompts, then press Start."
            )
            self.status.setText("")
            return
        if problems:
            page.show_error(
                f"{len(problems)} line(s) of the prompts file were left out, e.g. {problems[0]}.", "warning"
            )
        if rounds.finished or rounds.stopped:
            self._set_state("finished")
            self.status.setText(self._summary("Stopped" if rounds.stopped else "Done"))
        else:
            self._set_state("paused")
            self.status.setText(self._summary("Paused") + " Resume goes on with the next round.")
        page.refresh_runs()

    def _failed(self, message: str) -> None:
        self.job = None
        self.page.job = None
        self.page._set_busy("")
        self._set_state("failed")
        self.page.show_error(f"The rounds stopped: {message}.")

    def _summary(self, what: str) -> str:
        r = self.reports
        if not r:
            return f"{what}: no round finished."
        first, last = r[0], r[-1]
        return (
            f"{what} after {len(r)} round{'s' if len(r) != 1 else ''}: mean reward {first.mean:.3f} in round "
            f"{first.round}, {last.mean:.3f} in round {last.round}; {last.step} steps in all."
        )

    # --- showing --------------------------------------------------------------------------------
    def _add_row(self, r: RoundReport) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        loss = f"{r.loss:.4f}" if math.isfinite(r.loss) else "no step"
        values = (
            str(r.round),
            f"{r.mean:.3f}",
            f"{r.std:.3f}",
            f"{r.no_signal:.0%}",
            str(r.n_answers),
            str(r.n_errors),
            loss,
        )
        for col, text in enumerate(values):
            item = QTableWidgetItem(text)
            item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            self.table.setItem(row, col, item)
        if r.n_errors:
            self.table.item(row, 5).setToolTip(next(iter(r.error_examples[0].errors.values()), ""))

    def _plot(self) -> None:
        r = self.reports
        x = np.array([e.round for e in r], dtype=float)
        mean = np.array([e.mean for e in r], dtype=float)
        std = np.array([e.std for e in r], dtype=float)
        self.mean_curve.setData(x, mean)
        self.upper.setData(x, mean + std)
        self.lower.setData(x, mean - std)
        self.flat_curve.setData(x, np.array([e.no_signal for e in r], dtype=float))

    def _show_selected(self) -> None:
        rows = {i.row() for i in self.table.selectedItems()}
        if not rows:
            return
        r = self.reports[min(rows)]
        self.examples.setPlainText(self.examples_text(r))

    @staticmethod
    def examples_text(r: RoundReport) -> str:
        """A round's example answers with their scores (and the errors of failed checks)."""
        lines = [
            f"Round {r.round}: mean reward {r.mean:.3f} ± {r.std:.3f}, {r.no_signal:.0%} of the prompts "
            "with no signal"
        ]
        for e in r.examples:
            parts = ", ".join(f"{k} {v:g}" for k, v in e.parts.items() if v is not None)
            lines.append(f"\n{e.reward:+.3f}  ({parts})\n  prompt: {e.prompt}\n  answer: {e.answer}")
        for e in r.error_examples:
            errors = "; ".join(f"{k}: {v}" for k, v in e.errors.items())
            lines.append(f"\nleft out: {errors}\n  prompt: {e.prompt}\n  answer: {e.answer}")
        return "\n".join(lines)


__all__ = ["AutoRoundsWidget", "ChecksWidget", "prompts_of_samples"]
