"""A guard against a reference-counting defect of PySide6 6.12.0 on Python < 3.12.

PySide6/shiboken6 6.12.0 returns `None` from every void method (`setPen`, `processEvents`,
`setEnabled`, ...) and `True` from `Signal.emit` without taking a reference, as if these objects were
immortal, which they are only from Python 3.12 on (PEP 683). On Python 3.10/3.11 each such call
drops one reference that was never taken, and after a few thousand calls the interpreter aborts with
"Fatal Python error: none_dealloc: deallocating None" (or bool_dealloc). A live pyqtgraph plot
makes hundreds of void calls per repaint and the training worker emits a signal per event, so
the Train page crashed within seconds.

`guard_singletons()` gives None, True and False a reference count so large that no run can exhaust
it, which is what Python 3.12 does for them anyway. It does nothing on Python >= 3.12 or on a
PySide6 without the defect (checked once, by measuring). It is a workaround, not a fix: the real
fix is a PySide6 without the defect (6.11.x, or a later 6.12.x).
"""

from __future__ import annotations

import ctypes
import sys

_IMMORTAL = 1 << 60  # no realistic number of leaked decrefs reaches zero from here
_done = False


def pyside_drops_none_refs() -> bool:
    """True when a PySide6 void method call loses a reference to None (measured, 200 calls)."""
    from PySide6.QtCore import QObject

    o = QObject()
    before = sys.getrefcount(None)
    for _ in range(200):
        o.setObjectName("probe")
    return sys.getrefcount(None) < before - 100


def guard_singletons() -> bool:
    """Protect None/True/False from PySide6 6.12's missing references; True if it had to."""
    global _done
    if _done or sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    if hasattr(sys, "getobjects"):  # a Py_TRACE_REFS build: the refcount is not the first field
        return False
    _done = True
    if not pyside_drops_none_refs():
        return False
    for obj in (None, True, False):
        ctypes.c_ssize_t.from_address(id(obj)).value = _IMMORTAL
    return True


__all__ = ["guard_singletons", "pyside_drops_none_refs"]
