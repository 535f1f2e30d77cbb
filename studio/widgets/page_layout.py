"""The top-level layout of a page that fills the height it is given.

The window puts each page in a scroll area (so a small window scrolls instead of cutting a page
off). A scroll area asks a page whose layout has height-for-width (any word-wrapped label in it)
for its *preferred* height at the view's width and makes the page that tall: the page grows past
the window and its bottom buttons scroll out of view although they would fit. `PageLayout` is a
QVBoxLayout that says it has no height-for-width, so the scroll area gives the page the view's
height (never less than the page's minimum size: then it scrolls). The page's own parts still
wrap their labels; lists and text areas inside it scroll.

`splitter` builds the splitters the pages divide themselves with.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget


class PageLayout(QVBoxLayout):
    """A QVBoxLayout without height-for-width (see the module docstring)."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return False


def splitter(
    orientation: Qt.Orientation,
    widgets: Sequence[QWidget],
    stretch: Sequence[int] = (),
    sizes: Sequence[int] = (),
    collapsible: bool = False,
) -> QSplitter:
    """A QSplitter holding `widgets` in order. `stretch`: their stretch factors (0 keeps a pane's
    size when the splitter grows); `sizes`: their first sizes in pixels; a pane can be dragged
    shut only when `collapsible`."""
    split = QSplitter(orientation)
    for widget in widgets:
        split.addWidget(widget)
    for index, factor in enumerate(stretch):
        split.setStretchFactor(index, factor)
    if sizes:
        split.setSizes(list(sizes))
    split.setChildrenCollapsible(collapsible)
    return split


__all__ = ["PageLayout", "splitter"]
