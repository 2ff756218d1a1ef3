"""EnginePool: the engines of a several-model server. Each loads on first use (in its own thread,
so the others keep streaming); before a load, idle engines are evicted least-recently-used until
it fits under `max_loaded` engines and the `max_memory` budget; an idle engine past its model's
keep_alive is unloaded by a background task."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from localchat.config import EngineConfig
from localchat.engine.core.memory import freeze_gc
from localchat.errors import InvalidParameterError, ModelNotFoundError
from localchat.utils import format_bytes

logger = logging.getLogger("localchat.server")
REAP_EVERY_S = 0.25  # how often idle engines are checked against their keep_alive
UNSET: Any = object()  # a request that names no keep_alive


@dataclass
class Loaded:
    """A started engine, the single-model ASGI app around it and its ServerState (metrics)."""

    name: str
    engine: Any  # AsyncEngine
    app: Callable[..., Any]
    server: Any = None  # ServerState
    memory_bytes: int = 0
    loaded_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    active: int = 0


@dataclass(frozen=True)
class MemoryNeed:
    """What a model is expected to take once loaded: its weights and its KV cache pool."""

    weights: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache


class EnginePool:
    """`models` maps each served name to what EngineConfig.model gets (a registry name or a path;
    a list serves each name as itself). `keep_alive` is the server's default in seconds (None:
    forever); a request may change its model's."""

    def __init__(
        self,
        models: Mapping[str, str] | list[str],
        base: EngineConfig,
        build_app: Callable[[Any, str], Any],
        *,
        max_loaded: int = 1,
        max_memory: int | None = None,
        keep_alive: float | None = None,
        max_waiting: int | None = None,
        allow_client_unload: bool = False,
    ):
        self.models = dict(models) if isinstance(models, Mapping) else {n: n for n in models}
        self.names = list(self.models)
        self._base, self._build_app = base, build_app
        self.max_loaded, self._max_waiting = max(1, max_loaded), max_waiting
        self.max_memory = max_memory
        self.keep_alive: dict[str, float | None] = dict.fromkeys(self.names, keep_alive)
        self.default_keep_alive, self.allow_client_unload = keep_alive, allow_client_unload
        self.loaded: OrderedDict[str, Loaded] = OrderedDict()  # least recently used first
        self._loading: dict[str, asyncio.Task] = {}
        self._wanted: Counter[str] = Counter()  # requests waiting for each model
        self._needs: dict[str, MemoryNeed] = {}
        self._changed = asyncio.Condition()
        self._load_lock = asyncio.Lock()  # one load at a time (two would each wait for room)
        self._reaper: asyncio.Task | None = None
        self.evictions = 0

    def start(self) -> None:
        """Start unloading engines past their keep_alive (needs the running loop)."""
        if self._reaper is None:
            self._reaper = asyncio.ensure_future(self._reap())

    # --- memory -----------------------------------------------------------------------------------
    def need(self, name: str) -> MemoryNeed:
        """The weights' bytes (the files as loaded; float32 or the dtype's size per parameter for
        random weights) plus the KV pool (--kv-cache-memory, else the CPU default)."""
        if name not in self._needs:
            from localchat.engine.core.runtime import CPU_DEFAULT_KV_MEMORY
            from localchat.models.facts import facts_of
            from localchat.models.source import resolve_model

            source = resolve_model(self.models[name], pull=False)
            facts = facts_of(source.kind, source.path)
            weights = facts.size_bytes
            if self._base.load_format == "dummy" and facts.parameters:
                half = self._base.dtype in ("float16", "bfloat16")
                weights = facts.parameters * (2 if half else 4)
            kv = self._base.kv_cache_memory
            kv_bytes = kv if isinstance(kv, int) else CPU_DEFAULT_KV_MEMORY
            self._needs[name] = MemoryNeed(weights, kv_bytes)
        return self._needs[name]

    def used_memory(self) -> int:
        return sum(entry.memory_bytes for entry in self.loaded.values())

    def check_fits(self, name: str) -> None:
        """A model that alone exceeds --max-memory is a 400 naming both sizes."""
        need = self.need(name)
        if self.max_memory is not None and need.total > self.max_memory:
            raise InvalidParameterError(
                f"the model {name!r} needs about {format_bytes(need.total)} (weights "
                f"{format_bytes(need.weights)}, KV cache {format_bytes(need.kv_cache)}), more than "
                f"the server's --max-memory of {format_bytes(self.max_memory)}",
                param="model",
            )

    # --- requests ---------------------------------------------------------------------------------
    async def acquire(self, name: str, keep_alive: float | None = UNSET) -> Loaded:
        """The loaded engine for `name` (loading it, and evicting others, first if needed), marked
        in use until `release`. A `keep_alive` given becomes the model's from now on."""
        if name not in self.models:
            raise ModelNotFoundError(
                f"the model {name!r} does not exist; this server serves "
                f"{', '.join(map(repr, self.names))}",
                param="model",
            )
        if keep_alive is not UNSET:
            self._check_keep_alive(keep_alive)
            self.keep_alive[name] = keep_alive
        # a model someone waits for is not evicted between its load and their turn
        self._wanted[name] += 1
        try:
            while True:
                entry = self.loaded.get(name)
                if entry is not None:
                    entry.active += 1
                    self.loaded.move_to_end(name)
                    return entry
                self.check_fits(name)
                task = self._loading.get(name)
                if task is None:
                    task = asyncio.ensure_future(self._load(name))
                    self._loading[name] = task
                await asyncio.shield(task)
        finally:
            self._wanted[name] -= 1

    def _check_keep_alive(self, keep_alive: float | None) -> None:
        """A request may keep its model loaded longer than the server's --keep-alive, not
        shorter: that would unload a model other clients use. --allow-client-unload lets it."""
        default = self.default_keep_alive
        shorter = keep_alive is not None and (default is None or keep_alive < default)
        if shorter and not self.allow_client_unload:
            from localchat.server.keep_alive import format_duration

            raise InvalidParameterError(
                f"keep_alive={keep_alive:g}s is shorter than this server's keep-alive of "
                f"{format_duration(default)}; a request may only lengthen it (the server's "
                "--allow-client-unload lets requests shorten it or unload their model)",
                param="keep_alive",
            )

    async def release(self, entry: Loaded) -> None:
        entry.active -= 1
        entry.last_used = time.monotonic()
        if self.keep_alive[entry.name] == 0:
            await self._evict_if_idle(entry.name)
        async with self._changed:
            self._changed.notify_all()

    def unloads_in(self, entry: Loaded, now: float | None = None) -> float | None:
        """Seconds until an idle engine is unloaded; None while it is busy or kept for good."""
        keep = self.keep_alive[entry.name]
        if entry.active or keep is None:
            return None
        return max(0.0, entry.last_used + keep - (time.monotonic() if now is None else now))

    # --- loading and evicting ---------------------------------------------------------------------
    async def _load(self, name: str) -> None:
        from localchat.engine.core.async_engine import AsyncEngine

        try:
            async with self._load_lock:
                await self._make_room(self.need(name).total)
                config = replace(self._base, model=self.models[name])
                engine = AsyncEngine(config, max_waiting=self._max_waiting)
                try:
                    await engine.start()
                except BaseException:
                    await engine.shutdown()
                    raise
                app, server = self._build_app(engine, name)
                self.loaded[name] = Loaded(name, engine, app, server, self.need(name).total)
                logger.info("loaded %s (about %s)", name, format_bytes(self.need(name).total))
        finally:
            self._loading.pop(name, None)

    def _full(self, need: int) -> bool:
        if len(self.loaded) >= self.max_loaded:
            return True
        return self.max_memory is not None and self.used_memory() + need > self.max_memory

    async def _make_room(self, need: int) -> None:
        """Evict idle engines, least recently used first, until one more of `need` bytes fits;
        wait for a busy one to finish when all are busy."""
        async with self._changed:
            while self.loaded and self._full(need):
                idle = next((n for n in self.loaded if self._idle(n)), None)
                if idle is not None:
                    await self._evict(idle)
                else:  # re-checked every second too (a waiter may give up without notice)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), 1.0)

    def _idle(self, name: str) -> bool:
        entry = self.loaded.get(name)
        return entry is not None and not entry.active and not self._wanted[name]

    async def _evict_if_idle(self, name: str) -> None:
        if self._idle(name):  # checked and popped with no await between: no request slips in
            await self._evict(name)

    async def _evict(self, name: str) -> None:
        """Stop the engine and drop every reference this pool holds to it before collecting."""
        engine = self.loaded.pop(name).engine
        self.evictions += 1
        logger.info("unloading %s", name)
        await engine.shutdown()
        del engine
        _release_memory()

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_EVERY_S)
            for name in self._expired():
                await self._evict_if_idle(name)
                async with self._changed:
                    self._changed.notify_all()

    def _expired(self) -> list[str]:
        """The engines past their keep_alive (names only: a Loaded kept in the reaper's frame
        while it sleeps would keep an evicted engine's memory alive)."""
        now = time.monotonic()
        lefts = {name: self.unloads_in(entry, now) for name, entry in self.loaded.items()}
        return [name for name, left in lefts.items() if left is not None and left <= 0]

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for name in list(self.loaded):
            await self._evict(name)


def _release_memory() -> None:
    """Drop the evicted engine's objects now (its cycles too, frozen with the rest at load) and
    hand freed heap pages back to the system."""
    freeze_gc()
    libc = ctypes.util.find_library("c")
    if libc:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(libc).malloc_trim(0)
