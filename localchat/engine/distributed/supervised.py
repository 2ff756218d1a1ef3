"""SupervisedProcess: a spawned child with a pipe each way (commands to it, messages from it), as
both a tensor-parallel rank (worker_pool.py) and a data-parallel replica (data_parallel.py) run.

The parent waits for the child's messages with a deadline while watching that it lives, sees
whether it has exited (a cheap waitpid), and stops it: politely (the caller's own command, then a
join with a timeout), or by force.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import Any

POLL_SECONDS = 0.1


class ProcessLost(RuntimeError):
    """The child exited (`exited`), or said nothing in time, before the message waited for."""

    def __init__(self, message: str, *, exited: bool) -> None:
        super().__init__(message)
        self.exited = exited


class SupervisedProcess:
    """Start `target(*args, commands, events)` in a spawned process: it reads `commands` and
    writes `events`; the parent holds the other ends (`commands` to send, `events` to read)."""

    def __init__(
        self,
        target: Callable[..., None],
        args: tuple[Any, ...],
        *,
        name: str,
        daemon: bool = True,
        context: BaseContext | None = None,
    ) -> None:
        """`daemon` False lets the child start processes of its own (its tensor-parallel ranks);
        `context` defaults to multiprocessing's spawn context."""
        context = context or mp.get_context("spawn")
        their_commands, self.commands = context.Pipe(duplex=False)
        self.events, their_events = context.Pipe(duplex=False)
        self.process = context.Process(  # type: ignore[attr-defined]
            target=target, args=(*args, their_commands, their_events), name=name, daemon=daemon
        )
        self.process.start()
        their_commands.close()
        their_events.close()

    @property
    def name(self) -> str:
        return str(self.process.name)

    @property
    def exitcode(self) -> int | None:
        """The child's exit code, None while it runs."""
        code: int | None = self.process.exitcode
        return code

    def send(self, message: object) -> None:
        """Send the child a command (OSError once its end is closed)."""
        self.commands.send(message)

    def wait_for(self, deadline: float) -> Any:
        """The child's next message, by `deadline` (time.monotonic()); raises ProcessLost if it
        exits or the deadline passes first."""
        while not self.events.poll(POLL_SECONDS):
            if not self.process.is_alive():
                code = self.process.exitcode
                raise ProcessLost(f"{self.name} exited with code {code}", exited=True)
            if time.monotonic() > deadline:
                raise ProcessLost(f"{self.name} sent nothing in time", exited=False)
        try:
            return self.events.recv()
        except EOFError:  # its end closed: it exited
            self.process.join(timeout=1.0)
            code = self.process.exitcode
            raise ProcessLost(f"{self.name} exited with code {code}", exited=True) from None

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the child to exit."""
        self.process.join(timeout=timeout)

    def recv(self) -> Any:
        """The child's next message, however long it takes (EOFError once it is gone)."""
        return self.events.recv()

    def kill(self, timeout: float = 5.0) -> None:
        """Kill the child if it still runs, and reap it (waiting up to `timeout` seconds)."""
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(timeout=timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Give the child `timeout` seconds to exit (after the caller asked it to), then kill it."""
        self.join(timeout)
        self.kill(timeout)

    def close_pipes(self) -> None:
        """Close the parent's ends (the child sees the command pipe close)."""
        for conn in (self.commands, self.events):
            with contextlib.suppress(OSError):
                conn.close()
