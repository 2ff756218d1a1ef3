"""One-line notices while a model is found, pulled or prepared ("downloading ...", "reading the
tokenizer ..."): to the caller's progress callback (the TUI's loading panel), else to stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[str], None]


def say(progress: Progress | None, message: str) -> None:
    """Hand `message` to `progress`, or print it to stderr where there is none."""
    if progress is not None:
        progress(message)
    else:
        print(message, file=sys.stderr, flush=True)
