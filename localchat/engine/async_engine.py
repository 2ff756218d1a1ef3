"""AsyncEngine: one LLMEngine in a background thread, streamed to many asyncio consumers.

The engine thread owns torch; the asyncio side only enqueues commands and reads per-request queues
of deltas. Deltas of one step reach each event loop in a single call_soon_threadsafe; a request
added with a `stream_interval` has its deltas held and handed over at most once per interval, so a
consumer that does not need every token at once (the chat, which paints a few times a second) wakes
its event loop far less often. Leaving the `async for` early (break, exception, task cancellation,
client disconnect) aborts the request and frees its blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from localchat.config import EngineConfig
from localchat.engine.embedding_groups import EmbeddingGroups
from localchat.engine.engine_client import TextFront
from localchat.engine.guided_decoding import grammar_error
from localchat.engine.llm_engine import EngineStats, LLMEngine
from localchat.engine.memory import freeze_gc
from localchat.engine.model_info import ModelInfo
from localchat.engine.outputs import RequestOutput
from localchat.engine.request_stream import (
    RequestStream,
    StreamState,
    put_all,
    settle,
    settle_from_thread,
)
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.sequence import Request
from localchat.errors import (
    EngineDeadError,
    InvalidParameterError,
    LocalchatError,
    QueueFullError,
)

logger = logging.getLogger("localchat.engine")
HEALTH_CHECK_SECONDS = 1.0  # how often an idle engine checks on its tensor-parallel ranks


@dataclass(frozen=True, slots=True)
class _Add:
    """Queue a request; `accepted` is settled (on the caller's loop) with its prompt ids or its
    error."""

    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    accepted: asyncio.Future


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class _Embed:
    """Pooled hidden states of prompts, one embedding request each (ids `request_ids`) in the
    engine's scheduler; `done` gets the vectors or the error."""

    prompts: list[list[int]]
    pooling: str
    done: asyncio.Future
    request_ids: list[str]


@dataclass(frozen=True, slots=True)
class _Stop:
    """Abort everything and end the engine thread."""


_Command = _Add | _Abort | _Embed | _Stop


class AsyncEngine(TextFront):
    """Serve one model to many concurrent coroutines.

    `max_waiting` bounds the requests queued beyond the `max_num_seqs` that can run: past it,
    add_request raises QueueFullError (the server's 503).

    >>> engine = AsyncEngine(EngineConfig())
    >>> await engine.start()
    >>> async for delta in engine.generate("Hello", SamplingParams(max_tokens=8)):
    ...     print(delta.outputs[0].text, end="")
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        max_waiting: int | None = None,
        on_load_progress: Callable[[str], None] | None = None,
        **kwargs,
    ):
        """`on_load_progress` is called from the engine thread with a line per loading stage."""
        self.config = config or EngineConfig.from_kwargs(**kwargs)
        self.max_waiting = max_waiting
        self.engine: LLMEngine | None = None
        self.error: BaseException | None = None
        self._on_load_progress = on_load_progress
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._codec = None  # the event loop's own tokenizer (see text_codec.py)
        self._streams: dict[str, StreamState] = {}
        self._holding: dict[str, StreamState] = {}  # engine thread: streams with held deltas
        self._clock: Callable[[], float] = time.monotonic  # when held deltas are due
        # engine thread: added requests whose acceptance waits for their grammar (see _accept)
        self._accepting: dict[str, tuple[asyncio.Future, Request]] = {}
        # engine thread: the embed() calls waiting, by their futures
        self._embeddings: EmbeddingGroups[asyncio.Future] = EmbeddingGroups()
        self._ids = itertools.count()
        self._ready = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._stats: EngineStats | None = None

    # --- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> AsyncEngine:
        """Load the model in the engine thread; returns when it is ready (raises what loading
        raised)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="localchat-engine", daemon=True)
            self._thread.start()
        await asyncio.get_running_loop().run_in_executor(None, self._ready.wait)
        if self.engine is None:
            raise self.error or EngineDeadError("the engine failed to start")
        return self

    @property
    def is_ready(self) -> bool:
        return self.engine is not None and self.error is None and not self._stopping

    @property
    def is_dead(self) -> bool:
        return self.error is not None

    async def shutdown(self) -> None:
        """Abort everything, stop the engine thread and wait for it."""
        self._stopping = True
        self._commands.put(_Stop())
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    # --- model facts (the text side is TextFront's) ---------------------------------------------
    @property
    def model_info(self) -> ModelInfo:
        if self.engine is None:
            raise EngineDeadError("the engine is not started")
        return self.engine.model_info

    # --- requests ---------------------------------------------------------------------------------
    async def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        stream_interval: float = 0.0,
    ) -> RequestStream:
        """Validate and queue a request; raises its LocalchatError here, before any output.

        With `stream_interval` (seconds), deltas after the first token are held in the engine
        thread and handed over together, at most once per interval; the first token and the last
        delta go at once, so time to first token and the reply's end are not delayed."""
        engine = self._check_alive()
        capacity = engine.scheduler.max_num_seqs + (self.max_waiting or 0)
        if self.max_waiting is not None and len(self._streams) >= capacity:
            raise QueueFullError(
                f"too many requests are waiting (more than {self.max_waiting} beyond the "
                f"{engine.scheduler.max_num_seqs} running); retry later"
            )
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise InvalidParameterError(
                f"request id {request_id!r} is already in use", param="request_id"
            )
        stream = StreamState(asyncio.get_running_loop(), interval=stream_interval)
        self._streams[request_id] = stream
        accepted: asyncio.Future = stream.loop.create_future()
        self._commands.put(_Add(request_id, prompt, params or SamplingParams(), accepted))
        try:
            prompt_token_ids = await accepted
        except BaseException as exc:
            self._streams.pop(request_id, None)
            if isinstance(exc, asyncio.CancelledError):  # it may be in the engine already
                self.abort(request_id)
            raise
        return RequestStream(self, request_id, stream, prompt_token_ids)

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        stream = await self.add_request(prompt, params, request_id)
        async for delta in stream:
            yield delta

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    async def embed(self, prompts: list[list[int]], pooling: str) -> list[list[float]]:
        """One pooled, L2-normalized hidden-state vector per prompt: embedding requests of the
        engine's scheduler (LLMEngine.add_embeddings), batched with the running generation.
        Cancelling the call aborts them."""
        self._check_alive()
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        ids = [f"embed-{next(self._ids)}" for _ in prompts]
        self._commands.put(_Embed(prompts, pooling, done, ids))
        try:
            return await done
        except asyncio.CancelledError:
            for request_id in ids:
                self.abort(request_id)
            raise

    def stats(self) -> EngineStats | None:
        """The engine's figures as of its last step; None until it has loaded."""
        if self._stats is None and self.engine is not None:
            self._stats = self.engine.stats()
        return self._stats

    def _check_alive(self) -> LLMEngine:
        if self.error is not None:
            raise EngineDeadError(f"the engine stopped after an error: {self.error}")
        if self._stopping:
            raise EngineDeadError("the engine is shutting down")
        if self.engine is None:
            raise EngineDeadError("the engine is not started")
        return self.engine

    # --- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            engine = LLMEngine(self.config, progress=self._on_load_progress)
            self._codec = engine.codec.copy()
            self._stats = engine.stats()
            self.engine = engine
            freeze_gc()  # what is alive now lives as long as the engine: see memory.py
        except BaseException as exc:  # reported by start()
            self.error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while True:
                if not self._handle_commands(engine, block=not engine.has_unfinished()):
                    break
                outputs = engine.step() if engine.has_unfinished() else []
                # before delivering, so consumers see the step's state
                self._stats = engine.stats()
                if self._accepting:  # before delivering: a rejected request's abort is dropped
                    self._accept(engine)
                self._deliver(outputs)
                if self._embeddings:
                    for done, vectors in self._embeddings.collect(engine.take_embedded()):
                        settle_from_thread(done, vectors)
        except BaseException as exc:
            logger.error("engine step failed:\n%s", traceback.format_exc())
            self.error = exc
            self._fail_all(EngineDeadError(f"the engine stopped after an error: {exc}"))
            return
        self._fail_all(EngineDeadError("the engine shut down"))

    def _handle_commands(self, engine: LLMEngine, block: bool) -> bool:
        """Run queued commands (waiting for one when idle); False once asked to stop."""
        while True:
            try:
                command = self._commands.get(block=block, timeout=HEALTH_CHECK_SECONDS)
            except queue.Empty:
                if not block:
                    return True
                # idle: a tensor-parallel rank that died meanwhile is an error now, not at the next
                # request (raises EngineDeadError, which stops the engine like a failed step)
                check = getattr(engine.runner, "check_health", None)
                if check is not None:
                    check()
                continue
            block = False
            match command:
                case _Stop():
                    for request_id in list(engine.requests):
                        engine.abort(request_id)
                    return False
                case _Add():
                    self._add(engine, command)
                case _Embed():
                    self._add_embeddings(engine, command)
                case _Abort(request_id):
                    self._embeddings.discard(request_id)
                    self._accepting.pop(request_id, None)
                    output = engine.abort(request_id)
                    if output is not None:
                        self._stats = engine.stats()
                        self._deliver([output])

    def _add(self, engine: LLMEngine, command: _Add) -> None:
        added = add_or_error(engine, command.request_id, command.prompt, command.params)
        if isinstance(added, Request) and has_grammar(added):
            self._accepting[command.request_id] = (command.accepted, added)
            return
        settle_from_thread(
            command.accepted, added.prompt_token_ids if isinstance(added, Request) else added
        )

    def _accept(self, engine: LLMEngine) -> None:
        """Settle the acceptance of the requests whose grammar has compiled since the last step:
        their prompt ids, or the compile's error (that request is gone, its stream with it)."""
        for request_id, (accepted, request) in list(self._accepting.items()):
            outcome = compiled(engine, request)
            if outcome is None:
                continue
            del self._accepting[request_id]
            if isinstance(outcome, LocalchatError):
                self._streams.pop(request_id, None)
            settle_from_thread(accepted, outcome)

    def _add_embeddings(self, engine: LLMEngine, command: _Embed) -> None:
        error = self._embeddings.add(
            engine, command.done, command.request_ids, command.prompts, command.pooling
        )
        if error is not None:
            settle_from_thread(command.done, error)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's deltas to their event loops (holding those of streams with an interval
        until it has passed), with the held deltas that are due."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        now = self._clock()
        for output in outputs:
            request_id = output.request_id
            stream = self._streams.get(request_id)
            if stream is None:
                continue
            if output.finished:  # pop: add_request may have dropped it meanwhile (cancelled)
                self._streams.pop(request_id, None)
            elif now < stream.next_at:
                stream.held.append(output)
                self._holding[request_id] = stream
                continue
            self._hand_over(by_loop, request_id, stream, output, now)
        for request_id, stream in list(self._holding.items()):
            if now >= stream.next_at:  # due, though no delta came this step (preempted)
                self._hand_over(by_loop, request_id, stream, None, now)
        for loop, items in by_loop.items():
            # a RuntimeError: that event loop is closed, nobody is listening
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(put_all, items)

    def _hand_over(
        self,
        by_loop: dict[asyncio.AbstractEventLoop, list],
        request_id: str,
        stream: StreamState,
        output: RequestOutput | None,
        now: float,
    ) -> None:
        """Queue the stream's held deltas and `output` for its event loop; once a token has gone,
        the next delta waits for the stream's interval."""
        items = by_loop.setdefault(stream.loop, [])
        handed_tokens = bool(stream.held)  # held deltas come after the first token
        if stream.held:
            items.extend((stream.queue, held) for held in stream.held)
            stream.held = []
            del self._holding[request_id]
        if output is not None:
            items.append((stream.queue, output))
            handed_tokens = handed_tokens or output.num_output_tokens > 0
        if stream.interval and handed_tokens:
            stream.next_at = now + stream.interval

    def _fail_all(self, error: BaseException) -> None:
        while True:  # requests still queued will never be added: fail their acceptance
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if (
                isinstance(command, _Add)
                and (stream := self._streams.get(command.request_id)) is not None
            ):
                stream.loop.call_soon_threadsafe(settle, command.accepted, error)
            elif isinstance(command, _Embed):
                settle_from_thread(command.done, error)
        for done in self._embeddings.drain():
            settle_from_thread(done, error)
        accepting, self._accepting = self._accepting, {}
        for accepted, _ in accepting.values():
            settle_from_thread(accepted, error)
        streams, self._streams = self._streams, {}
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        self._holding = {}
        for stream in streams.values():
            items = by_loop.setdefault(stream.loop, [])
            items.extend((stream.queue, held) for held in stream.held)  # what was made, then why
            items.append((stream.queue, error))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # as in _deliver: that loop is closed
                loop.call_soon_threadsafe(put_all, items)


def add_or_error(
    engine: LLMEngine, request_id: str, prompt: str | list[int], params: SamplingParams
) -> Request | LocalchatError:
    """engine.add_request's request, or the error to hand its caller. A request that
    `has_grammar` is accepted only once `compiled` says so."""
    try:
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
