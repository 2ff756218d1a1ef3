"""EngineCore: one LLMEngine and what its clients ask of it, driven by one loop (`run`) whichever
transport carries the commands and events (engine_transport.py: a queue in AsyncEngine's engine
thread, or the pipes of a data-parallel replica's process).

The loop runs the commands that came in (waiting for one while the engine is idle, and checking on
a tensor-parallel group's other ranks each second it waits), then a step, then hands the step's
events over. A request whose grammar compiles off the engine thread is accepted only once it has
compiled (its compile error is the request's error, not an abort once the response has begun);
embedding calls are gathered back from the scheduler's embedding requests. A step that fails
ends only the requests it ran (each gets the error; an embedding call fails whole), and the loop
goes on; a failure the engine cannot survive (engine/core/step_failure.py) ends `run`. With a
`heartbeat`, a step with nothing to report still sends the stats at least that often (a
replica's sign of life); with `eviction_interval`, the prefix blocks the engine evicted are
reported at most that often.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from localchat.engine.core.embedding_groups import EmbeddingGroups
from localchat.engine.core.engine_messages import (
    AbortRequest,
    Accepted,
    AddRequest,
    Embedded,
    EmbedPrompts,
    EngineCommand,
    EngineEvent,
    Failed,
    SetSpeculative,
    Shutdown,
    StepDone,
    embed_request_ids,
)
from localchat.engine.core.llm_engine import LLMEngine
from localchat.engine.core.multimodal import ImageInput
from localchat.engine.core.outputs import RequestOutput
from localchat.engine.core.sequence import Request
from localchat.engine.sampling.guided_decoding import grammar_error
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.errors import (
    EngineDeadError,
    EngineStepError,
    InvalidParameterError,
    LocalchatError,
)

logger = logging.getLogger("localchat.engine")
HEALTH_CHECK_SECONDS = 1.0  # how often an idle engine checks on its tensor-parallel ranks


class CoreTransport(Protocol):
    """How commands reach an EngineCore and its events leave it."""

    def receive(self, timeout: float) -> EngineCommand | None:
        """The next command, waiting up to `timeout` seconds (0: only one already there)."""
        ...

    def emit(self, events: list[EngineEvent]) -> None:
        """Hand a list of events to the client, in order."""
        ...


class EngineCore:
    """An LLMEngine with command handling, grammar acceptance, embeddings and health checks."""

    def __init__(
        self,
        engine: LLMEngine,
        *,
        heartbeat: float = 0.0,
        eviction_interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`heartbeat` 0 reports the stats after every step; `eviction_interval` None reports no
        evictions."""
        self.engine = engine
        self.heartbeat = heartbeat
        self.eviction_interval = eviction_interval
        self._clock = clock
        self._accepting: dict[str, Request] = {}  # added, accepted once their grammar compiles
        self._embeddings: EmbeddingGroups[int] = EmbeddingGroups()  # calls waiting, by embed_id
        self._evicted: list[int] = []
        if eviction_interval is not None:
            engine.block_manager.evicted_hashes = self._evicted
        self._last_sent = self._last_report = clock()

    def run(self, transport: CoreTransport) -> None:
        """The drive loop: returns once asked to shut down; raises what a step (or a health check)
        raised."""
        engine = self.engine
        while True:
            if not engine.has_unfinished():
                command = transport.receive(HEALTH_CHECK_SECONDS)
                if command is None:
                    self.check_health()
                elif not self.handle(command, transport):
                    return
            while (command := transport.receive(0.0)) is not None:
                if not self.handle(command, transport):
                    return
            self.step(transport)

    def check_health(self) -> None:
        """Raise EngineDeadError if a tensor-parallel rank has died or hangs (idle, no collective
        would notice)."""
        self.engine.runner.check_health()

    def close(self) -> None:
        """Stop a tensor-parallel group's other ranks."""
        self.engine.runner.close()

    # --- commands ---------------------------------------------------------------------------------
    def handle(self, command: EngineCommand, transport: CoreTransport) -> bool:
        """Run one command; False once asked to shut down."""
        engine = self.engine
        match command:
            case Shutdown():
                for request_id in list(engine.requests):
                    engine.abort(request_id)
                return False
            case AddRequest():
                self._add(command, transport)
            case EmbedPrompts(embed_id, prompts, pooling):
                ids = embed_request_ids(embed_id, len(prompts))
                error = self._embeddings.add(engine, embed_id, ids, prompts, pooling)
                if error is not None:
                    transport.emit([Embedded(embed_id, error)])
            case SetSpeculative(config):
                try:
                    engine.set_speculative(config)
                except LocalchatError as exc:  # a client that could not check it (a DP replica's)
                    logger.warning("speculative config not applied: %s", exc.message)
            case AbortRequest(request_id):
                self._embeddings.discard(request_id)
                self._accepting.pop(request_id, None)
                output = engine.abort(request_id)
                if output is not None:
                    transport.emit([StepDone([output], engine.stats(), [])])
        return True

    def _add(self, command: AddRequest, transport: CoreTransport) -> None:
        added = add_or_error(
            self.engine, command.request_id, command.prompt, command.params, command.images
        )
        if isinstance(added, Request) and has_grammar(added):
            self._accepting[command.request_id] = added  # Accepted once its grammar compiles
        elif isinstance(added, Request):
            transport.emit([Accepted(command.request_id, _text_prompt_ids(added), None)])
        else:
            transport.emit([Accepted(command.request_id, None, added)])

    # --- steps ------------------------------------------------------------------------------------
    def step(self, transport: CoreTransport) -> None:
        """Run a step (if anything is unfinished) and emit its events: acceptances, the requests
        a failed step ended, then the deltas with the stats (when there are deltas, finished
        embeddings, a failure, or the heartbeat is due), then the embedding calls now complete or
        failed. A step that fails ends only its own requests (LLMEngine.step); a failure the engine
        cannot survive is raised from here."""
        engine = self.engine
        events: list[EngineEvent] = []
        failed: list[EngineEvent] = []
        try:
            outputs = engine.step() if engine.has_unfinished() else []
        except EngineStepError as failure:
            outputs, failed = [], self._fail(failure, events)
        if self._accepting:
            outputs = self._accept(outputs, events)
        embedded = self._embeddings.collect(engine.take_embedded()) if self._embeddings else []
        now = self._clock()
        if outputs or embedded or failed or now - self._last_sent >= self.heartbeat:
            events.append(StepDone(outputs, engine.stats(), self._take_evicted(now)))
            self._last_sent = now
        # after the stats: a /metrics scrape once the answer is out already counts its prompts
        events.extend(Embedded(embed_id, vectors) for embed_id, vectors in embedded)
        events.extend(failed)
        if events:
            transport.emit(events)

    def _fail(self, failure: EngineStepError, events: list[EngineEvent]) -> list[EngineEvent]:
        """Tell the clients of a failed step's requests (ended by the engine): a request still
        waiting for its grammar's acceptance is refused, a generation ends with the error (added to
        `events`), and an embedding call fails whole (its other prompts aborted): returns those."""
        ids = list(failure.request_ids)
        keys, embedding = self._embeddings.fail(ids)
        for request_id in embedding.difference(ids):
            self.engine.abort(request_id)
        refused = [i for i in ids if self._accepting.pop(i, None) is not None]
        events.extend(Accepted(i, None, failure) for i in refused)
        ended = [i for i in ids if i not in embedding and i not in refused]
        if ended:
            events.append(Failed(ended, failure))
        return [Embedded(key, failure) for key in keys]

    def _accept(
        self, outputs: list[RequestOutput], events: list[EngineEvent]
    ) -> list[RequestOutput]:
        """Add an Accepted event for each request whose grammar has compiled since the last step;
        returns the step's outputs less the aborts of those whose compile failed."""
        rejected = set()
        for request_id, request in list(self._accepting.items()):
            outcome = compiled(self.engine, request)
            if outcome is None:
                continue
            del self._accepting[request_id]
            if isinstance(outcome, LocalchatError):
                rejected.add(request_id)
                events.append(Accepted(request_id, None, outcome))
            else:
                events.append(Accepted(request_id, _text_prompt_ids(request), None))
        return [o for o in outputs if o.request_id not in rejected] if rejected else outputs

    def _take_evicted(self, now: float) -> list[int]:
        """The blocks evicted since the last report, when one is due."""
        interval = self.eviction_interval
        if interval is None or now - self._last_report < interval:
            return []
        evicted, self._last_report = self._evicted[:], now
        self._evicted.clear()
        return evicted


