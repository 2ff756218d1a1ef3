"""A rich progress bar (bytes, speed, time left) that huggingface_hub's downloader drives through
its `tqdm_class` hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


def download_progress(console: Console | None = None) -> Progress:
    """A Progress showing, per file: name, bar, bytes done/total, speed, time left."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console or Console(stderr=True),
        transient=False,
    )


def bar_factory(progress: Progress, description: str) -> Callable[..., Any]:
    """A `tqdm_class` for huggingface_hub's http_get: each bar it makes is one task of
    `progress`, starting at the bytes already on disk (`initial`, when a download resumes)."""

    class _Bar:
        def __init__(self, *, total: int | None = None, initial: int = 0, **_: Any) -> None:
            self.task: TaskID = progress.add_task(description, total=total, completed=initial)

        def update(self, n: float = 1) -> None:
            progress.advance(self.task, n)

        def close(self) -> None:
            pass

        def __enter__(self) -> _Bar:
            return self

        def __exit__(self, *exc: object) -> None:
            self.close()

    return _Bar
