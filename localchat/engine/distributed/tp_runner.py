"""TensorParallelRunner: rank 0's ModelRunner. It schedules, prepares and samples as the
single-device runner does; each forward pass and logits projection is announced to the other ranks
(a header over their pipes, then the inputs by one broadcast, and a step's image embeddings by
another), and each rank runs it on its shard. The image encoder, if any, runs here only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

from localchat.engine.core.memory import PrefaultedMemory
from localchat.engine.core.runtime import EngineRuntime
from localchat.engine.distributed import parallel_state
from localchat.engine.distributed.parallel_layers import TensorParallelDecoder
from localchat.engine.distributed.rank_messages import AllocateKV, ComputeLogits, Forward
from localchat.engine.distributed.step_transfer import batch_payload, broadcast_images
from localchat.engine.distributed.torchrun import TorchrunGroup
from localchat.engine.distributed.worker import WorkerArgs
from localchat.engine.distributed.worker_pool import WorkerPool
from localchat.engine.modeling.model_runner import ModelRunner
from localchat.errors import EngineDeadError
from localchat.kernels.attention_metadata import AttentionMetadata

F = TypeVar("F", bound=Callable)


def _collective(method: F) -> F:
    """Turn a failed collective or pipe (a rank died or timed out) into an EngineDeadError."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.error is not None:
            raise self.error
        try:
            return method(self, *args, **kwargs)
        except EngineDeadError:
            raise
        except (RuntimeError, OSError) as exc:
            self.error = self.pool.failure(exc)
            raise self.error from exc

    return wrapper  # type: ignore[return-value]


class TensorParallelRunner(ModelRunner):
    """Rank 0 of `config.tensor_parallel_size`; spawns and drives the others (or, under torchrun,
    drives the ranks torchrun started)."""

    def __init__(self, model, hf_config, *, runtime: EngineRuntime, **kwargs) -> None:
        """ModelRunner's arguments, plus the runtime the other ranks load from."""
        super().__init__(model, hf_config, **kwargs)
        config = runtime.config
        assert isinstance(self.model, TensorParallelDecoder)
        self.world_size = config.tensor_parallel_size
        self.error: EngineDeadError | None = None
        from_env = parallel_state.joined_from_env()
        address = "" if from_env else parallel_state.free_address()
        workers = [
            WorkerArgs(
                rank,
                self.world_size,
                address,
                config,
                runtime.files,
                runtime.device.type,
                runtime.dtype,
                runtime.kv_cache_dtype,
                runtime.max_model_len,
                torch.get_num_threads(),  # what the runtime chose for rank 0
            )
            for rank in range(1, self.world_size)
        ]
        self.pool: WorkerPool | TorchrunGroup = (
            TorchrunGroup(workers[0]) if from_env else WorkerPool(workers, runtime.device)
        )
        self.model.announce_logits = self._announce_logits

    def bytes_per_block(self) -> int:
        """On the CPU the ranks share one memory, so a block costs all their shards together."""
        shard = super().bytes_per_block()
        return shard * self.world_size if self.device.type == "cpu" else shard

    @_collective
    def allocate_kv_cache(self, num_blocks: int, memory: PrefaultedMemory | None = None) -> None:
        self.pool.send(AllocateKV(num_blocks))
        super().allocate_kv_cache(num_blocks)

    def capture_cuda_graphs(self):
        return None  # collectives run eagerly

    run = _collective(ModelRunner.run)
    prompt_logits = _collective(ModelRunner.prompt_logits)

    @_collective
    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata
    ) -> torch.Tensor:
        images = self._step_images  # _prepare's, from rank 0's image encoder
        header, payload = batch_payload(input_ids, positions, md, images)
        self.pool.send(Forward(header))
        parallel_state.broadcast(payload)
        if images is not None:
            self._step_images = broadcast_images(images, self.dtype)
        return super()._forward(input_ids, positions, md)

    def _announce_logits(self, hidden: torch.Tensor) -> None:
        rows, columns = hidden.shape
        self.pool.send(ComputeLogits((rows, columns)))
        parallel_state.broadcast(hidden.contiguous())

    def check_health(self) -> None:
        """Raise EngineDeadError if a rank has exited or does not answer a ping within
        LOCALCHAT_TP_PING_TIMEOUT (the engine calls this every second while idle, when no
        collective would notice)."""
        if self.error is not None:
            raise self.error
        exited = self.pool.exited()
        if exited:
            self.error = self.pool.failure(RuntimeError(f"found {exited} while idle"))
            raise self.error
        try:
            self.pool.ping()
        except (RuntimeError, OSError) as exc:
            self.error = self.pool.failure(exc)
            raise self.error from exc

    def close(self) -> None:
        self.pool.close()
