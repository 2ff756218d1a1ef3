"""AsyncEngine's stream_interval, on its own: which deltas the engine thread holds, and when they
go (the engine thread's side, driven by hand with a fake clock)."""

from __future__ import annotations

import asyncio

import pytest

from localchat.engine.core.async_engine import AsyncEngine
from localchat.engine.core.outputs import CompletionOutput, RequestOutput
from localchat.engine.core.request_stream import StreamState
from localchat.errors import EngineDeadError


def delta(token: int | None, finish: str | None = None) -> RequestOutput:
    tokens = [] if token is None else [token]
    output = CompletionOutput(0, text=f"<{token}>", token_ids=tokens, finish_reason=finish)
    return RequestOutput("r", None, [1], [output], finished=finish is not None)


class FakeClock:
    """The engine's clock in a test: it moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def engine_on(clock: FakeClock) -> AsyncEngine:
    """An engine (never started) whose stream intervals run on `clock`; the process's own clock,
    which the event loop reads too, is left alone."""
    engine = AsyncEngine()
    engine._clock = clock
    return engine


async def received(stream: StreamState) -> list:
    await asyncio.sleep(0)  # call_soon_threadsafe's callbacks run on the next loop iteration
    items = []
    while not stream.queue.empty():
        item = stream.queue.get_nowait()
        items.append(item if isinstance(item, BaseException) else item.token_ids)
    return items


async def test_the_first_token_goes_at_once_then_one_hand_over_per_interval(clock):
    engine = engine_on(clock)
    stream = engine._streams["r"] = StreamState(asyncio.get_running_loop(), interval=0.05)
    engine._deliver([delta(None)])  # a step without a token (a prefill chunk) is not held
    engine._deliver([delta(1)])
    assert await received(stream) == [[], [1]]
    for token in (2, 3):
        clock.now += 0.02
        engine._deliver([delta(token)])
    assert await received(stream) == []
    clock.now += 0.02  # 60 ms after the first token
    engine._deliver([delta(4)])
    assert await received(stream) == [[2], [3], [4]]
    clock.now += 0.01
    engine._deliver([delta(5)])
    clock.now += 0.05
    engine._deliver([])  # no delta this step (preempted): what is due goes anyway
    assert await received(stream) == [[5]]
    clock.now += 0.01  # 10 ms after that hand-over
    engine._deliver([delta(6)])
    assert await received(stream) == []
    engine._deliver([delta(7, finish="length")])  # the last delta never waits
    assert await received(stream) == [[6], [7]]
    assert not engine._holding and "r" not in engine._streams


async def test_without_an_interval_every_delta_goes_at_once(clock):
    engine = engine_on(clock)
    stream = engine._streams["r"] = StreamState(asyncio.get_running_loop())
    for token in (1, 2, 3):
        engine._deliver([delta(token)])
    assert await received(stream) == [[1], [2], [3]]


async def test_a_failing_engine_hands_over_what_it_held_before_the_error(clock):
    engine = engine_on(clock)
    stream = engine._streams["r"] = StreamState(asyncio.get_running_loop(), interval=1.0)
    engine._deliver([delta(1)])
    engine._deliver([delta(2)])
    engine._fail_all(EngineDeadError("boom"))
    first, second, error = await received(stream)
    assert (first, second, type(error)) == ([1], [2], EngineDeadError)
    assert not engine._holding
