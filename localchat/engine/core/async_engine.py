"""AsyncEngine: one LLMEngine in a background thread, streamed to many asyncio consumers.

The engine thread runs an EngineCore (engine_core.py) over a ThreadTransport: the asyncio side only
enqueues commands (engine_messages.py) and reads per-request queues of deltas, which the core's
events fill from the engine thread. Deltas of one step reach each event loop in a single
call_soon_threadsafe; a request added with a `stream_interval` has its deltas held and handed over
at most once per interval, so a consumer that does not need every token at once (the chat, which
paints a few times a second) wakes its event loop far less often. Leaving the `async for` early
(break, exception, task cancellation, client disconnect) aborts the request and frees its blocks.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from localchat.config import EngineConfig
from localchat.engine.core.engine_client import EngineClient, TextFront
from localchat.engine.core.engine_core import EngineCore
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
from localchat.engine.core.engine_transport import ThreadTransport
from localchat.engine.core.llm_engine import EngineStats, LLMEngine
from localchat.engine.core.memory import freeze_gc
from localchat.engine.core.multimodal import ImageInput
from localchat.engine.core.outputs import RequestOutput
from localchat.engine.core.request_stream import (
    QueueItems,
    RequestStream,
    StreamState,
    put_all_from_thread,
    settle_from_thread,
)
from localchat.engine.loading.model_info import ModelInfo
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.errors import EngineDeadError, InvalidParameterError, QueueFullError

logger = logging.getLogger("localchat.engine")


class AsyncEngine(TextFront, EngineClient):
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
        **kwargs: Any,
    ):
        """`on_load_progress` is called from the engine thread with a line per loading stage."""
        self.config = config or EngineConfig.from_kwargs(**kwargs)
        self.max_waiting = max_waiting
        self.engine: LLMEngine | None = None
        self.error: BaseException | None = None
        self._on_load_progress = on_load_progress
        self._commands: queue.SimpleQueue[EngineCommand] = queue.SimpleQueue()
        self._codec = None  # the event loop's own tokenizer (see text_codec.py)
        self._streams: dict[str, StreamState] = {}
        self._holding: dict[str, StreamState] = {}  # engine thread: streams with held deltas
        self._clock: Callable[[], float] = time.monotonic  # when held deltas are due
        # embed() calls waiting, by id: each its answer and its count of prompts
        self._embeds: dict[int, tuple[asyncio.Future[np.ndarray], int]] = {}
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
        self._commands.put(Shutdown())
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

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
        images: tuple[ImageInput, ...] = (),
    ) -> RequestStream:
        """Validate and queue a request (with the pictures whose placeholder tokens its prompt
        holds); raises its LocalchatError here, before any output.

        With `stream_interval` (seconds), deltas after the first token are held in the engine
        thread and handed over together, at most once per interval; the first token and the last
        delta go at once, so time to first token and the reply's end are not delayed."""
        engine = self._check_alive()
        params = params or SamplingParams()
        if self.max_waiting is not None:
            self._check_room(engine.scheduler.max_num_seqs, params.n, f"n ({params.n}) is", "n")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise InvalidParameterError(
                f"request id {request_id!r} is already in use", param="request_id"
            )
        stream = StreamState(
            asyncio.get_running_loop(), interval=stream_interval, sequences=params.n
        )
        accepted = stream.accepted = stream.loop.create_future()
        self._streams[request_id] = stream
        self._commands.put(AddRequest(request_id, prompt, params, images))
        try:
            prompt_token_ids = await accepted
        except BaseException as exc:
            self._streams.pop(request_id, None)
            if isinstance(exc, asyncio.CancelledError):  # it may be in the engine already
                self.abort(request_id)
            raise
        if prompt_token_ids is None:  # token ids: the engine's are a copy of ours
            prompt_token_ids = list(prompt)
        return RequestStream(self, request_id, stream, prompt_token_ids)

    def _check_room(self, running: int, sequences: int, what: str, param: str) -> None:
        """Raise unless `sequences` more (a request's n, an embedding call's inputs; `what` says
        which, as "n (5) is") fit within the `running` sequences and max_waiting beyond them,
        beside those of every request and embedding call in flight: what never could is a 400
        naming `param`, what cannot now a 503."""
        capacity = running + (self.max_waiting or 0)
        if sequences > capacity:
            raise InvalidParameterError(
                f"{what} more sequences than this server runs and queues at once ({capacity})",
                param=param,
            )
        # snapshots: the engine thread drops finished ones meanwhile
        streams, embeds = list(self._streams.values()), list(self._embeds.values())
        taken = sum(s.sequences for s in streams) + sum(count for _, count in embeds)
        if taken + sequences > capacity:
            raise QueueFullError(
                f"too many requests are waiting (more than {self.max_waiting} sequences beyond "
                f"the {running} running); retry later"
            )

    def abort(self, request_id: str) -> None:
        self._commands.put(AbortRequest(request_id))

    def set_speculative(self, config: dict | str | None) -> None:
        checked = self._check_alive().check_speculative(config)  # reads only what never changes
        self._commands.put(SetSpeculative(None if checked is None else checked.to_dict()))

    async def embed(self, prompts: list[list[int]], pooling: str) -> np.ndarray:
        """One pooled, L2-normalized hidden-state vector per prompt ([prompts, hidden] float32):
        embedding requests of the engine's scheduler (LLMEngine.add_embeddings), batched with the
        running generation. Each prompt takes a place of the max_waiting bound as a sequence does.
        Cancelling the call aborts them."""
        engine = self._check_alive()
        if self.max_waiting is not None:
            what = f"input's {len(prompts)} entries are"
            self._check_room(engine.scheduler.max_num_seqs, len(prompts), what, "input")
        done: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        embed_id = next(self._ids)
        self._embeds[embed_id] = (done, len(prompts))
        self._commands.put(EmbedPrompts(embed_id, prompts, pooling))
        try:
            return await done
        except asyncio.CancelledError:
            self._embeds.pop(embed_id, None)
            for request_id in embed_request_ids(embed_id, len(prompts)):
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
            EngineCore(engine).run(ThreadTransport(self._commands, self._on_events))
        except BaseException as exc:
            logger.error("engine step failed:\n%s", traceback.format_exc())
            self.error = exc
            self._fail_all(EngineDeadError(f"the engine stopped after an error: {exc}"))
            return
        self._fail_all(EngineDeadError("the engine shut down"))

    def _on_events(self, events: list[EngineEvent]) -> None:
        """The core's events: acceptances settled, deltas handed over, embeddings answered."""
        for event in events:  # the stats first, so consumers see the step's state
            if isinstance(event, StepDone):
                self._stats = event.stats
        for event in events:
            match event:
                case Accepted(request_id, prompt_token_ids, error):
                    stream = self._streams.get(request_id)
                    if stream is None or stream.accepted is None:
                        continue
                    if error is not None:  # refused: the request and its stream are gone
                        self._streams.pop(request_id, None)
                    settle_from_thread(
                        stream.accepted, prompt_token_ids if error is None else error
                    )
                case StepDone(outputs):
                    self._deliver(outputs)
                case Failed(request_ids, error):
                    self._end_streams(request_ids, error)
                case Embedded(embed_id, result):
                    waiting = self._embeds.pop(embed_id, None)
                    if waiting is not None:
                        settle_from_thread(waiting[0], result)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's deltas to their event loops (holding those of streams with an interval
        until it has passed), with the held deltas that are due."""
        by_loop: dict[asyncio.AbstractEventLoop, QueueItems] = {}
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
            put_all_from_thread(loop, items)

    def _hand_over(
        self,
        by_loop: dict[asyncio.AbstractEventLoop, QueueItems],
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
        """End every call and stream still waiting with `error` (after what was made)."""
        embeds, self._embeds = self._embeds, {}
        for done, _ in embeds.values():
            settle_from_thread(done, error)
        self._holding = {}
        self._end_streams(list(self._streams), error)

    def _end_streams(self, request_ids: list[str], error: BaseException) -> None:
        """End the streams of `request_ids` with `error`, after the deltas they hold."""
        by_loop: dict[asyncio.AbstractEventLoop, QueueItems] = {}
        for request_id in request_ids:
            stream = self._streams.pop(request_id, None)
            if stream is None:
                continue
            self._holding.pop(request_id, None)
            if stream.accepted is not None and not stream.accepted.done():
                settle_from_thread(stream.accepted, error)
            items = by_loop.setdefault(stream.loop, [])
            items.extend((stream.queue, held) for held in stream.held)  # what was made, then why
            items.append((stream.queue, error))
        for loop, items in by_loop.items():
            put_all_from_thread(loop, items)
