"""A rich progress bar on stderr counting output tokens, handed to the runners as an `advance(n)`
callable."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from localchat.bench.offline import Advance, _noop

STDERR = Console(stderr=True)


@contextmanager
def token_progress(enabled: bool, description: str, total: int) -> Iterator[Advance]:
    """A bar for one system's run; only on a terminal (piped output stays clean)."""
    if not (enabled and STDERR.is_terminal):
        yield _noop
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description:<12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tokens"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=STDERR, transient=True, refresh_per_second=4) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)
    STDERR.print(f"[green]done[/] {description}")


@contextmanager
def status(enabled: bool, message: str) -> Iterator[None]:
    if not (enabled and STDERR.is_terminal):
        yield
        return
    with STDERR.status(message):
        yield
