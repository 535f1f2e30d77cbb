"""Listening to a Project or a DatasetDocument from a Qt object without keeping it alive.

`Project.subscribe` and `DatasetDocument.subscribe` hold their listeners strongly, so a listener that
is a bound method would keep a closed page (or model, or autosave) alive and still call it.
`listen_while_alive` subscribes a listener that holds its owner weakly, and unsubscribes it when the
owner is destroyed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from PySide6.QtCore import QObject

Owner = TypeVar("Owner", bound=QObject)


class Observable(Protocol):
    def subscribe(self, listener: Callable[[Any], None]) -> None: ...

    def unsubscribe(self, listener: Callable[[Any], None]) -> None: ...


def listen_while_alive(owner: Owner, source: Observable, handler: Callable[[Owner, Any], None]) -> None:
    """Call `handler(owner, change)` on each change of `source` while `owner` lives; `handler` is a
    plain function (an unbound method), so that the listener does not hold `owner`."""
    ref = weakref.ref(owner)

    def listener(change: Any) -> None:
        alive = ref()
        if alive is not None:
            handler(alive, change)

    source.subscribe(listener)
    owner.destroyed.connect(lambda *_: source.unsubscribe(listener))


__all__ = ["listen_while_alive"]
