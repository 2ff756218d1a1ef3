"""`localchat serve --data-parallel-size N`: N engine replicas, each in a spawned process of its
own (replica_process.py), behind the one HTTP front end.

DataParallelEngine is an EngineClient (engine_client.py), as the server's AsyncEngine is: the event
loop tokenizes and renders chats with replica 0's tokenizer, routes each request with a
PrefixRouter (replica_router.py), and follows its deltas from the replica's pipe (the commands
and events of engine_messages.py, as an EngineCore speaks them). Per replica, a sender thread
writes commands (so a full pipe never blocks the event loop) and a reader thread
hands each message to the event loop.

Failure: a replica that exits (its pipe closes) or sends nothing for LOCALCHAT_DP_TIMEOUT seconds
(it sends a message at least every second, idle or busy) is declared dead and killed. Its requests
that have sent the client nothing yet (not accepted, or waiting for a first token) are routed
again to a live replica, where they start over from their prompts; those that have streamed output
end with an EngineDeadError naming it. /health answers 503, and the remaining replicas go on serving
new requests. Every wait on a replica ends when the replica answers, dies, or times out. The
replicas report the prefix blocks their engines evicted, which the router drops.

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
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from localchat import envs
from localchat.config import EngineConfig
from localchat.engine.distributed.replica_process import ReplicaArgs, run_replica
from localchat.engine.distributed.replica_router import PrefixRouter
from localchat.engine.distributed.supervised import ProcessLost, SupervisedProcess
from localchat.engine.engine_client import TextFront
from localchat.engine.engine_messages import (
    AbortRequest,
    Accepted,
    AddRequest,
    CoreFailed,
    CoreReady,
    Embedded,
    EmbedPrompts,
    EngineCommand,
    EngineEvent,
    LoadFailed,
    Shutdown,
    Started,
    StepDone,
)
from localchat.engine.llm_engine import EngineStats
from localchat.engine.model_info import ModelInfo
from localchat.engine.outputs import RequestOutput
from localchat.engine.request_stream import RequestStream, StreamState, settle
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import EngineDeadError, InvalidParameterError, QueueFullError

logger = logging.getLogger("localchat.server")
STOP_TIMEOUT = 10.0
WATCH_INTERVAL = 0.5


def replica_threads(config: EngineConfig, size: int) -> int | None:
    """`--threads` is per replica; without it, on the CPU, the replicas (and their tensor-parallel
    ranks) share the cores."""
    if config.num_threads is not None or config.device == "cuda":
        return config.num_threads
    import torch

    cores = min(os.cpu_count() or 1, torch.get_num_threads())
    return max(cores // (size * config.tensor_parallel_size), 1)


def replica_devices(config: EngineConfig, size: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES per replica: its own `tensor_parallel_size` GPUs when there are enough,
    else None (every replica sees every GPU, so split the memory with --gpu-memory-utilization)."""
    if config.device == "cpu":
        return [None] * size
    import torch

    if not torch.cuda.is_available():
        return [None] * size
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = (
        [d.strip() for d in visible.split(",") if d.strip()]
        if visible
        else [str(i) for i in range(torch.cuda.device_count())]
    )
    tp = config.tensor_parallel_size
    if len(devices) < size * tp:
        logger.warning(
            "%d replicas of %d GPU(s) each need %d GPUs, %d visible: the replicas share them",
            size,
            tp,
            size * tp,
            len(devices),
        )
        return [None] * size
    return [",".join(devices[i * tp : (i + 1) * tp]) for i in range(size)]


