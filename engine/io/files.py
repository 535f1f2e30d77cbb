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
  are never rewritten. `AppendLog(path)` is the same for a log written record by record (a run's
  events): opened once, never truncated, each record flushed, synced to disk at most every
  `sync_every_s` seconds and on `sync()`/`close()`.
- `check_outputs(outputs, inputs)`: the one rule for every output of every command and page: an
  output path is compared with every input of the same command and with the other outputs,
  resolved (symbolic links followed, hard links caught by device and inode), and refused with a
  `ConfigError` naming both before any work is done.

Temporary names start with `TMP_PREFIX`, which `engine.train.config.clean_stale_temporaries`
removes when a killed run left them behind. Errors are the OSError of the failing call; callers
turn them into their own messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import IO

from ..errors import ConfigError

TMP_PREFIX = ".tmp-"


DATA_FOLDER_NAMES = {"win32": "Tune Studio", "darwin": "Tune Studio"}  # elsewhere: "tune-studio"


def user_data_folder() -> str:
    """The user's writable data folder for Tune Studio (the app's and the engine's: runs, prepared
    datasets), one level under the platform's data folder: ~/.local/share/tune-studio
    ($XDG_DATA_HOME), ~/Library/Application Support/Tune Studio, %LOCALAPPDATA%\\Tune Studio; or
    $TUNE_STUDIO_DATA when set."""
    if os.environ.get("TUNE_STUDIO_DATA"):
        return os.environ["TUNE_STUDIO_DATA"]
    home = os.path.expanduser("~")
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
    elif sys.platform == "darwin":
        base = os.path.join(home, "Library", "Application Support")
    else:
        base = os.environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    return os.path.join(base, DATA_FOLDER_NAMES.get(sys.platform, "tune-studio"))


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


class AppendLog:
    """A file written record by record (a run's events), as `durable_append` does for one record:
    opened in append mode (an existing file is never truncated), each record starting on a line of
    its own and flushed at once (a reader sees it), the file synced to disk at most every
    `sync_every_s` seconds, on `sync()` and on `close()`. Opening is lazy: nothing happens to the
    file before the first record."""

    def __init__(self, path: str | os.PathLike[str], sync_every_s: float = 1.0):
        self.path = os.fspath(path)
        self.sync_every_s = sync_every_s
        self._f: IO[bytes] | None = None
        self._synced = 0.0

    def write(self, record: bytes) -> None:
        if self._f is None:
            f = open(self.path, "a+b")  # noqa: SIM115 - closed by close()
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    record = b"\n" + record
            self._f = f
        self._f.write(record)
        self._f.flush()
        if time.monotonic() - self._synced >= self.sync_every_s:
            self.sync()

    def sync(self) -> None:
        if self._f is not None:
            os.fsync(self._f.fileno())
            self._synced = time.monotonic()

    def close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            try:
                f.flush()
                os.fsync(f.fileno())
            finally:
                f.close()

    def __enter__(self) -> AppendLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- outputs against inputs --------------------------------------------------------------------------


def _identity(path: str) -> tuple[str, tuple[int, int] | None]:
    """(the path with every symbolic link resolved, (device, inode) of what it names or None)."""
    real = os.path.normcase(os.path.realpath(path))
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return real, None
    return real, (st.st_dev, st.st_ino)


def _same(a: tuple[str, tuple[int, int] | None], b: tuple[str, tuple[int, int] | None]) -> bool:
    return a[0] == b[0] or (a[1] is not None and a[1] == b[1])


def _inside(path: str, folder: str) -> bool:
    """Whether resolved `path` lies under resolved `folder` (not the folder itself)."""
    return path != folder and path.startswith(folder.rstrip(os.sep) + os.sep)


