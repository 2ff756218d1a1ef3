"""Tensor parallelism over processes torchrun started (multi-node): every process runs the same
`localchat serve|generate -tp N` command line; rank 0 goes on to run the engine (and the server),
the others join as workers and exit when rank 0 is done.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the
group is joined from them (`env://`). WORLD_SIZE must equal `-tp`. With no pipes between nodes,
rank 0's commands go by broadcast over the gloo control group (parallel_state.send_command); once
at the start, rank 0 broadcasts what it decided (dtype, context length, the engine config) and
gathers each rank's load result, both as JSON (rank_json.py): nothing read from the network is
unpickled.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import sys
import traceback
from typing import TYPE_CHECKING

from localchat.config import EngineConfig
from localchat.errors import EngineDeadError, InvalidParameterError

if TYPE_CHECKING:
    from localchat.engine.distributed.rank_messages import RankCommand

logger = logging.getLogger("localchat.engine")
ENVIRONMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
STATUS_CHARS = 64 << 10  # the end of a rank's load traceback that it reports to rank 0


def torchrun_rank() -> int | None:
    """This process's rank when torchrun started it, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    missing = [name for name in ENVIRONMENT if name not in os.environ]
    if missing:
        raise InvalidParameterError(
            f"RANK and WORLD_SIZE are set but not {', '.join(missing)}: start the ranks with "
            "torchrun, or unset RANK and WORLD_SIZE",
            param="tensor_parallel_size",
        )
    return int(os.environ["RANK"])


def join_torchrun(config: EngineConfig, *, alone: str | None = None) -> EngineConfig:
    """Under torchrun: check WORLD_SIZE against `-tp`, join the group, and on ranks other than 0
    serve as a worker, then exit (SystemExit). Returns the config rank 0 runs with (its threads
    set when `--threads` did not say). Outside torchrun, returns `config` unchanged. `alone`, when
    given, names options that do not go with torchrun (refused)."""
    rank = torchrun_rank()
    if rank is None:
        return config
    world = int(os.environ["WORLD_SIZE"])
    tp = config.tensor_parallel_size
    if world == 1 and tp == 1:
        return config
    if world != tp:
        raise InvalidParameterError(
            f"torchrun started {world} processes (WORLD_SIZE={world}) but "
            f"--tensor-parallel-size is {tp}: they must be equal (give -tp {world}, or start "
            f"{tp} processes in all: --nnodes x --nproc-per-node = {tp})",
            param="tensor_parallel_size",
        )
    if alone is not None:
        raise InvalidParameterError(
            f"under torchrun every process is one rank of one tensor-parallel group: {alone} "
            "does not go with it",
        )
    import torch

    from localchat.engine.core.runtime import _pick_device
    from localchat.engine.distributed import parallel_state

    device = _pick_device(config.device)
    local_rank = int(os.environ["LOCAL_RANK"])
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
    elif config.num_threads is None:  # the ranks of one node share its cores
        cores = min(os.cpu_count() or 1, torch.get_num_threads())
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        config = dataclasses.replace(config, num_threads=max(cores // local, 1))
    parallel_state.init_from_env(device)
    if rank == 0:
        return config
    sys.exit(run_worker(config, rank, world, device))


def run_worker(config: EngineConfig, rank: int, world: int, device) -> int:
    """Rank `rank`: take rank 0's settings, load this rank's shard from this node's copy of the
    model, report, then run rank 0's commands. Returns the exit status."""
    from localchat.engine.distributed import parallel_state
    from localchat.engine.distributed.rank_json import all_gather_json, broadcast_json
    from localchat.engine.distributed.worker import WorkerArgs, build_shard, serve_commands
    from localchat.engine.loading.loader import model_files
    from localchat.models.source import resolve_model

    where = f"localchat tensor-parallel rank {rank} of {world}"
    print(f"{where}: joined; waiting for rank 0 to load", file=sys.stderr, flush=True)
    files = model_files(resolve_model(config.model))  # this node's copy
    control = parallel_state.control_group()
    try:
        ours = WorkerArgs.from_json(broadcast_json(None, control), rank=rank, files=files)
    except RuntimeError as exc:
        print(f"{where}: rank 0 stopped before it sent its settings ({exc})", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{where}: refused rank 0's settings: {exc}", file=sys.stderr)
        return 1
    args = dataclasses.replace(ours, num_threads=config.num_threads or ours.num_threads)
    status: str | None = None
    runner = None
    try:
        runner = build_shard(args, device)
    except BaseException:
        status = traceback.format_exc()[-STATUS_CHARS:]
    try:
        all_gather_json(status, control)
        if runner is None:
            print(f"{where}: loading failed:\n{status}", file=sys.stderr)
            return 1
        print(f"{where}: ready", file=sys.stderr, flush=True)
        serve_commands(runner, _receive)
    except RuntimeError as exc:  # a collective failed: rank 0 is gone or reports it
        print(f"{where}: {exc}", file=sys.stderr)
        return 1
    parallel_state.destroy_group()
    print(f"{where}: rank 0 is done; exiting", file=sys.stderr, flush=True)
    return 0


def _receive() -> RankCommand:
    from localchat.engine.distributed import parallel_state
    from localchat.engine.distributed.rank_messages import from_ints

    return from_ints(*parallel_state.receive_command())


class TorchrunGroup:
    """Rank 0's side under torchrun, in place of a WorkerPool: the ranks are not its children, so
    it sends commands by broadcast and finds a dead or hung rank by its pings and collectives."""

    def __init__(self, settings) -> None:
        """`settings`: the WorkerArgs every rank builds its shard from (rank and files its own)."""
        from localchat.engine.distributed import parallel_state
        from localchat.engine.distributed.rank_json import all_gather_json, broadcast_json

        self.closed = False
        self.failed = False
        group = parallel_state.control_group()
        atexit.register(self.close)
        try:
            broadcast_json(settings.to_json(), group)
            statuses = all_gather_json(None, group)
        except (RuntimeError, ValueError) as exc:
            raise self.failure(exc) from exc
        for rank, status in enumerate(statuses):
            if status is not None:
                self.close()
                detail = status if isinstance(status, str) else f"(not a report: {status!r:.200})"
                raise EngineDeadError(f"tensor-parallel rank {rank} failed to load:\n{detail}")

    def send(self, command: RankCommand) -> None:
        from localchat.engine.distributed import parallel_state
        from localchat.engine.distributed.rank_messages import to_ints

        parallel_state.send_command(*to_ints(command))

    def ping(self) -> None:
        from localchat.engine.distributed import parallel_state
        from localchat.engine.distributed.rank_messages import Ping

        self.send(Ping())
        parallel_state.ping()

    def exited(self) -> str:
        return ""  # not our children: a dead rank shows in the next ping

    def failure(self, exc: BaseException) -> EngineDeadError:
        logger.error("tensor parallelism (torchrun): %s", exc)
        self.failed = True
        self.close()
        return EngineDeadError(f"tensor-parallel group failed: {exc}")

    def close(self) -> None:
        """Tell the ranks to exit (unless the group failed), then leave the group: a rank still
        waiting sees the connection close and exits too."""
        from localchat.engine.distributed import parallel_state

        if self.closed:
            return
        self.closed = True
        if not self.failed:
            from localchat.engine.distributed.rank_messages import Exit

            with contextlib.suppress(RuntimeError):
                self.send(Exit())
        parallel_state.destroy_group()
