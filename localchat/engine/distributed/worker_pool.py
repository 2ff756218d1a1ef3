"""Rank 0's side of the group: spawn one process per other rank, join the process group, wait for
their shards to load, send them commands, and turn a dead or failing rank into an error.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import torch.multiprocessing as mp

from localchat.engine.distributed import parallel_state
from localchat.engine.distributed.worker import WorkerArgs, run_worker
from localchat.errors import EngineDeadError

logger = logging.getLogger("localchat.engine")
LOAD_TIMEOUT = parallel_state.LOAD_TIMEOUT
STARTED_HINT = (
    "it exited before starting; a script that uses tensor parallelism needs an "
    "`if __name__ == '__main__':` guard, since each rank is spawned and imports the main module"
)


class WorkerPool:
    """Ranks 1..N-1 as spawned processes, each with a command pipe from rank 0."""

    def __init__(self, args: list[WorkerArgs], device) -> None:
        context = mp.get_context("spawn")
        self.processes: list[BaseProcess] = []
        self.pipes: list[Connection] = []
        for worker in args:
            ours, theirs = context.Pipe()
            process = context.Process(
                target=run_worker,
                args=(worker, theirs),
                name=f"localchat-tp-rank{worker.rank}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self.processes.append(process)
            self.pipes.append(ours)
        self.closed = False
        atexit.register(self.close)
        try:
            self._wait_for("started", STARTED_HINT)
            parallel_state.init_group(0, len(args) + 1, args[0].address, device)
            self._wait_for("ready", "did not finish loading its shard")
        except BaseException:
            self.close()
            raise

    def _wait_for(self, expected: str, what_failed: str) -> None:
        """Each worker's next message, watching that it is alive meanwhile."""
        deadline = time.monotonic() + LOAD_TIMEOUT
        for rank, (process, pipe) in enumerate(zip(self.processes, self.pipes, strict=True), 1):
            while not pipe.poll(0.1):
                if not process.is_alive() or time.monotonic() > deadline:
                    raise self.failure(RuntimeError(what_failed))
            status, detail = pipe.recv()
            if status != expected:
                raise EngineDeadError(f"tensor-parallel rank {rank} failed to load:\n{detail}")

    def send(self, command: str, value: object = None) -> None:
        for pipe in self.pipes:
            pipe.send((command, value))

    def ping(self) -> None:
        """Raise RuntimeError naming a rank that does not answer within the ping timeout."""
        self.send("ping")
        parallel_state.ping()

    def exited(self) -> str:
        """Which ranks have exited ('' when all run); a cheap check (waitpid, no blocking)."""
        return ", ".join(
            f"rank {rank} exited"
            for rank, process in enumerate(self.processes, 1)
            if process.exitcode is not None
        )

    def failure(self, exc: BaseException) -> EngineDeadError:
        """The error to raise after a collective or a pipe failed: which ranks died, and why."""
        for process in self.processes:
            process.join(timeout=1.0)  # a killed rank is reaped within moments
        dead = [
            f"rank {rank} exited with code {process.exitcode}"
            for rank, process in enumerate(self.processes, 1)
            if not process.is_alive()
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
        for pipe in self.pipes:
            with contextlib.suppress(OSError):  # a dead rank's pipe is closed
                pipe.send(("exit", None))
        for process in self.processes:
            process.join(timeout=5.0)
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)
        parallel_state.destroy_group()
