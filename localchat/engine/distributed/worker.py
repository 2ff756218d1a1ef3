"""Ranks 1..N-1: load this rank's shard, then run each forward pass and logits projection rank 0
announces. A worker never sees a tokenizer, a scheduler or a sampler.

Spawned ranks get their commands (rank_messages.py) over a pipe from rank 0 (so an idle worker
waits without a collective that could time out, and rank 0's exit closes the pipe, which ends the
worker); ranks torchrun started get them by broadcast over the control group (torchrun.py). The
tensors they need arrive by broadcast either way, a step's image embeddings too (rank 0 alone
runs the image encoder).
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection
from typing import Any

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
from localchat.engine.distributed.step_transfer import receive_batch, receive_images
from localchat.engine.loading.loader import ModelFiles, load_hf_config, load_model
from localchat.engine.modeling.model_runner import ModelRunner
from localchat.errors import InvalidParameterError


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

    def to_json(self) -> dict[str, Any]:
        """What another node's rank takes from rank 0 (its own rank and files aside), in JSON's
        types: under torchrun it goes over the network (rank_json.py), never pickled."""
        return {
            "world_size": self.world_size,
            "config": {f.name: getattr(self.config, f.name) for f in fields(EngineConfig)},
            "device_type": self.device_type,
            "dtype": _dtype_name(self.dtype),
            "kv_cache_dtype": _dtype_name(self.kv_cache_dtype),
            "max_model_len": self.max_model_len,
            "num_threads": self.num_threads,
        }

    @classmethod
    def from_json(cls, data: Any, *, rank: int, files: ModelFiles) -> WorkerArgs:
        """The settings `to_json` made `data` of, for rank `rank` with this node's `files`;
        ValueError when `data` is not such settings."""
        if not isinstance(data, dict) or set(data) != _SETTINGS:
            raise ValueError(f"rank 0's settings are not the expected fields: {data!r:.200}")
        config = data["config"]
        known = {f.name for f in fields(EngineConfig)}
        if not isinstance(config, dict) or not set(config) <= known:
            raise ValueError(f"rank 0's engine config is not EngineConfig's: {config!r:.200}")
        if not all(isinstance(v, _SCALARS) for v in config.values()):
            raise ValueError("rank 0's engine config holds a value that is not a scalar")
        for name in ("world_size", "max_model_len", "num_threads"):
            if type(data[name]) is not int or data[name] < 1:
                raise ValueError(f"rank 0's {name} is not a positive integer: {data[name]!r}")
        if data["device_type"] not in ("cpu", "cuda"):
            raise ValueError(f"rank 0's device_type is not cpu or cuda: {data['device_type']!r}")
        try:
            engine_config = EngineConfig(**config)
        except (TypeError, InvalidParameterError) as exc:
            raise ValueError(f"rank 0's engine config does not hold: {exc}") from None
        return cls(
            rank,
            data["world_size"],
            "",
            engine_config,
            files,
            data["device_type"],
            _dtype(data["dtype"]),
            _dtype(data["kv_cache_dtype"]),
            data["max_model_len"],
            data["num_threads"],
        )


_SETTINGS = {
    "world_size",
    "config",
    "device_type",
    "dtype",
    "kv_cache_dtype",
    "max_model_len",
    "num_threads",
}
_SCALARS = (str, int, float, bool, type(None))
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, known in _DTYPES.items() if known == dtype)


def _dtype(name: Any) -> torch.dtype:
    if not isinstance(name, str) or name not in _DTYPES:
        raise ValueError(f"rank 0's dtype is not one of {', '.join(_DTYPES)}: {name!r:.50}")
    return _DTYPES[name]


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
                input_ids, positions, md, rows, spans = receive_batch(header, runner.device)
                hidden_size = runner.spec.hidden_size
                runner._step_images = receive_images(header, rows, spans, hidden_size, runner.dtype)
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
