"""The top-level layout of a page that fills the height it is given.

The window puts each page in a scroll area (so a small window scrolls instead of cutting a page
off). A scroll area asks a page whose layout has height-for-width (any word-wrapped label in it)
for its *preferred* height at the view's width and makes the page that tall: the page grows past
the window and its bottom buttons scroll out of view although they would fit. `PageLayout` is a
QVBoxLayout that says it has no height-for-width, so the scroll area gives the page the view's
height (never less than the page's minimum size: then it scrolls). The page's own parts still
wrap their labels; lists and text areas inside it scroll.
"""

from __future__ import annotations

from PySide6.QtWidgets import QVBoxLayout


class PageLayout(QVBoxLayout):
    """A QVBoxLayout without height-for-width (see the module docstring)."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return False


__all__ = ["PageLayout"]
