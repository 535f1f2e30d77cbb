"""Folders and files as the pages check them: are two paths one file, can a folder be written, which
checkpoint is newest."""

from __future__ import annotations

import os
import tempfile


def same_file(a: str | None, b: str | None) -> bool:
    """Both paths name the same file: by identity when both exist (links and hard links too), else by
    their resolved, case-normalised paths (links in the folders above followed); False when either is
    empty."""
    if not a or not b:
        return False
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def writable_problem(folder: str) -> str | None:
    """None if files can be created in `folder` (made if missing), else the reason."""
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tune-studio-write-test-", dir=folder)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def latest_checkpoint(folder: str | None) -> str | None:
    """The newest ckpt-NNNNNN folder inside `folder`, or None."""
    if not folder or not os.path.isdir(folder):
        return None
    names = sorted(
        p for p in os.listdir(folder) if p.startswith("ckpt-") and os.path.isdir(os.path.join(folder, p))
    )
    return os.path.join(folder, names[-1]) if names else None
