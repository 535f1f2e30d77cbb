"""Qt's item data roles and alignments as plain ints, for the models' `data()`.

PySide6 resolves an enum member such as `Qt.DisplayRole` through its enum machinery on every
access (2.8 us each, measured with PySide6 6.x), while a view asks every cell in sight for seven
or more roles on each paint: the Dataset table's `data` spent 9 of its 15 ms a repaint on those
lookups. Compare a role with these instead (the role a view passes is an int).
"""

from __future__ import annotations

from PySide6.QtCore import Qt

DISPLAY = int(Qt.DisplayRole)
DECORATION = int(Qt.DecorationRole)
EDIT = int(Qt.EditRole)
TOOLTIP = int(Qt.ToolTipRole)
FONT = int(Qt.FontRole)
ALIGNMENT = int(Qt.TextAlignmentRole)
BACKGROUND = int(Qt.BackgroundRole)
FOREGROUND = int(Qt.ForegroundRole)
CHECK_STATE = int(Qt.CheckStateRole)
USER = int(Qt.UserRole)

__all__ = [
    "ALIGNMENT",
    "BACKGROUND",
    "CHECK_STATE",
    "DECORATION",
    "DISPLAY",
    "EDIT",
    "FONT",
    "FOREGROUND",
    "TOOLTIP",
    "USER",
]
