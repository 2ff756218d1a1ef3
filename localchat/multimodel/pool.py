"""EnginePool: at most `max_loaded` engines at once, each loaded on first use (in its own thread,
so the others keep streaming) and evicted least-recently-used once no request is using it."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from localchat.config import EngineConfig
from localchat.errors import ModelNotFoundError


@dataclass
class Loaded:
    """A started engine and the single-model ASGI app around it."""

    name: str
    engine: Any  # AsyncEngine
    app: Callable[..., Any]
    loaded_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    active: int = 0


class EnginePool:
    def __init__(
        self,
        names: list[str],
        base: EngineConfig,
        build_app: Callable[[Any, str], Callable[..., Any]],
        *,
        max_loaded: int = 1,
        max_waiting: int | None = None,
    ):
        self.names = list(dict.fromkeys(names))
        self._base, self._build_app = base, build_app
        self.max_loaded, self._max_waiting = max(1, max_loaded), max_waiting
        self.loaded: OrderedDict[str, Loaded] = OrderedDict()  # least recently used first
        self._loading: dict[str, asyncio.Task] = {}
        self._wanted: Counter[str] = Counter()  # requests waiting for each model
        self._changed = asyncio.Condition()
        self._load_lock = asyncio.Lock()  # one load at a time (two would each wait for room)
        self.evictions = 0

    async def acquire(self, name: str) -> Loaded:
        """The loaded engine for `name` (loading it, and evicting others, first if needed), marked
        in use until `release`."""
        if name not in self.names:
            raise ModelNotFoundError(
                f"the model {name!r} does not exist; this server serves "
                f"{', '.join(map(repr, self.names))}",
                param="model",
            )
        # a model someone waits for is not evicted between its load and their turn
        self._wanted[name] += 1
        try:
            while True:
                entry = self.loaded.get(name)
                if entry is not None:
                    entry.active += 1
                    self.loaded.move_to_end(name)
                    return entry
                task = self._loading.get(name)
                if task is None:
                    task = asyncio.ensure_future(self._load(name))
                    self._loading[name] = task
                await asyncio.shield(task)
        finally:
            self._wanted[name] -= 1

    async def release(self, entry: Loaded) -> None:
        entry.active -= 1
        entry.last_used = time.monotonic()
        async with self._changed:
            self._changed.notify_all()

    async def _load(self, name: str) -> None:
        from localchat.engine.async_engine import AsyncEngine

        try:
            async with self._load_lock:
                await self._make_room()
                config = replace(self._base, model=name)
                engine = AsyncEngine(config, max_waiting=self._max_waiting)
                try:
                    await engine.start()
                except BaseException:
                    await engine.shutdown()
                    raise
                self.loaded[name] = Loaded(name, engine, self._build_app(engine, name))
        finally:
            self._loading.pop(name, None)

    async def _make_room(self) -> None:
        """Evict idle engines, least recently used first, until one more fits; wait for a busy
        one to finish when all are busy."""
        async with self._changed:
            while len(self.loaded) >= self.max_loaded:
                idle = next(
                    (n for n, e in self.loaded.items() if not e.active and not self._wanted[n]),
                    None,
                )
                if idle is not None:
                    await self._evict(idle)
                else:  # re-checked every second too (a waiter may give up without notice)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), 1.0)

    async def _evict(self, name: str) -> None:
        """Stop the engine and drop every reference this pool holds to it before collecting."""
        engine = self.loaded.pop(name).engine
        self.evictions += 1
        await engine.shutdown()
        del engine
        _release_memory()

    async def close(self) -> None:
        for name in list(self.loaded):
            await self._evict(name)


def _release_memory() -> None:
    """Drop the evicted engine's objects now and hand freed heap pages back to the system."""
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(libc).malloc_trim(0)
