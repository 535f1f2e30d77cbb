"""SHA-256 of large files, remembered per file so that a model is read in full once, not every run.

`cached_sha256(path)` returns the file's hex digest. The digest is kept in
`<cache>/file-hashes.json` (`<cache>` is `$XDG_CACHE_HOME/tune-studio`, by default
`~/.cache/tune-studio`) under the file's real path, with the size, modification time and inode it
had; any change to those means the file is read again. Several processes on one machine asking for
the same file at once (the ranks of a distributed run) take turns on a lock beside the cache, so
the file is read once. A cache that cannot be read or written is only logged: the digest is still
computed and returned. This module does not decide what a digest is used for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator

from .files import atomic_write

log = logging.getLogger(__name__)

CACHE_FILE = "file-hashes.json"
MAX_ENTRIES = 256  # files remembered; the oldest entries are dropped first


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tune-studio")


def file_sha256(path: str) -> str:
    """The SHA-256 of a whole file (read in 1 MiB pieces), as hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(folder: str) -> Iterator[None]:
    """An exclusive lock between processes of this machine; none where fcntl is missing (Windows)
    or the cache folder cannot be made (at worst two processes hash the same file)."""
    try:
        import fcntl

        os.makedirs(folder, exist_ok=True)
        f = open(os.path.join(folder, CACHE_FILE + ".lock"), "a+b")  # noqa: SIM115 - closed below
    except (ImportError, OSError) as exc:
        log.info("no lock for the file-hash cache %s (%s)", folder, exc)
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached_sha256(path: str) -> str:
    """The SHA-256 of `path`, from the cache when the file is unchanged (see the module doc)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}
    folder = cache_dir()
    cache = os.path.join(folder, CACHE_FILE)
    with _locked(folder):
        entries = _read(cache)
        entry = entries.get(real)
        if isinstance(entry, dict) and all(entry.get(k) == v for k, v in key.items()) and entry.get("sha256"):
            return str(entry["sha256"])
        digest = file_sha256(real)
        entries.pop(real, None)
        entries[real] = {**key, "sha256": digest}
        while len(entries) > MAX_ENTRIES:
            entries.pop(next(iter(entries)))
        try:
            with atomic_write(cache, "w", encoding="utf-8") as f:
                json.dump(entries, f, indent=0)
        except OSError as exc:
            log.info("the file-hash cache %s cannot be written: %s", cache, exc)
        return digest
