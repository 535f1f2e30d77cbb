"""What the pages that sample answers (Chat, Rewards) decide alike, in plain Python without Qt.

- `StreamBuffer`: what a generation streams, answer by answer. The engine worker appends a piece
  (a token id, a text piece) to its answer's column; the page's timer reads the new pieces (`take`)
  or all of them (iterating the columns) on the UI thread. A list's append is atomic under the GIL,
  so the two threads share it without a lock; a piece for an answer that does not exist is dropped.
- `chat_messages`: the messages a model is given (system, the turns so far, the new user turn).
- `describe`: an exception as a page says it (an empty MemoryError says what to do).
- `invalid_setting`: the banner text of a setting the engine refused.

What it is not: it holds no page's state (see studio.pages.chat.controller and
studio.pages.rewards.controller) and runs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence


class StreamBuffer:
    """Pieces streamed per answer; see the module docstring."""

    def __init__(self, n: int = 0):
        self.columns: list[list] = [[] for _ in range(n)]
        self._shown = [0] * n  # how many pieces of each column `take` has handed out

    def append(self, column: int, piece) -> None:
        """Called by the worker for each piece of answer `column`."""
        if 0 <= column < len(self.columns):
            self.columns[column].append(piece)

    def take(self) -> dict[int, list]:
        """The pieces appended since the last take, by column (columns with none left out)."""
        new: dict[int, list] = {}
        for i, col in enumerate(self.columns):
            end = len(col)  # the worker may append while this reads: take what is there now
            if end > self._shown[i]:
                new[i] = col[self._shown[i] : end]
                self._shown[i] = end
        return new

    def total(self) -> int:
        """The pieces streamed so far, over all answers."""
        return sum(len(c) for c in self.columns)

    def __iter__(self) -> Iterator[list]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)


def chat_messages(
    system: str | None, user: str, history: Sequence[dict[str, str]] = ()
) -> list[dict[str, str]]:
    """The conversation a model answers: the system message (when there is one), the turns so far and
    the new user turn."""
    head = [{"role": "system", "content": system}] if system else []
    return [*head, *history, {"role": "user", "content": user}]


def describe(exc: BaseException) -> str:
    """An exception as a page shows it."""
    if isinstance(exc, MemoryError):
        return "out of memory: close other programs or choose a smaller model or type"
    return str(exc) or type(exc).__name__


def invalid_setting(exc: BaseException, side: str, then: str = "", what: str = "A sampling setting") -> str:
    """The banner text of a setting the engine refused: `what` is not valid, why, fix it on `side`
    ("left", "right"), then `then` ("press Apply"; empty: nothing more)."""
    return f"{what} is not valid: {exc}. Fix it on the {side}{', then ' + then if then else ''}."


__all__ = ["StreamBuffer", "chat_messages", "describe", "invalid_setting"]
