"""Ranks 1..N-1: load this rank's shard, then run each forward pass and logits projection rank 0
announces. A worker never sees a tokenizer, a scheduler or a sampler.

Spawned ranks get their commands (rank_messages.py) over a pipe from rank 0 (so an idle worker
waits without a collective that could time out, and rank 0's exit closes the pipe, which ends the
worker); ranks torchrun started get them by broadcast over the control group (torchrun.py). The
tensors they need arrive by broadcast either way.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from localchat.config import EngineConfig
from localchat.engine.distributed import parallel_state
from localchat.engine.distributed.parallel_layers import shard_model
from localchat.engine.distributed.rank_messages import (
    AllocateKV,
    ComputeLogits,
    Exit,
    Forward,
    Ping,
    RankCommand,
    RankLoadFailed,
    RankReady,
    RankStarted,
)
from localchat.engine.distributed.step_transfer import receive_batch
from localchat.engine.loading.loader import ModelFiles, load_hf_config, load_model
from localchat.engine.modeling.model_runner import ModelRunner


@dataclass(frozen=True)
class WorkerArgs:
    """What rank 0 decided and a worker needs to build its shard."""

    rank: int
    world_size: int
    address: str  # host:port of the rendezvous
    config: EngineConfig
    files: ModelFiles
    device_type: str
    dtype: torch.dtype
    kv_cache_dtype: torch.dtype
    max_model_len: int
    num_threads: int


def build_shard(args: WorkerArgs, device: torch.device | None = None) -> ModelRunner:
    """Load this rank's shard; a spawned rank (no `device` given) joins the group first."""
    config = args.config
    if device is None:
        device = (
            torch.device("cuda", args.rank) if args.device_type == "cuda" else torch.device("cpu")
        )
        parallel_state.init_group(args.rank, args.world_size, args.address, device)
    if device.type == "cpu":
        torch.set_num_threads(args.num_threads)
    hf_config = load_hf_config(args.files)
    model = load_model(
        args.files,
        hf_config,
        dtype=args.dtype,
        device=device,
        load_format=config.load_format,
        quantization=config.quantization,
        seed=config.seed,
        shard=functools.partial(shard_model, rank=args.rank, world_size=args.world_size),
    )
    return ModelRunner(
        model,
        hf_config,
        device=device,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        block_size=config.block_size,
        max_model_len=args.max_model_len,
        eos_token_ids=set(),
    )


def _from_pipe(conn: Connection) -> Callable[[], RankCommand]:
    def receive() -> RankCommand:
        try:
            command: RankCommand = conn.recv()
        except EOFError:  # rank 0 is gone
            return Exit()
        return command

    return receive


@torch.inference_mode()
def serve_commands(runner: ModelRunner, receive: Callable[[], RankCommand]) -> None:
    """Run rank 0's commands until it says exit."""
    while True:
        match receive():
            case Forward(header):
                input_ids, positions, md = receive_batch(header, runner.device)
                runner._forward(input_ids, positions, md)
            case ComputeLogits(shape):
                hidden = torch.empty(shape, dtype=runner.dtype, device=runner.device)
                runner.model.compute_logits(parallel_state.broadcast(hidden))
            case AllocateKV(num_blocks):
                runner.allocate_kv_cache(num_blocks)
            case Ping():
                parallel_state.answer_ping()
            case Exit():
                return


def run_worker(args: WorkerArgs, commands: Connection, events: Connection) -> None:
    """The entry point of a spawned rank (a SupervisedProcess): report that it started, then that
    it is ready (or the load's error), then serve."""
    events.send(RankStarted())
    try:
        runner = build_shard(args)
    except BaseException:
        events.send(RankLoadFailed(traceback.format_exc()))
        sys.exit(1)
    events.send(RankReady())
    try:
        serve_commands(runner, _from_pipe(commands))
    except Exception as exc:  # a collective failed: rank 0 reports it; exit non-zero
        print(f"localchat tensor-parallel rank {args.rank}: {exc}", file=sys.stderr)
        sys.exit(1)
    parallel_state.destroy_group()