def check_outputs(
    outputs: Mapping[str, str | os.PathLike[str] | None],
    inputs: Mapping[str, str | os.PathLike[str] | None],
    *,
    folders: Mapping[str, str] | None = None,
    continues: str | None = None,
    kinds: Mapping[str, str] | None = None,
) -> None:
    """Refuse, before any work, an output that would replace or change something the command reads.

    `outputs` and `inputs` map what each path is, for people ("adapter", "events file", "model",
    "dataset"), to the path (None: not given). `folders` maps the outputs that are folders to the
    prefix of the entries their writer replaces or deletes inside them (a run's checkpoint folder:
    "ckpt-"). `continues` names the input a folder output may hold, be or lie in (the checkpoint a
    resumed run goes on from, in its own checkpoint folder); file outputs inside it are refused.

    Every path is resolved: symbolic links followed, hard links caught by device and inode. An
    output is refused when it is an input, lies inside an input folder, is another output, is a
    folder where a file is written (or the reverse), or when a folder output would replace an
    input inside it. `kinds` maps outputs to what they write (a key of `KINDS`): a file already
    there is replaced (or appended to) only when it is of that kind, so a command's output never
    lands on a dataset, a model or a template by a slip of the hand.
    ConfigError names both paths and what they are; nothing is created.
    """
    folders = dict(folders or {})
    kinds = dict(kinds or {})
    ins = {role: (os.fspath(p), _identity(os.fspath(p))) for role, p in inputs.items() if p}
    outs = {role: (os.fspath(p), _identity(os.fspath(p))) for role, p in outputs.items() if p}
    seen: list[tuple[str, str, tuple[str, tuple[int, int] | None]]] = []
    for role, (path, ident) in outs.items():
        is_folder = role in folders
        if not is_folder and os.path.isdir(path):
            raise ConfigError(f"the {role} {path} is a folder; it needs a file name (for example {path}/out)")
        if is_folder and os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError(f"the {role} {path} is a file; it must be a folder")
        for in_role, (in_path, in_ident) in ins.items():
            what = f"the {role} {path}"
            if _same(ident, in_ident):
                if is_folder and in_role == continues:
                    continue
                also = (
                    " (the same file under another name: a hard link)"
                    if ident[0] != in_ident[0]
                    else (
                        " (through a symbolic link)"
                        if os.path.abspath(path) != os.path.abspath(in_path)
                        else ""
                    )
                )
                raise ConfigError(
                    f"{what} is the {in_role} {in_path}{also}: choose another path; the {in_role} is kept"
                )
            if (
                os.path.isdir(in_path)
                and _inside(ident[0], in_ident[0])
                and not (is_folder and in_role == continues)
            ):
                raise ConfigError(
                    f"{what} is inside the {in_role} {in_path}: choose a path outside it; the {in_role} "
                    "is kept"
                )
            if is_folder and in_role != continues and _inside(in_ident[0], ident[0]):
                entry = os.path.relpath(in_ident[0], ident[0]).split(os.sep)[0]
                if entry.startswith(folders[role]):
                    raise ConfigError(
                        f"the {in_role} {in_path} is inside {entry} of the {role} {path}, which the run "
                        f"replaces or deletes: copy it elsewhere or choose another {role}"
                    )
        for other_role, other_path, other_ident in seen:
            if _same(ident, other_ident):
                raise ConfigError(
                    f"the {role} and the {other_role} are the same path ({path}, {other_path}): give "
                    "each its own"
                )
            for (f_role, f_ident), (x_role, x_path, x_ident) in (
                ((role, ident), (other_role, other_path, other_ident)),
                ((other_role, other_ident), (role, path, ident)),
            ):
                if f_role in folders and _inside(x_ident[0], f_ident[0]):
                    entry = os.path.relpath(x_ident[0], f_ident[0]).split(os.sep)[0]
                    if entry.startswith(folders[f_role]):
                        raise ConfigError(
                            f"the {x_role} {x_path} is inside {entry} of the {f_role}, which the run "
                            f"replaces or deletes: choose a path outside it"
                        )
        seen.append((role, path, ident))
        if role in kinds:
            problem = replace_problem(path, kinds[role])
            if problem:
                raise ConfigError(
                    f"the {role} {path} exists and is not {KINDS[kinds[role]]} ({problem}): it is kept; "
                    "choose another path, or delete it first"
                )


# What an output writes, for `check_outputs(kinds=...)`: a file there already must be one of these.
KINDS = {
    "npy": "a NumPy .npy file",
    "adapter": "a LoRA adapter GGUF",
    "model": "a GGUF model",
    "gguf": "a GGUF file",
    "events": 'an events log (JSON lines with an "event" key)',
    "jsonl": "a JSON Lines file",
    "json": "a JSON object",
}
_PEEK = 1 << 16  # bytes read to tell what a file is


def _first_line_object(head: bytes) -> dict | None:
    line = head.split(b"\n", 1)[0].strip().removeprefix(b"\xef\xbb\xbf")
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def replace_problem(path: str | os.PathLike[str], kind: str) -> str | None:
    """Why the file at `path` is not of `kind` (a key of KINDS), in words; None when it is, or when
    there is nothing to replace (no file, an empty file)."""
    path = os.fspath(path)
    try:
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            return None
        with open(path, "rb") as f:
            head = f.read(_PEEK)
    except OSError:
        return None  # what cannot be read cannot be told apart; writing it will say why it fails
    if kind == "npy":
        return None if head.startswith(b"\x93NUMPY") else _what(path, head)
    if kind in ("adapter", "model", "gguf"):
        if not head.startswith(b"GGUF"):
            return _what(path, head)
        if kind == "gguf":
            return None
        from ..errors import EngineError
        from .gguf_file import GGUFFile

        try:
            is_adapter = GGUFFile(path).get("general.type") == "adapter"
        except EngineError:
            return None  # a broken GGUF file: replacing it loses nothing usable
        if (kind == "adapter") != is_adapter:
            return "it is a LoRA adapter" if is_adapter else "it is a GGUF model"
        return None
    if kind in ("events", "jsonl"):
        record = _first_line_object(head)
        if record is None:
            return _what(path, head)
        if kind == "events" and "event" not in record:
            return "its first line is not an event: a dataset or another JSON Lines file"
        return None
    if kind == "json":
        try:
            if os.path.getsize(path) > (16 << 20):
                return "it is larger than any project file"
            with open(path, encoding="utf-8") as f:
                value = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError):
            return _what(path, head)
        return None if isinstance(value, dict) else "it holds JSON that is not an object"
    raise ValueError(f"unknown output kind {kind!r}; known: {', '.join(KINDS)}")


def _what(path: str, head: bytes) -> str:
    """What a file is, from its first bytes, for messages."""
    if head.startswith(b"GGUF"):
        return "it is a GGUF file"
    if head.startswith(b"\x93NUMPY"):
        return "it is a NumPy array"
    if head.startswith(b"PK"):
        return "it is a zip archive"
    if _first_line_object(head) is not None:
        return "it is a JSON Lines or JSON file"
    text = head[:16]
    if text and all(32 <= b < 127 or b in (9, 10, 13) for b in text):
        return f"it starts with {text.decode('ascii')!r}"
    return "it starts with the bytes " + " ".join(f"{b:02x}" for b in text[:8])