class Replica:
    """One replica process, its pipes and threads, and what the front end knows of it."""

    def __init__(
        self,
        index: int,
        args: ReplicaArgs,
        loop: asyncio.AbstractEventLoop,
        owner: DataParallelEngine,
    ):
        self.index = index
        self.loop = loop
        self.owner = owner
        # a replica with tensor-parallel ranks must start processes, which a daemon may not
        self.process = SupervisedProcess(
            run_replica,
            (args,),
            name=f"localchat-dp-replica{index}",
            daemon=args.config.tensor_parallel_size == 1,
        )
        self.ready: asyncio.Future[CoreReady] = loop.create_future()
        self.info: CoreReady | None = None
        self.stats: EngineStats | None = None
        self.alive = True
        self.failure: str | None = None
        self.last_seen = time.monotonic()
        self.in_flight = 0
        self.routed = {"prefix": 0, "load": 0}
        self._outbox: queue.SimpleQueue[EngineCommand | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._send_loop, name=f"{self.process.name}-send", daemon=True),
            threading.Thread(target=self._read_loop, name=f"{self.process.name}-read", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def send(self, command: EngineCommand) -> None:
        if self.alive:
            self._outbox.put(command)

    def _send_loop(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self.process.send(message)
            except OSError:  # the replica is gone; the reader reports it
                return

    def _read_loop(self) -> None:
        """Hand each list of events to the event loop; until the replica has loaded, watch that
        it lives and loads within LOCALCHAT_DP_LOAD_TIMEOUT."""
        deadline = time.monotonic() + envs.DP_LOAD_TIMEOUT.get()
        loading = True
        while True:
            events: list[EngineEvent] | None
            try:
                events = self.process.wait_for(deadline) if loading else self.process.recv()
            except ProcessLost as lost:
                events = None  # it exited: as a closed pipe
                if not lost.exited:  # it is still loading: start() gives up on it
                    loading = False
                    self._call(self.owner._on_load_timeout, self)
                    continue
            except (EOFError, OSError):
                events = None  # the pipe closed: the replica is gone
            if events and any(isinstance(e, CoreReady | LoadFailed) for e in events):
                loading = False
            if not self._call(self.owner._on_events, self, events) or events is None:
                return

    def _call(self, callback: Callable[..., None], *args: object) -> bool:
        """Run `callback(*args)` on the event loop; False once that loop is closed."""
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            return False
        return True

    def close_pipes(self) -> None:
        self._outbox.put(None)
        self.process.close_pipes()


@dataclasses.dataclass
class _Tracked:
    """A request in flight on a replica: its stream, and its tokens so far (for the router);
    `streamed` once an output went to the client, `aborted` once the client gave it up."""

    stream: StreamState
    replica: Replica
    tokens: list[int]
    accepted: asyncio.Future | None
    params: SamplingParams
    streamed: bool = False
    aborted: bool = False


class DataParallelEngine(TextFront):
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
        self._embeds: dict[int, tuple[asyncio.Future, Replica]] = {}
        self._embed_ids = itertools.count()
        self._model_info: ModelInfo | None = None
        self._watchdog: asyncio.Task | None = None
        self._reaping: set[asyncio.Future] = set()
        self._ids = itertools.count()
        self._stopping = False

    # --- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> DataParallelEngine:
        """Spawn the replicas and wait until every one has loaded (raises the first load error)."""
        if self.replicas:
            return self
        loop = asyncio.get_running_loop()
        threads = replica_threads(self.config, self.size)
        config = dataclasses.replace(self.config, num_threads=threads)
        devices = replica_devices(self.config, self.size)
        for index in range(self.size):
            args = ReplicaArgs(index, config, devices[index], self.log_level, index == 0)
            self.replicas.append(Replica(index, args, loop, self))
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
        for replica in self.replicas:
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
                    if tracked.accepted is None:  # an accepted request's retry: the stream ends
                        tracked.stream.queue.put_nowait(error)
                if tracked.accepted is not None:
                    settle(tracked.accepted, error)
                    tracked.accepted = None
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
        for _ in range(40):
            if replica.process.exitcode is not None:
                break
            await asyncio.sleep(0.05)
        code = replica.process.exitcode
        self._fail(replica, "it exited" + (f" with code {code}" if code is not None else ""))

    def _deliver_from(self, replica: Replica, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            tracked = self._requests.get(output.request_id)
            if tracked is None or tracked.replica is not replica:  # retried elsewhere
                continue
            for out in output.outputs:
                if out.index == 0:
                    tracked.tokens.extend(out.token_ids)
            tracked.streamed = True
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
        text = why if not report else f"data-parallel replica {replica.index} failed: {why}"
        error = EngineDeadError(text)
        if not replica.ready.done():
            replica.ready.set_exception(error)
        for request_id in [r for r, t in self._requests.items() if t.replica is replica]:
            tracked = self._forget(request_id)
            assert tracked is not None
            if report and not self._stopping and self._resend(request_id, tracked):
                continue  # the client has seen nothing of it: another replica runs it
            if tracked.accepted is not None:
                settle(tracked.accepted, error)
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
    ) -> RequestStream:
        """Route and queue a request; raises its LocalchatError here, before any output.
        `stream_interval` has no effect here: each delta reaches the event loop as its replica
        sends it."""
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
            stream, self.replicas[0], list(tokens), accepted, params or SamplingParams()
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
        replica.send(AddRequest(request_id, list(tracked.tokens), tracked.params))
        return True

    def _resend(self, request_id: str, tracked: _Tracked) -> bool:
        """Its replica failed before the request sent the client anything: send it, from its
        prompt (`tokens` has grown only with streamed output), to another live replica."""
        if tracked.streamed or tracked.aborted:
            return False
        failed = tracked.replica.index
        before = "accepting it" if tracked.accepted is not None else "its first token"
        if not self._send(request_id, tracked):
            return False
        logger.warning(
            "request %s: data-parallel replica %d failed before %s; retried on %d",
            request_id,
            failed,
            before,
            tracked.replica.index,
        )
        return True

    def abort(self, request_id: str) -> None:
        tracked = self._requests.get(request_id)
        if tracked is not None:
            tracked.aborted = True
            tracked.replica.send(AbortRequest(request_id))

    async def embed(self, prompts: list[list[int]], pooling: str) -> list[list[float]]:
        """As AsyncEngine.embed, on the least loaded replica."""
        alive = self._serving()
        replica = min(alive, key=lambda r: (r.in_flight, r.index))
        embed_id = next(self._embed_ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._embeds[embed_id] = (future, replica)
        replica.send(EmbedPrompts(embed_id, prompts, pooling))
        try:
            return await future
        finally:
            self._embeds.pop(embed_id, None)

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
        stats = self.replica_stats()
        up = GaugeMetricFamily(
            "localchat_replica_up",
            "1 while the replica serves, 0 once it failed.",
            labels=["replica"],
        )
        in_flight = GaugeMetricFamily(
            "localchat_replica_requests_in_flight",
            "Requests the server has routed to the replica and not seen finish.",
            labels=["replica"],
        )
        routed = CounterMetricFamily(
            "localchat_replica_routed_requests",
            "Requests routed to the replica, by why: a cached prefix, or the lightest load.",
            labels=["replica", "route"],
        )
        held = GaugeMetricFamily(
            "localchat_replica_prefix_blocks",
            "Prompt blocks the router counts the replica as holding (less those it reported "
            "evicted).",
            labels=["replica"],
        )
        for replica in self.replicas:
            label = str(replica.index)
            up.add_metric([label], 1 if replica.alive else 0)
            in_flight.add_metric([label], replica.in_flight)
            for route, count in replica.routed.items():
                routed.add_metric([label, route], count)
            held.add_metric([label], self.router.blocks_held(replica.index))
        yield from (up, in_flight, routed, held)
        for name, documentation, kind, read in _REPLICA_SERIES:
            family = kind(name, documentation, labels=["replica"])
            for replica, replica_stat in zip(self.replicas, stats, strict=True):
                if replica_stat is not None:
                    family.add_metric([str(replica.index)], read(replica_stat))
            yield family


_REPLICA_SERIES = [
    (
        "localchat_replica_num_requests_running",
        "Requests in the replica's running batch.",
        GaugeMetricFamily,
        lambda s: s.num_running,
    ),
    (
        "localchat_replica_num_requests_waiting",
        "Requests waiting in the replica.",
        GaugeMetricFamily,
        lambda s: s.num_waiting,
    ),
    (
        "localchat_replica_kv_cache_usage_perc",
        "Fraction of the replica's KV cache blocks in use (0 to 1).",
        GaugeMetricFamily,
        lambda s: s.kv_cache_usage,
    ),
    (
        "localchat_replica_prefix_cache_queries",
        "Prompt tokens the replica looked up in its prefix cache.",
        CounterMetricFamily,
        lambda s: s.prefix_cache_queries,
    ),
    (
        "localchat_replica_prefix_cache_hits",
        "Prompt tokens the replica found in its prefix cache.",
        CounterMetricFamily,
        lambda s: s.prefix_cache_hits,
    ),
    (
        "localchat_replica_prompt_tokens",
        "Prompt tokens of requests the replica accepted.",
        CounterMetricFamily,
        lambda s: s.prompt_tokens_total,
    ),
    (
        "localchat_replica_generation_tokens",
        "Tokens the replica generated.",
        CounterMetricFamily,
        lambda s: s.generation_tokens_total,
    ),
    (
        "localchat_replica_num_preemptions",
        "Sequences the replica preempted for lack of KV blocks.",
        CounterMetricFamily,
        lambda s: s.num_preemptions,
    ),
]