def _text_prompt_ids(request: Request) -> list[int] | None:
    """A text prompt's token ids (the client of a token-id prompt has them already)."""
    return request.prompt_token_ids if request.prompt is not None else None


def add_or_error(
    engine: LLMEngine,
    request_id: str,
    prompt: str | list[int],
    params: SamplingParams,
    images: tuple[ImageInput, ...] = (),
) -> Request | LocalchatError:
    """engine.add_request's request, or the error to hand its caller."""
    try:
        if images:
            return engine.add_request(request_id, prompt, params, images)
        return engine.add_request(request_id, prompt, params)
    except LocalchatError as exc:
        return exc
    except Exception as exc:  # a bad prompt must not take the engine down
        return InvalidParameterError(f"invalid request: {exc}")


def has_grammar(request: Request) -> bool:
    """Whether the request's acceptance waits for its grammar to compile (off the engine thread):
    a grammar that passed the server's tokenizer-free check can still fail for this tokenizer (a
    token id beyond the vocabulary, an unknown special token), and that is the request's error
    (a 400), not an abort once the response has begun."""
    constraints = request.constraints
    return constraints is not None and constraints.grammar is not None


def compiled(engine: LLMEngine, request: Request) -> list[int] | LocalchatError | None:
    """The acceptance of a request that `has_grammar`: None while the grammar compiles, then the
    prompt ids, or the compile's error (the request is aborted: drop its abort output). Call it
    after a step, before handing out its outputs: a step aborts a request whose compile failed
    only if the compile had failed before the step, so that output is in the step's outputs."""
    future = request.constraints.grammar if request.constraints else None
    if future is None:
        return request.prompt_token_ids
    if not future.done():
        return None
    error = EngineDeadError("the engine shut down") if future.cancelled() else future.exception()
    if error is None:
        return request.prompt_token_ids
    engine.abort(request.request_id)
    if isinstance(error, LocalchatError):
        return error
    return grammar_error(error)
