"""EnginePool's eviction order, on engines that load nothing: before a load, idle engines go least
recently used first (a request moves its model to the back), busy ones are passed over, and as
many go as the memory budget needs. (test_serve_models.py runs real engines in real servers.)"""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from localchat.config import EngineConfig
from localchat.engine.core import async_engine
from localchat.server.multimodel import pool as pool_module
from localchat.server.multimodel.pool import EnginePool, MemoryNeed


class FakeEngine:
    """Stands in for AsyncEngine: notes its model when it starts and when it shuts down; a model
    in `gates` loads once its event is set."""

    events: list[str]
    gates: dict[str, asyncio.Event]
    made: list[weakref.ref]

    def __init__(self, config: EngineConfig, max_waiting: int | None = None):
        self.model = config.model
        self.made.append(weakref.ref(self))

    async def start(self) -> FakeEngine:
        if self.model in self.gates:
            await self.gates[self.model].wait()
        self.events.append(f"load {self.model}")
        return self

    async def shutdown(self) -> None:
        self.events.append(f"evict {self.model}")


@pytest.fixture
def events(monkeypatch) -> list[str]:
    events: list[str] = []
    monkeypatch.setattr(FakeEngine, "events", events, raising=False)
    monkeypatch.setattr(FakeEngine, "gates", {}, raising=False)
    monkeypatch.setattr(FakeEngine, "made", [], raising=False)
    monkeypatch.setattr(async_engine, "AsyncEngine", FakeEngine)
    monkeypatch.setattr(pool_module, "_release_memory", lambda: None)
    return events


def make_pool(sizes: dict[str, int], **limits) -> EnginePool:
    pool = EnginePool(list(sizes), EngineConfig(), lambda engine, name: (None, None), **limits)
    pool._needs.update({name: MemoryNeed(size, 0) for name, size in sizes.items()})
    return pool


async def use(pool: EnginePool, name: str) -> None:
    """One request to `name`: acquire, then release."""
    await pool.release(await pool.acquire(name))


async def test_the_least_recently_used_engine_goes_not_the_first_loaded(events):
    pool = make_pool(dict.fromkeys("abc", 1), max_loaded=2)
    for name in "aba":  # a is loaded first but used last: b is the least recently used
        await use(pool, name)
    await use(pool, "c")
    assert events == ["load a", "load b", "evict b", "load c"]
    assert list(pool.loaded) == ["a", "c"] and pool.evictions == 1
    await use(pool, "a")  # then c is the least recently used
    await use(pool, "b")
    assert events[4:] == ["evict c", "load b"] and list(pool.loaded) == ["a", "b"]
    # the pool kept no reference to what it evicted (so its memory can go back)
    gc.collect()
    alive = sorted(engine.model for ref in FakeEngine.made if (engine := ref()) is not None)
    assert alive == ["a", "b"]
    await pool.close()


async def test_loaded_engines_answer_while_another_loads(events):
    """A load (its engine's thread, in AsyncEngine) keeps no request to a loaded engine waiting:
    a's requests are answered while b's load is held back, and b's then succeeds."""
    pool = make_pool(dict.fromkeys("ab", 1), max_loaded=2)
    await use(pool, "a")
    FakeEngine.gates["b"] = asyncio.Event()
    loading = asyncio.ensure_future(use(pool, "b"))
    for _ in range(3):
        await asyncio.wait_for(use(pool, "a"), 30)
    assert not loading.done() and events == ["load a"]
    FakeEngine.gates["b"].set()
    await asyncio.wait_for(loading, 30)
    assert events == ["load a", "load b"] and list(pool.loaded) == ["a", "b"]
    await pool.close()


async def test_a_budget_evicts_as_many_as_it_needs_in_lru_order_passing_busy_ones(events):
    sizes = {"a": 100, "b": 100, "c": 100, "d": 100, "big": 250}
    pool = make_pool(sizes, max_memory=400, max_loaded=4)
    for name in "abcd":
        await use(pool, name)
    busy = await pool.acquire("c")  # answering a request
    for name in "adb":  # least recently used first: c (busy), a, d, b
        await use(pool, name)
    events.clear()
    await use(pool, "big")  # needs 250 of 400: three of 100 go, and c is not one of them
    assert events == ["evict a", "evict d", "evict b", "load big"]
    assert list(pool.loaded) == ["c", "big"] and pool.used_memory() == 350
    await pool.release(busy)
    await pool.close()


async def test_a_request_may_not_shorten_the_keep_alive_unless_allowed(events):
    """A client's keep_alive 0 would unload a model other clients use: refused (400 naming
    keep_alive) unless the server runs --allow-client-unload; lengthening it is fine."""
    from localchat.errors import InvalidParameterError

    pool = make_pool({"a": 10}, keep_alive=300.0)
    for shorter in (0.0, 299.0):
        with pytest.raises(InvalidParameterError, match="--allow-client-unload") as refused:
            await pool.acquire("a", shorter)
        assert refused.value.param == "keep_alive"
    assert pool.keep_alive["a"] == 300.0 and not pool.loaded
    await pool.release(await pool.acquire("a", 600.0))
    await pool.release(await pool.acquire("a", None))  # forever: longer still
    assert pool.keep_alive["a"] is None
    forever = make_pool({"a": 10}, keep_alive=None)
    with pytest.raises(InvalidParameterError):
        await forever.acquire("a", 3600.0)
    allowed = make_pool({"a": 10}, keep_alive=300.0, allow_client_unload=True)
    await allowed.release(await allowed.acquire("a", 0.0))
    assert not allowed.loaded  # unloaded once idle, as asked
    await pool.close()
    await allowed.close()
