"""`localchat serve --data-parallel-size N`: N engine replicas, each in a spawned process of its
own (replica_process.py), behind the one HTTP front end.

DataParallelEngine is an EngineClient (engine_client.py), as the server's AsyncEngine is: the event
loop tokenizes and renders chats with replica 0's tokenizer, routes each request with a
PrefixRouter (replica_router.py), and follows its deltas from the replica's pipe (the commands
and events of engine_messages.py, as an EngineCore speaks them). Each replica (replica.py) has a
sender thread that writes its commands and a reader thread that hands its events to the event loop.

Failure: a replica whose engine step fails ends only that step's requests (each gets the error)
and serves on, as a single engine does. A replica that exits (its pipe closes) or sends nothing for
LOCALCHAT_DP_TIMEOUT seconds (it sends a message at least every second, idle or busy) is declared
dead and killed. The requests its engine had accepted end with an EngineDeadError naming it and
are not sent anywhere else: one of them may be what killed it, and sent on it could kill each
replica in turn (vLLM and llama.cpp fail them too). A request it had not accepted yet (still in
its pipe, or its grammar compiling) never ran there: it is routed again to a live replica, once.
/health answers 503, and the remaining replicas go on serving new requests. The dead replica is
started again (at most LOCALCHAT_DP_RESTARTS times in 10 minutes): once it has loaded it takes
requests and /health is 200 again. Every wait on a replica ends when the replica answers, dies, or
times out. The replicas report the prefix blocks
their engines evicted, which the router drops.

/metrics keeps every single-engine series, each summed over the replicas (the KV usage weighted by
their blocks), and adds `localchat_replica_*` series labelled `replica`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Iterator

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from localchat import envs
from localchat.config import EngineConfig
from localchat.engine.core.engine_client import EngineClient, TextFront
from localchat.engine.core.engine_messages import (
    AbortRequest,
    Accepted,
    AddRequest,
    CoreFailed,
    CoreReady,
    Embedded,
    EmbedPrompts,
    EngineEvent,
    Failed,
    LoadFailed,
    SetSpeculative,
    Shutdown,
    Started,
    StepDone,
    embed_request_ids,
)
from localchat.engine.core.llm_engine import EngineStats
from localchat.engine.core.multimodal import ImageInput
from localchat.engine.core.outputs import RequestOutput
from localchat.engine.core.request_stream import RequestStream, StreamState, settle
from localchat.engine.distributed.replica import Replica, replica_devices, replica_threads
from localchat.engine.distributed.replica_metrics import replica_metrics
from localchat.engine.distributed.replica_process import ReplicaArgs
from localchat.engine.distributed.replica_router import PrefixRouter
from localchat.engine.loading.model_info import ModelInfo
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.engine.speculative.config import SpeculativeConfig
from localchat.errors import EngineDeadError, InvalidParameterError, QueueFullError

logger = logging.getLogger("localchat.server")
STOP_TIMEOUT = 10.0
WATCH_INTERVAL = 0.5
RESTART_WINDOW = 600.0  # LOCALCHAT_DP_RESTARTS counts a replica's restarts in this many seconds


async def _exited(replica: Replica, within: float) -> int | None:
    """The replica's exit code once its process has exited, waiting up to `within` seconds (None if
    it is still running then)."""
    deadline = time.monotonic() + within
    while replica.process.exitcode is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return replica.process.exitcode


@dataclasses.dataclass
class _Tracked:
    """A request in flight on a replica: its stream, and its tokens so far (for the router);
    `accepted` None once the replica's engine took it, `resent` once routed again after a replica
    died, `aborted` once the client gave it up."""

    stream: StreamState
    replica: Replica
    tokens: list[int]
    accepted: asyncio.Future | None
    params: SamplingParams
    images: tuple[ImageInput, ...] = ()  # the prompt's pictures, sent along with it
    resent: bool = False
    aborted: bool = False


class DataParallelEngine(TextFront, EngineClient):
    """`size` replicas of `config`, each its own process; used by the server like an AsyncEngine.

    `max_waiting` bounds each replica's requests beyond its `max_num_seqs`; a request goes to
    another replica when its own is full, and is refused (QueueFullError) when all are.
    """

    def __init__(
        self,
        config: EngineConfig,
        size: int,
        *,
        max_waiting: int | None = None,
        log_level: int = logging.INFO,
        router: PrefixRouter | None = None,
    ):
        if size < 1:
            raise InvalidParameterError(
                f"--data-parallel-size must be >= 1, got {size}", param="data_parallel_size"
            )
        self.config = config
        self.max_waiting = max_waiting
        self.error: BaseException | None = None
        self.size = size
        self.log_level = log_level
        self.router = router or PrefixRouter(config.block_size)
        self.replicas: list[Replica] = []
        self._requests: dict[str, _Tracked] = {}
        self._embeds: dict[int, tuple[asyncio.Future, Replica]] = {}  # embed() calls waiting
        self._embed_ids = itertools.count()
        self._model_info: ModelInfo | None = None
        self._watchdog: asyncio.Task | None = None
        self._reaping: set[asyncio.Future] = set()
        self._ids = itertools.count()
        self._stopping = False
        self._replica_setup: tuple[int | None, list[str | None]] = (None, [])  # threads, devices
        self._restarts: dict[int, list[float]] = {}  # per replica, when it was started again
        self._starting: dict[int, Replica] = {}  # replicas loading again, by index

    # --- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> DataParallelEngine:
        """Spawn the replicas and wait until every one has loaded (raises the first load error)."""
        if self.replicas:
            return self
        loop = asyncio.get_running_loop()
        threads = replica_threads(self.config, self.size)
        self._replica_setup = (threads, replica_devices(self.config, self.size))
        for index in range(self.size):
            self.replicas.append(self._spawn(index, loop))
        atexit.register(self._kill_all)
        self._watchdog = asyncio.create_task(self._watch())
        try:  # each replica's reader settles `ready`: loaded, failed, or not in time
            infos = await asyncio.gather(*(r.ready for r in self.replicas))
        except BaseException:
            await self.shutdown()
            raise
        first = infos[0]
        self._model_info, self._codec = first.model_info, first.codec
        for replica, info in zip(self.replicas, infos, strict=True):
            logger.info(
                "data-parallel replica %d (pid %d) ready, %s threads",
                replica.index,
                info.pid,
                threads or "default",
            )
        return self

    def _spawn(self, index: int, loop: asyncio.AbstractEventLoop) -> Replica:
        """Replica `index`'s process, started with the engine's config as it is now (a speculative
        config set since start-up included)."""
        threads, devices = self._replica_setup
        config = dataclasses.replace(self.config, num_threads=threads)
        args = ReplicaArgs(index, config, devices[index], self.log_level, index == 0)
        return Replica(index, args, loop, self._on_events, self._on_load_timeout)

    def _schedule_restart(self, replica: Replica) -> None:
        """Start failed `replica` again, unless it failed LOCALCHAT_DP_RESTARTS times lately."""
        now = time.monotonic()
        recent = [t for t in self._restarts.get(replica.index, []) if now - t < RESTART_WINDOW]
        limit = envs.DP_RESTARTS.get()
        if len(recent) >= limit:
            if limit:
                logger.error(
                    "data-parallel replica %d is not started again: it failed %d times in %.0f s",
                    replica.index,
                    len(recent) + 1,
                    RESTART_WINDOW,
                )
            return
        self._restarts[replica.index] = [*recent, now]
        self._reaping.add(task := asyncio.ensure_future(self._restart(replica)))
        task.add_done_callback(self._reaping.discard)

    async def _restart(self, old: Replica) -> None:
        """Replace dead replica `old` with a new process once that one has loaded."""
        await _exited(old, 5.0)  # killed by _fail
        old.close_pipes()
        if self._stopping:
            return
        logger.warning("data-parallel replica %d: starting it again", old.index)
        new = self._starting[old.index] = self._spawn(old.index, asyncio.get_running_loop())
        try:
            info = await new.ready
        except BaseException as exc:  # it failed to load: it stays dead
            if not isinstance(exc, asyncio.CancelledError) and not self._stopping:
                logger.error("data-parallel replica %d did not start again: %s", old.index, exc)
            new.process.kill(timeout=0)
            new.close_pipes()
            return
        finally:
            self._starting.pop(old.index, None)
        if self._stopping or not new.alive:
            new.process.kill(timeout=0)
            return
        self.replicas[old.index] = new
        dead = [r for r in self.replicas if not r.alive]
        if dead:
            self._update_error()
        else:
            self.error = None
        logger.info("data-parallel replica %d (pid %d) ready again", new.index, info.pid)

    @property
    def is_ready(self) -> bool:
        return (
            self._model_info is not None
            and not self._stopping
            and all(r.alive for r in self.replicas)
        )

    @property
    def is_dead(self) -> bool:
        return self.error is not None

    @property
    def model_info(self) -> ModelInfo:
        if self._model_info is None:
            raise EngineDeadError("the engine is not started")
        return self._model_info

    async def shutdown(self) -> None:
        """Stop every replica (killed if it takes over STOP_TIMEOUT s) and fail what still runs."""
        self._stopping = True
        for replica in self.replicas:
            replica.send(Shutdown())
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline and any(
            r.process.exitcode is None for r in self.replicas
        ):
            await asyncio.sleep(0.05)
        self._kill_all()
        for replica in list(self._starting.values()):  # loading again: never to serve
            if not replica.ready.done():
                replica.ready.set_exception(EngineDeadError("the engine shut down"))
        for replica in self.replicas:
            self._fail(replica, "the engine shut down", report=False)
            replica.close_pipes()
            if replica.ready.done() and not replica.ready.cancelled():
                replica.ready.exception()  # retrieved: no "never retrieved" warning
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(BaseException):
                await self._watchdog

    def _kill_all(self) -> None:
        for replica in [*self.replicas, *self._starting.values()]:
            replica.process.kill()

    def _on_load_timeout(self, replica: Replica) -> None:
        if not replica.ready.done():
            replica.ready.set_exception(
                EngineDeadError(
                    "the data-parallel replicas did not load within "
                    f"{envs.DP_LOAD_TIMEOUT.get():.0f} s"
                )
            )

    async def _watch(self) -> None:
        """Declare dead the replicas that exited or went quiet for LOCALCHAT_DP_TIMEOUT seconds."""
        while not self._stopping:
            await asyncio.sleep(WATCH_INTERVAL)
            now = time.monotonic()
            quiet = envs.DP_TIMEOUT.get()
            for replica in self.replicas:
                if not replica.alive or self._stopping:
                    continue
                if replica.process.exitcode is not None:
                    self._fail(replica, f"it exited with code {replica.process.exitcode}")
                elif replica.info is not None and now - replica.last_seen > quiet:
                    replica.process.kill(timeout=0)
                    self._fail(replica, f"it sent nothing for {quiet:.0f} s (hung); killed")

    # --- events from the replicas (on the event loop) ---------------------------------------------
    def _on_events(self, replica: Replica, events: list[EngineEvent] | None) -> None:
        """A list of the replica's events, or None once its pipe closed."""
        replica.last_seen = time.monotonic()
        if events is None:
            if replica.alive and not self._stopping:
                self._reaping.add(task := asyncio.ensure_future(self._reap(replica)))
                task.add_done_callback(self._reaping.discard)
            return
        for event in events:
            self._on_event(replica, event)

    def _on_event(self, replica: Replica, event: EngineEvent) -> None:
        match event:
            case StepDone(outputs, stats, evicted):
                replica.stats = stats
                self.router.evict(evicted, replica.index)
                self._deliver_from(replica, outputs)
            case Accepted(request_id, _, error):
                tracked = self._requests.get(request_id)
                if tracked is None or tracked.replica is not replica:
                    return  # retried elsewhere: this replica never had it
                if error is not None:  # refused: never in the replica's engine
                    self._forget(request_id)
                if tracked.accepted is not None:
                    settle(tracked.accepted, error)
                    tracked.accepted = None
            case Failed(request_ids, error):
                for request_id in request_ids:
                    tracked = self._requests.get(request_id)
                    if tracked is not None and tracked.replica is replica:
                        self._forget(request_id)
                        tracked.stream.queue.put_nowait(error)
            case Embedded(embed_id, result):
                future, _ = self._embeds.pop(embed_id, (None, None))
                if future is not None:
                    settle(future, result)
            case CoreReady():
                replica.info, replica.stats = event, event.stats
                if not replica.ready.done():
                    replica.ready.set_result(event)
            case LoadFailed(error):
                if not replica.ready.done():
                    replica.ready.set_exception(error)
            case CoreFailed(why):
                self._fail(replica, f"its engine failed: {why}")
            case Started():
                pass

    async def _reap(self, replica: Replica) -> None:
        """The replica's pipe closed: give it a moment to exit, then report its exit code."""
        code = await _exited(replica, 2.0)
        self._fail(replica, "it exited" + (f" with code {code}" if code is not None else ""))

    def _deliver_from(self, replica: Replica, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            tracked = self._requests.get(output.request_id)
            if tracked is None or tracked.replica is not replica:  # retried elsewhere
                continue
            for out in output.outputs:
                if out.index == 0:
                    tracked.tokens.extend(out.token_ids)
            if output.finished:
                self._forget(output.request_id)
                if output.outputs and output.outputs[0].finish_reason != "abort":
                    self.router.record(
                        self.router.block_hashes(tracked.tokens), tracked.replica.index
                    )
            tracked.stream.queue.put_nowait(output)

    def _forget(self, request_id: str) -> _Tracked | None:
        tracked = self._requests.pop(request_id, None)
        if tracked is not None:
            tracked.replica.in_flight -= 1
        return tracked

    def _fail(self, replica: Replica, why: str, *, report: bool = True) -> None:
        """Replica `replica` is gone: end its requests with an error and stop routing to it."""
        if replica.alive:
            replica.alive = False
            replica.failure = why
            if report and not self._stopping:
                logger.error("data-parallel replica %d failed: %s", replica.index, why)
                self.router.forget(replica.index)
                self._update_error()
            if not self._stopping:
                replica.process.kill(timeout=0)
                if report and replica.index not in self._starting and replica.info is not None:
                    self._schedule_restart(replica)
        text = why if not report else f"data-parallel replica {replica.index} failed: {why}"
        error = EngineDeadError(text)
        if not replica.ready.done():
            replica.ready.set_exception(error)
        for request_id in [r for r, t in self._requests.items() if t.replica is replica]:
            tracked = self._forget(request_id)
            assert tracked is not None
            if report and not self._stopping and self._resend(request_id, tracked):
                continue  # it never ran there: another replica runs it
            if tracked.accepted is not None:
                settle(tracked.accepted, error)
            elif report and not self._stopping:  # it ran there: it may be what killed it
                text = f"{error.message}; this request was running there and is not retried"
                tracked.stream.queue.put_nowait(EngineDeadError(text))
                continue
            tracked.stream.queue.put_nowait(error)
        for embed_id in [e for e, (_, r) in self._embeds.items() if r is replica]:
            future, _ = self._embeds.pop(embed_id)
            settle(future, error)

    def _update_error(self) -> None:
        dead = [r for r in self.replicas if not r.alive]
        what = "; ".join(f"replica {r.index}: {r.failure}" for r in dead)
        serving = self.size - len(dead)
        self.error = EngineDeadError(
            f"{len(dead)} of {self.size} data-parallel replicas failed ({what}); "
            f"{serving} still serve"
        )

    # --- requests (on the event loop) -------------------------------------------------------------
    def _serving(self) -> list[Replica]:
        if self._stopping:
            raise EngineDeadError("the engine is shutting down")
        if self._model_info is None:
            raise EngineDeadError("the engine is not started")
        alive = [r for r in self.replicas if r.alive]
        if not alive:
            raise EngineDeadError(f"no data-parallel replica is left: {self.error}")
        return alive

    def _capacity(self, replica: Replica) -> int | None:
        """The replica's requests in flight, or None when it cannot take another."""
        if not replica.alive:
            return None
        info = replica.info
        if (
            self.max_waiting is not None
            and info is not None
            and replica.in_flight >= info.max_num_seqs + self.max_waiting
        ):
            return None
        return replica.in_flight

    async def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        stream_interval: float = 0.0,
        images: tuple[ImageInput, ...] = (),
    ) -> RequestStream:
        """Route and queue a request; raises its LocalchatError here, before any output.
        `stream_interval` has no effect here: each delta reaches the event loop as its replica
        sends it. Images go along to the replica, whose engine encodes them."""
        self._serving()
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise InvalidParameterError(
                f"request id {request_id!r} is already in use", param="request_id"
            )
        loop = asyncio.get_running_loop()
        stream = StreamState(loop)
        accepted: asyncio.Future = loop.create_future()
        tracked = _Tracked(
            stream, self.replicas[0], list(tokens), accepted, params or SamplingParams(), images
        )
        if not self._send(request_id, tracked):
            raise QueueFullError(
                f"too many requests are waiting (more than {self.max_waiting} beyond the "
                "running batch on every replica); retry later"
            )
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        except BaseException:
            self._forget(request_id)
            raise
        return RequestStream(self, request_id, stream, tokens)

    def _send(self, request_id: str, tracked: _Tracked) -> bool:
        """Route a request not yet accepted and send it to its replica; False when every replica
        is full (or gone)."""
        loads = [self._capacity(r) for r in self.replicas]
        if all(load is None for load in loads):
            return False
        hashes = self.router.block_hashes(tracked.tokens)
        index, by_prefix = self.router.choose(hashes, loads)
        replica = tracked.replica = self.replicas[index]
        replica.routed["prefix" if by_prefix else "load"] += 1
        self.router.record(hashes, index)
        self._requests[request_id] = tracked
        replica.in_flight += 1
        replica.send(AddRequest(request_id, list(tracked.tokens), tracked.params, tracked.images))
        return True

    def _resend(self, request_id: str, tracked: _Tracked) -> bool:
        """Its replica failed before accepting the request (it never ran there): send it to
        another live replica, unless it was resent once already."""
        if tracked.accepted is None or tracked.resent or tracked.aborted:
            return False
        failed = tracked.replica.index
        if not self._send(request_id, tracked):
            return False
        tracked.resent = True
        logger.warning(
            "request %s: data-parallel replica %d failed before accepting it; retried on %d",
            request_id,
            failed,
            tracked.replica.index,
        )
        return True

    def set_speculative(self, config: dict | str | None) -> None:
        """As AsyncEngine.set_speculative, on every replica (a replica whose model refuses it, as
        length-dependent rope scaling does, logs why and keeps its own)."""
        checked = SpeculativeConfig.parse(config)
        value = None if checked is None else checked.to_dict()
        self.config = dataclasses.replace(self.config, speculative_config=value)
        for replica in self.replicas:
            replica.send(SetSpeculative(value))

    def abort(self, request_id: str) -> None:
        tracked = self._requests.get(request_id)
        if tracked is not None:
            tracked.aborted = True
            tracked.replica.send(AbortRequest(request_id))

    async def embed(self, prompts: list[list[int]], pooling: str) -> np.ndarray:
        """As AsyncEngine.embed, on the least loaded replica with room for its prompts (each takes
        a place of the replica's max_waiting bound, as a request does)."""
        replica = self._embedding_replica(len(prompts))
        embed_id = next(self._embed_ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._embeds[embed_id] = (future, replica)
        replica.in_flight += len(prompts)
        replica.send(EmbedPrompts(embed_id, prompts, pooling))
        try:
            return await future
        except asyncio.CancelledError:  # the client left: its prompts go from the replica's engine
            for request_id in embed_request_ids(embed_id, len(prompts)):
                replica.send(AbortRequest(request_id))
            raise
        finally:
            self._embeds.pop(embed_id, None)
            replica.in_flight -= len(prompts)

    def _embedding_replica(self, count: int) -> Replica:
        """The least loaded live replica with room for `count` more sequences; a 400 naming
        `input` if none ever could have, a QueueFullError if none has now."""
        alive = self._serving()
        if self.max_waiting is None:
            return min(alive, key=lambda r: (r.in_flight, r.index))
        bounds = {r.index: (r.info.max_num_seqs if r.info else 0) + self.max_waiting for r in alive}
        if count > max(bounds.values()):
            raise InvalidParameterError(
                f"input's {count} entries are more sequences than a replica runs and queues at "
                f"once ({max(bounds.values())})",
                param="input",
            )
        roomy = [r for r in alive if r.in_flight + count <= bounds[r.index]]
        if not roomy:
            raise QueueFullError(
                f"too many requests are waiting (more than {self.max_waiting} beyond the "
                "running batch on every replica); retry later"
            )
        return min(roomy, key=lambda r: (r.in_flight, r.index))

    # --- figures ----------------------------------------------------------------------------------
    def replica_stats(self) -> list[EngineStats | None]:
        """Each replica's last stats; a dead one keeps its totals, with nothing running."""
        result: list[EngineStats | None] = []
        for replica in self.replicas:
            stats = replica.stats
            if stats is not None and not replica.alive:
                stats = dataclasses.replace(stats, num_running=0, num_waiting=0, kv_cache_usage=0.0)
            result.append(stats)
        return result

    def stats(self) -> EngineStats | None:
        """The replicas' stats summed (KV usage: blocks in use over all blocks)."""
        known = [s for s in self.replica_stats() if s is not None]
        if not known:
            return None
        blocks = sum(s.num_blocks for s in known)
        used = sum(s.kv_cache_usage * s.num_blocks for s in known)
        summed = {
            f.name: sum(getattr(s, f.name) for s in known)
            for f in dataclasses.fields(EngineStats)
            if f.name != "kv_cache_usage"
        }
        return EngineStats(kv_cache_usage=used / blocks if blocks else 0.0, **summed)

    def replica_metrics(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The `localchat_replica_*` families of /metrics, one sample per replica."""
        return replica_metrics(self.replicas, self.router, self.replica_stats())
