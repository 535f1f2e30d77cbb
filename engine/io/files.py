"""How the engine writes files so that nothing the user has is ever half-written.

- `atomic_write(path)`: a file object on a temporary file beside `path` (`.tmp-<name>.*`), flushed
  to disk and renamed over `path` when the block ends without an error; on any error (a full disk,
  an interrupt) the temporary file is removed and `path` is as it was. A replaced file keeps its
  permissions; a new one gets 0o666 less the umask.
- `atomic_path(path)`: the same for writers that open the file themselves (gguf-py, np.save):
  yields the temporary path to write.
- `atomic_folder(path)`: a folder (a checkpoint) built in a temporary folder beside it and renamed
  into place; an existing folder of that name is replaced only once the new one is complete.
- `durable_append(path, data)`: bytes appended and flushed to disk before it returns, starting on
  a line of their own when the file ends mid-line (a record cut short by a crash); earlier bytes
  are never rewritten.

Temporary names start with `TMP_PREFIX`, which `engine.train.trainer.clean_stale_temporaries`
removes when a killed run left them behind. Errors are the OSError of the failing call; callers
turn them into their own messages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO

TMP_PREFIX = ".tmp-"


def file_mode(path: str) -> int:
    """The mode a written file gets: the replaced file's, else 0o666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def fsync_folder(folder: str) -> None:
    """Make a rename in `folder` durable (a no-op where folders cannot be opened, as on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], suffix: str = ".part") -> Iterator[str]:
    """A temporary path beside `path` to write; renamed over `path` when the block succeeds."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{os.path.basename(path)}.", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    fsync_folder(folder)


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str],
    mode: str = "w",
    *,
    encoding: str | None = "utf-8",
    newline: str | None = None,
) -> Iterator[IO]:
    """An open file (text "w" or binary "wb") whose content replaces `path` when the block succeeds."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes whole files: mode 'w' or 'wb', got {mode!r}")
    with atomic_path(path) as tmp:
        if mode == "wb":
            f = open(tmp, "wb")  # noqa: SIM115 - closed below, before the rename
        else:
            f = open(tmp, "w", encoding=encoding, newline=newline)  # noqa: SIM115
        with f:
            yield f
            f.flush()


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[str]:
    """A temporary folder beside `path` to fill; it replaces `path` (a folder) when the block succeeds."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.path.basename(path)}.", dir=parent)
    try:
        yield tmp
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    fsync_folder(parent)


def durable_append(path: str | os.PathLike[str], data: bytes) -> None:
    """Append `data` and flush it to disk; it starts on its own line if the file ends mid-line."""
    with open(path, "a+b") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
