"""What a path that is not a regular file is, in words, for the messages of the readers (GGUF files,
datasets) and of the output checks."""

from __future__ import annotations

import stat


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is (from its st_mode), for messages."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"
