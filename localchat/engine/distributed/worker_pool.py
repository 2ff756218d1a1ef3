"""Rank 0's side of the group: spawn one process per other rank (each a SupervisedProcess), join
the process group, wait for their shards to load, send them commands, and turn a dead or failing
rank into an error.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import time

import torch
import torch.multiprocessing as mp

from localchat import envs
from localchat.engine.distributed import parallel_state
from localchat.engine.distributed.rank_messages import (
    Exit,
    Ping,
    RankCommand,
    RankLoadFailed,
    RankReady,
    RankStarted,
)
from localchat.engine.distributed.supervised import ProcessLost, SupervisedProcess
from localchat.engine.distributed.worker import WorkerArgs, run_worker
from localchat.errors import EngineDeadError

logger = logging.getLogger("localchat.engine")
STARTED_HINT = (
    "it exited before starting; a script that uses tensor parallelism needs an "
    "`if __name__ == '__main__':` guard, since each rank is spawned and imports the main module"
)


class WorkerPool:
    """Ranks 1..N-1 as spawned processes, each with a command pipe from rank 0."""

    def __init__(self, args: list[WorkerArgs], device: torch.device) -> None:
        context = mp.get_context("spawn")
        self.workers = [
            SupervisedProcess(
                run_worker, (worker,), name=f"localchat-tp-rank{worker.rank}", context=context
            )
            for worker in args
        ]
        self.closed = False
        atexit.register(self.close)
        try:
            self._wait_for(RankStarted, STARTED_HINT)
            parallel_state.init_group(0, len(args) + 1, args[0].address, device)
            self._wait_for(RankReady, "did not finish loading its shard")
        except BaseException:
            self.close()
            raise

    def _wait_for(self, expected: type[RankStarted | RankReady], what_failed: str) -> None:
        """Each worker's next report, watching that it is alive meanwhile."""
        deadline = time.monotonic() + envs.TP_LOAD_TIMEOUT.get()
        for rank, worker in enumerate(self.workers, 1):
            try:
                report = worker.wait_for(deadline)
            except ProcessLost:
                raise self.failure(RuntimeError(what_failed)) from None
            if not isinstance(report, expected):
                detail = report.traceback if isinstance(report, RankLoadFailed) else report
                raise EngineDeadError(f"tensor-parallel rank {rank} failed to load:\n{detail}")

    def send(self, command: RankCommand) -> None:
        for worker in self.workers:
            worker.send(command)

    def ping(self) -> None:
        """Raise RuntimeError naming a rank that does not answer within the ping timeout."""
        self.send(Ping())
        parallel_state.ping()

    def exited(self) -> str:
        """Which ranks have exited ('' when all run); a cheap check (waitpid, no blocking)."""
        return ", ".join(
            f"rank {rank} exited"
            for rank, worker in enumerate(self.workers, 1)
            if worker.exitcode is not None
        )

    def failure(self, exc: BaseException) -> EngineDeadError:
        """The error to raise after a collective or a pipe failed: which ranks died, and why."""
        for worker in self.workers:
            worker.join(timeout=1.0)  # a killed rank is reaped within moments
        dead = [
            f"rank {rank} exited with code {worker.exitcode}"
            for rank, worker in enumerate(self.workers, 1)
            if worker.exitcode is not None
        ]
        what = "; ".join(dead) or "a collective failed"
        logger.error("tensor parallelism: %s (%s)", what, exc)
        self.close()
        return EngineDeadError(f"tensor-parallel group failed: {what} ({exc})")

    def close(self) -> None:
        """Stop the workers (politely, then by force) and leave the group."""
        if self.closed:
            return
        self.closed = True
        for worker in self.workers:
            with contextlib.suppress(OSError):  # a dead rank's pipe is closed
                worker.send(Exit())
        for worker in self.workers:
            worker.stop(timeout=5.0)
        parallel_state.destroy_group()
