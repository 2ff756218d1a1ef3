"""One data-parallel replica as the front end (data_parallel.py) holds it: its process (a
SupervisedProcess running replica_process.run_replica), a sender thread that writes its commands
(so a full pipe never blocks the event loop), a reader thread that hands its events to the event
loop, and what the front end knows of it. Also how the replicas split the threads and GPUs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from localchat import envs
from localchat.config import EngineConfig
from localchat.engine.core.engine_messages import CoreReady, EngineCommand, EngineEvent, LoadFailed
from localchat.engine.core.llm_engine import EngineStats
from localchat.engine.distributed.replica_process import ReplicaArgs, run_replica
from localchat.engine.distributed.supervised import ProcessLost, SupervisedProcess

logger = logging.getLogger("localchat.server")


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
        on_events: Callable[[Replica, list[EngineEvent] | None], None],
        on_load_timeout: Callable[[Replica], None],
    ):
        """`on_events` and `on_load_timeout` are called on `loop`: with each list of the
        replica's events (None once its pipe closed), and if it does not load in time."""
        self.index = index
        self.loop = loop
        self._on_events, self._on_load_timeout = on_events, on_load_timeout
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
                    self._call(self._on_load_timeout, self)
                    continue
            except (EOFError, OSError):
                events = None  # the pipe closed: the replica is gone
            if events and any(isinstance(e, CoreReady | LoadFailed) for e in events):
                loading = False
            if not self._call(self._on_events, self, events) or events is None:
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
