"""EngineCore's drive loop on a stand-in engine and a scripted transport: acceptances, deltas,
aborts and shutdown; the heartbeat and eviction reports a replica asks for; the idle health check.
(AsyncEngine's and the data-parallel tests run it on the real model, over both transports.)"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest

from localchat.engine.core.engine_core import HEALTH_CHECK_SECONDS, EngineCore
from localchat.engine.core.engine_messages import (
    AbortRequest,
    Accepted,
    AddRequest,
    EngineCommand,
    EngineEvent,
    Shutdown,
    StepDone,
)
from localchat.engine.core.llm_engine import EngineStats
from localchat.engine.core.outputs import CompletionOutput, RequestOutput
from localchat.engine.core.sequence import Request
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.errors import EngineDeadError, InvalidParameterError


@dataclass
class Runner:
    healthy: bool = True
    checks: int = 0

    def check_health(self) -> None:
        self.checks += 1
        if not self.healthy:
            raise EngineDeadError("rank 1 exited")

    def close(self) -> None:
        pass


@dataclass
class BlockManager:
    evicted_hashes: list[int] | None = None


@dataclass
class FakeEngine:
    """Each request makes one token a step until it has `length`; text prompts are [7, 8]."""

    length: int = 2
    requests: dict[str, Request] = field(default_factory=dict)
    made: dict[str, int] = field(default_factory=dict)
    runner: Runner = field(default_factory=Runner)
    block_manager: BlockManager = field(default_factory=BlockManager)

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams
    ) -> Request:
        if request_id in self.requests:
            raise InvalidParameterError(f"request id {request_id!r} is already in use")
        if isinstance(prompt, str):
            request = Request(request_id, [7, 8], params, prompt=prompt)
        else:
            request = Request(request_id, list(prompt), params)
        self.requests[request_id] = request
        self.made[request_id] = 0
        return request

    def abort(self, request_id: str) -> RequestOutput | None:
        if self.requests.pop(request_id, None) is None:
            return None
        return _output(request_id, [], "abort")

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        outputs = []
        for request_id in list(self.requests):
            self.made[request_id] += 1
            done = self.made[request_id] == self.length
            if done:
                del self.requests[request_id]
            outputs.append(_output(request_id, [self.made[request_id]], "length" if done else None))
        return outputs

    def take_embedded(self) -> list[Request]:
        return []

    def stats(self) -> EngineStats:
        return EngineStats(len(self.requests), 0, 0.0, 1, 0, 0, 0, 0, sum(self.made.values()))


def _output(request_id: str, tokens: list[int], finish: str | None) -> RequestOutput:
    completion = CompletionOutput(0, "", tokens, None, finish)
    return RequestOutput(request_id, None, [], [completion], finished=finish is not None)


class Script:
    """A transport that hands out `commands` in turn (None: nothing came this time, which moves
    `clock` by the wait's timeout), then Shutdown to the first wait; it keeps the events."""

    def __init__(self, *commands: EngineCommand | None) -> None:
        self.commands: deque[EngineCommand | None] = deque(commands)
        self.events: list[EngineEvent] = []
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def receive(self, timeout: float) -> EngineCommand | None:
        if not self.commands:
            return Shutdown() if timeout else None
        command = self.commands.popleft()
        if command is None:
            self.now += timeout
        return command

    def emit(self, events: list[EngineEvent]) -> None:
        self.events.extend(events)

    def of(self, kind: type) -> list:
        return [event for event in self.events if isinstance(event, kind)]


def idle(iterations: int) -> list[None]:
    """What a Script hands out for idle iterations: a wait that times out, then nothing to run."""
    return [None, None] * iterations


def _core(engine: FakeEngine, script: Script, **kwargs: float) -> EngineCore:
    return EngineCore(engine, clock=script.clock, **kwargs)  # type: ignore[arg-type]


def test_requests_are_accepted_stream_their_deltas_and_shutdown_aborts_the_rest():
    engine = FakeEngine(length=3)
    params = SamplingParams()
    script = Script(
        AddRequest("text", "hello", params),
        AddRequest("ids", [1, 2, 3], params),
        AddRequest("ids", [4], params),  # the id is in use: refused
        None,
        AbortRequest("text"),
    )
    _core(engine, script).run(script)
    accepted = script.of(Accepted)
    assert [(a.request_id, a.prompt_token_ids) for a in accepted] == [
        ("text", [7, 8]),  # the client of a text prompt needs its ids
        ("ids", None),
        ("ids", None),
    ]
    assert accepted[0].error is None and isinstance(accepted[2].error, InvalidParameterError)
    deltas = [
        (output.request_id, output.outputs[0].finish_reason)
        for event in script.of(StepDone)
        for output in event.outputs
    ]
    assert deltas == [
        ("text", None),
        ("ids", None),
        ("text", "abort"),
        ("ids", None),
        ("ids", "length"),
    ]
    assert not engine.requests


def test_a_heartbeat_sends_the_stats_only_when_due_and_evictions_at_most_that_often():
    engine = FakeEngine()
    script = Script(*idle(3))  # three idle seconds, then Shutdown
    core = _core(engine, script, heartbeat=2.0, eviction_interval=2.0)
    assert engine.block_manager.evicted_hashes is not None
    engine.block_manager.evicted_hashes.extend([11, 12])
    core.run(script)
    reports = script.of(StepDone)
    assert len(reports) == 1 and reports[0].outputs == []  # at the second second only
    assert reports[0].evicted == [11, 12] and engine.block_manager.evicted_hashes == []


def test_without_a_heartbeat_every_iteration_reports():
    script = Script(*idle(2))
    _core(FakeEngine(), script).run(script)
    assert len(script.of(StepDone)) == 2


def test_an_idle_core_checks_health_each_wait_and_raises_what_the_check_raises():
    engine = FakeEngine()
    script = Script(*idle(2))
    _core(engine, script).run(script)
    assert engine.runner.checks == 2 and script.now == 2 * HEALTH_CHECK_SECONDS
    engine.runner.healthy = False
    with pytest.raises(EngineDeadError, match="rank 1 exited"):
        script = Script(*idle(1))
        _core(engine, script).run(script)
