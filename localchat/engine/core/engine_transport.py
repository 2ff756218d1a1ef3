"""The two ways an EngineCore talks to its client: ThreadTransport (a queue of commands into the
engine thread, events handed to a callback there: AsyncEngine) and PipeTransport (a pipe each way:
a data-parallel replica's process, whose events go as one pipe message per list)."""

from __future__ import annotations

import queue
from collections.abc import Callable
from multiprocessing.connection import Connection

from localchat.engine.core.engine_messages import EngineCommand, EngineEvent


class ThreadTransport:
    """Commands from a SimpleQueue; events to `on_events`, called in the engine thread."""

    def __init__(
        self,
        commands: queue.SimpleQueue[EngineCommand],
        on_events: Callable[[list[EngineEvent]], None],
    ) -> None:
        self.commands = commands
        self.on_events = on_events

    def receive(self, timeout: float) -> EngineCommand | None:
        try:
            return self.commands.get(block=timeout > 0, timeout=timeout or None)
        except queue.Empty:
            return None

    def emit(self, events: list[EngineEvent]) -> None:
        self.on_events(events)


class PipeTransport:
    """Commands from one pipe, events (lists of them) down another. A closed pipe raises EOFError
    or OSError: the other side is gone."""

    def __init__(self, commands: Connection, events: Connection) -> None:
        self.commands = commands
        self.events = events

    def receive(self, timeout: float) -> EngineCommand | None:
        if not self.commands.poll(timeout):
            return None
        command: EngineCommand = self.commands.recv()
        return command

    def emit(self, events: list[EngineEvent]) -> None:
        self.events.send(events)
