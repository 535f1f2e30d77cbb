"""The top-level layout of a page that fills the height it is given.

The window puts each page in a scroll area (so a small window scrolls instead of cutting a page
off). A scroll area asks a page whose layout has height-for-width (any word-wrapped label in it)
for its *preferred* height at the view's width and makes the page that tall: the page grows past
the window and its bottom buttons scroll out of view although they would fit. `PageLayout` is a
QVBoxLayout that says it has no height-for-width, so the scroll area gives the page the view's
height (never less than the page's minimum size: then it scrolls). The page's own parts still
wrap their labels; lists and text areas inside it scroll.

`banner_over` lays out a page that is a message banner over one body; `scroll_area` and `splitter`
build the scroll areas and splitters the pages divide themselves with.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QSplitter, QVBoxLayout, QWidget


class PageLayout(QVBoxLayout):
    """A QVBoxLayout without height-for-width (see the module docstring)."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return False


def banner_over(page: QWidget, banner: QWidget, body: QWidget) -> PageLayout:
    """Lay `page` out as its message banner over `body`, which takes the rest of the height."""
    layout = PageLayout(page)  # fills the height it is given: the buttons stay in view
    layout.setContentsMargins(6, 6, 6, 6)
    layout.setSpacing(4)
    layout.addWidget(banner)
    layout.addWidget(body, 1)
    return layout


def scroll_area(widget: QWidget, sideways: bool = False) -> QScrollArea:
    """A frameless scroll area that fits `widget` to its width and scrolls it up and down (sideways
    too when `sideways` and the widget is wider than the area)."""
    scroll = QScrollArea()
    scroll.setWidget(widget)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.NoFrame)
    if not sideways:
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    return scroll


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


__all__ = ["PageLayout", "banner_over", "scroll_area", "splitter"]
