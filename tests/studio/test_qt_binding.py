"""The installed Qt binding keeps Python's reference counts: PySide6 6.12.0 under Python 3.11 lost one
reference to None or True per call and aborted the interpreter after a few thousand calls."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel


class _Emitter(QObject):
    sig = Signal(list)


def test_calls_returning_none_or_bool_keep_reference_counts(qtbot):
    label = QLabel()
    qtbot.addWidget(label)
    emitter = _Emitter()
    for name, call in (
        ("QLabel.setText", lambda: label.setText("x")),
        ("Signal.emit", lambda: emitter.sig.emit([])),
        ("QWidget.isVisible", label.isVisible),
    ):
        before = sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)
        for _ in range(500):
            call()
        after = sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)
        lost = [b - a for a, b in zip(after, before, strict=True)]
        assert max(lost) < 50, f"{name}: 500 calls lost {lost} references to (None, True, False)"
