"""Training on several processes from the Train page: N local ranks, or the command for N machines.

The app's engine runs one process; a data-parallel run (engine.train.parallel) is a `tune-engine
train ... --ranks N` started beside the app. `RunFiles` writes what such a run reads (its settings
as JSON, the editor's samples when they are not the saved dataset file) and names what it writes
(adapter, checkpoints, events, its output log). `ProcessRun` starts the command, reads the events
file as rank 0 writes it and hands each event to the page as the engine worker would, and ends
with the run's `Finished` or `Failed` (a `Failed` saying the exit status and the last lines of
the output when the processes ended without one). Stop sends the launcher an interrupt: every rank
stops after the same step and rank 0 writes the checkpoint and the adapter.

`MachinesDialog` gives the exact `mpiexec -n N -hosts a,b tune-engine train ...` line for a run
across machines (this machine first: rank 0 writes the events here) and can add its events file to
the Runs page, which follows it live.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, replace

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
)

from engine import (
    Checkpoint,
    Failed,
    Finished,
    Step,
    TrainConfig,
    check_outputs,
    follow_events,
    save_jsonl,
    shell_line,
    train_command,
)

from ...widgets.buttons import action_button
from ...widgets.runs import add_followed

POLL_MS = 250  # how often the events file and the processes are looked at
OUTPUT_TAIL = 12  # lines of the processes' output a failure shows


@dataclass(frozen=True)
class RunFiles:
    """The files of a run in other processes, all beside its adapter."""

    out: str  # the adapter
    checkpoint_dir: str
    settings: str  # <stem>-settings.json: the TrainConfig
    events: str  # <stem>-events.jsonl: rank 0's events
    output: str  # <stem>-output.log: what the processes print
    data: str  # the dataset file the processes read (the editor's samples saved beside, when edited)

    @classmethod
    def beside(cls, out: str, checkpoint_dir: str, dataset: str) -> RunFiles:
        stem = out[:-5] if out.endswith(".gguf") else out
        return cls(out, checkpoint_dir, stem + "-settings.json", stem + "-events.jsonl", stem + "-output.log",
                   dataset)  # fmt: skip

    def write(
        self, config: TrainConfig, samples=None, inputs: dict[str, str | None] | None = None
    ) -> RunFiles:
        """Write the settings (and the editor's samples); the files as the processes will read them.
        ConfigError, with nothing written, when one of the run's files beside the adapter would be an
        input (`inputs`: the model, the chat template; and the dataset), another of them, or a file of
        another kind (engine.check_outputs: the rule every output follows)."""
        samples_path = (
            self.settings[: -len("-settings.json")] + "-data.jsonl" if samples is not None else None
        )
        check_outputs(
            {"run settings": self.settings, "events file": self.events,
             "output of the processes": self.output, "edited samples": samples_path},
            {**(inputs or {}), "dataset": self.data},
            kinds={"run settings": "json", "events file": "events", "edited samples": "jsonl"},
        )  # fmt: skip
        os.makedirs(os.path.dirname(os.path.abspath(self.settings)), exist_ok=True)
        config = replace(config, out=self.out, checkpoint_dir=self.checkpoint_dir)
        tmp = self.settings + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(config.to_json(), f, indent=1)
        os.replace(tmp, self.settings)
        if samples is None:
            return self
        save_jsonl(samples_path, samples)
        return replace(self, data=samples_path)

    def command(self, model: str, *, ranks: int, hosts=(), template_file=None, device="cpu", resume=None,
                accept_changes=False) -> list[str]:  # fmt: skip
        return train_command(
            model, self.data, settings=self.settings, out=self.out, checkpoint_dir=self.checkpoint_dir,
            events=self.events, ranks=ranks, hosts=tuple(hosts), template_file=template_file, device=device,
            program=None if hosts else [sys.executable, "-m", "engine.cli"], resume=resume,
            accept_changes=accept_changes,
        )  # fmt: skip


class ProcessRun(QObject):
    """A run of `tune-engine train --ranks N` beside the app, followed through its events file."""

    sig_event = Signal(object)  # every event rank 0 writes, in order
    sig_done = Signal(object)  # the run's Finished or Failed

    def __init__(self, command: list[str], files: RunFiles, parent: QObject | None = None):
        super().__init__(parent)
        self.command = command
        self.files = files
        self.proc: subprocess.Popen | None = None
        self._offset = 0
        self._last_step = 0
        self._last_ckpt: str | None = None
        self._result: Finished | Failed | None = None
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.poll)

    def start(self) -> None:
        for stale in (self.files.events, self.files.output):  # a new run: nothing of an older one is read
            if os.path.exists(stale):
                os.unlink(stale)
        log = open(self.files.output, "wb")  # noqa: SIM115 - the child holds it; closed here after the start
        try:
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            # its own session: the app's terminal signals never reach the ranks; Stop sends its own
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)  # fmt: skip
        finally:
            log.close()
        self.timer.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Every rank stops after the current step; rank 0 writes the checkpoint and the adapter."""
        if self.running:
            os.kill(self.proc.pid, signal.SIGINT)

    def poll(self) -> None:
        events, self._offset = follow_events(self.files.events, self._offset)
        for e in events:
            if isinstance(e, Finished | Failed):
                self._result = e
            elif isinstance(e, Step):
                self._last_step = e.step
            elif isinstance(e, Checkpoint):
                self._last_ckpt = e.path
            self.sig_event.emit(e)
        if self.proc is None or self.proc.poll() is None:
            return
        more, self._offset = follow_events(self.files.events, self._offset)
        if more:  # written between the read above and the exit
            for e in more:
                if isinstance(e, Finished | Failed):
                    self._result = e
                self.sig_event.emit(e)
        self.timer.stop()
        code = self.proc.returncode
        result = self._result
        if result is None or (code != 0 and isinstance(result, Finished)):
            result = Failed(self._last_step + 1 if self._last_step else 0,
                            f"the training processes ended with exit status {code}: {self.output_tail()}",
                            self._last_ckpt)  # fmt: skip
        self.sig_done.emit(result)

    def output_tail(self) -> str:
        try:
            with open(self.files.output, encoding="utf-8", errors="replace") as f:
                lines = [x.rstrip() for x in f if x.strip()]
        except OSError:
            return "(no output)"
        return " | ".join(lines[-OUTPUT_TAIL:]) or "(no output)"


class MachinesDialog(QDialog):
    """The command of a run across machines, to copy; its events file followed on the Runs page."""

    def __init__(self, files: RunFiles, model: str, *, ranks: int, template_file=None, device="cpu",
                 settings=None, parent=None):  # fmt: skip
        super().__init__(parent)
        self.setWindowTitle("Train across machines")
        self.files, self.model = files, model
        self.template_file, self.device = template_file, device
        self.qsettings = settings
        self.hosts = QLineEdit()
        self.hosts.setPlaceholderText("this-machine,other-machine")
        self.hosts.setToolTip("The machines, comma separated, this one first (rank 0 writes the events "
                              "here). mpiexec reaches the others over ssh.")  # fmt: skip
        self.ranks = QSpinBox()
        self.ranks.setRange(2, 4096)
        self.ranks.setValue(max(2, ranks))
        self.ranks.setToolTip("Processes in all; mpiexec spreads them over the machines")
        self.command_text = QPlainTextEdit()
        self.command_text.setReadOnly(True)
        self.command_text.setMinimumHeight(90)
        copy = QPushButton("Copy command")
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.command_line()))
        self.follow_button = action_button(
            "Follow on the Runs page",
            self.follow,
            "List this run on the Runs page and draw its loss as the events file grows",
        )
        note = QLabel(
            "Run this line in a terminal on this machine. Every machine needs Tune Studio with the mpi extra "
            "(pip install 'tune-studio[mpi]'), the same model file, dataset and settings file at these paths "
            "(the ranks check size and SHA-256 before step 1 and refuse to start when anything differs), "
            "and ssh access without a password from this one. Rank 0 writes the adapter, the checkpoints and "
            f"the events here:\n{files.events}"
        )
        note.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Machines:", self.hosts)
        form.addRow("Processes:", self.ranks)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        buttons.addButton(copy, QDialogButtonBox.ActionRole)
        buttons.addButton(self.follow_button, QDialogButtonBox.ActionRole)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.command_text)
        layout.addWidget(note)
        layout.addWidget(buttons)
        self.hosts.textChanged.connect(self._update)
        self.ranks.valueChanged.connect(self._update)
        self.resize(760, 360)
        self._update()

    def host_list(self) -> list[str]:
        return [h.strip() for h in self.hosts.text().split(",") if h.strip()] or ["localhost"]

    def command_line(self) -> str:
        cmd = self.files.command(self.model, ranks=self.ranks.value(), hosts=self.host_list(),
                                 template_file=self.template_file, device=self.device)  # fmt: skip
        return shell_line(cmd)

    def _update(self) -> None:
        self.command_text.setPlainText(self.command_line())

    def follow(self) -> None:
        add_followed(self.qsettings, self.files.events)
        self.follow_button.setText("Followed on the Runs page")
        self.follow_button.setEnabled(False)
