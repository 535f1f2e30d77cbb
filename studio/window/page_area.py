"""The window's page area and navigation: each page sits in a `PageAreaWidget` (a page that needs more
room than the window has scrolls instead of being cut off), and `nav_width` sizes the navigation."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QTimer
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QFrame, QListWidget, QScrollArea, QWidget

NAV_ROOM = 8  # pages the navigation is wide enough for ("8  Rewards")


class PageAreaWidget(QScrollArea):
    """Holds one page: the page fills the area, and a page that needs more room than the window has
    scrolls instead of being cut off. Unlike `setWidgetResizable`, which makes a page with a
    word-wrapped label as tall as its size hint, the page gets its minimum height for the width."""

    def __init__(self, page: QWidget, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.NoFrame)
        self.setWidgetResizable(False)
        self.setWidget(page)
        self._refit = QTimer(self)  # its minimum changes (a message shown): fit it again, once
        self._refit.setSingleShot(True)
        self._refit.setInterval(0)
        self._refit.timeout.connect(self.fit)
        page.installEventFilter(self)

    def fit(self) -> None:
        page = self.widget()
        if page is None:
            return
        view = self.maximumViewportSize()  # the viewport without scroll bars
        bar_w = self.verticalScrollBar().sizeHint().width()
        bar_h = self.horizontalScrollBar().sizeHint().height()
        minimum = page.minimumSizeHint().expandedTo(page.minimumSize())
        layout = page.layout()

        def min_height(width: int) -> int:
            if layout is not None and layout.hasHeightForWidth():
                return max(minimum.height(), layout.totalMinimumHeightForWidth(width))
            return minimum.height()

        avail_w, avail_h = view.width(), view.height()
        for _ in range(2):  # a scroll bar one way takes room the other way
            width = max(avail_w, minimum.width())
            height = min_height(width)
            if width > avail_w and avail_h == view.height():
                avail_h = view.height() - bar_h
            if height > avail_h and avail_w == view.width():
                avail_w = view.width() - bar_w
                continue
            break
        width = max(avail_w, minimum.width())
        page.resize(width, max(avail_h, min_height(width)))

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self.fit()

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if watched is self.widget() and event.type() == QEvent.LayoutRequest:
            self._refit.start()
        return super().eventFilter(watched, event)


def nav_width(nav: QListWidget, names: list[str]) -> int:
    """Wide enough for the longest "N  Name" with its padding, with room for NAV_ROOM pages."""
    nav.ensurePolished()  # the style sheet's font and padding
    items = nav.sizeHintForColumn(0)
    font = nav.font()
    font.setPixelSize(14)  # the list's style sheet
    fm = QFontMetrics(font)
    shown = max(fm.horizontalAdvance(f"{i + 1}  {name}") for i, name in enumerate(names))
    room = fm.horizontalAdvance(f"{NAV_ROOM}  Rewards")
    return max(items, items - shown + room) + 2 * nav.frameWidth() + 2 * nav.spacing() + 8
