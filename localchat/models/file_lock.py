"""An exclusive advisory file lock shared by the processes that write one file."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def locked(path: Path) -> Iterator[bool]:
    """An exclusive advisory lock on `path` (POSIX flock) while the block runs, which gets True;
    where there is none (Windows) it gets False and the caller goes on unlocked."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield False
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
