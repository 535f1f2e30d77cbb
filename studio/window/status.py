"""The window's status bar: the device, the app's memory (every 2 s), the training state and the
engine worker's jobs, made onto the window as its attributes (`build_status_bar(w)`)."""

from __future__ import annotations

import os

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel

from engine import human_bytes


def process_memory_bytes(pid: int | str = "self") -> int | None:
    """Resident memory of a process (this one by default; Linux /proc), or None where unavailable."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def build_status_bar(w) -> None:
    """The status bar's permanent labels, made onto the window `w`."""
    sb = w.statusBar()
    w.device_label = QLabel("Device: CPU (NumPy)")
    w.memory_label = QLabel("")
    w.state_label = QLabel("Training: idle")
    w.engine_label = QLabel(w.engine.describe())
    w.engine.sig_jobs_changed.connect(lambda: w.engine_label.setText(w.engine.describe()))
    for label in (w.device_label, w.memory_label, w.state_label, w.engine_label):
        label.setContentsMargins(8, 0, 8, 0)
        sb.addPermanentWidget(label)
    w.memory_timer = QTimer(w)
    w.memory_timer.timeout.connect(lambda: update_memory(w))
    w.memory_timer.start(2000)
    update_memory(w)


def update_memory(w) -> None:
    """The memory label: this process's resident memory."""
    n = process_memory_bytes()
    w.memory_label.setText(f"Memory: {human_bytes(n)}" if n is not None else "")
