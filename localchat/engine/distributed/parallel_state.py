"""This process's place in the tensor-parallel group, and the collectives the model runs.

Every collective has a timeout (the process group's), so a rank that hangs turns into an error
instead of a wait forever; a rank that dies closes its sockets, which gloo reports at once.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

# LOCALCHAT_TP_TIMEOUT=S: seconds any one collective (or the rendezvous) may take.
COLLECTIVE_TIMEOUT = timedelta(seconds=float(os.environ.get("LOCALCHAT_TP_TIMEOUT", "120")))


def free_address() -> str:
    """host:port of a free local TCP port for the rendezvous (rank 0 hosts the store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def init_group(rank: int, world_size: int, address: str, device: torch.device) -> None:
    """Join the group: NCCL for CUDA tensors, gloo for CPU ones."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://{address}",
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )


def destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` across the ranks, in place; returns it."""
    dist.all_reduce(tensor)
    return tensor


def broadcast(tensor: torch.Tensor) -> torch.Tensor:
    """Rank 0's `tensor` into every rank's (in place); returns it."""
    dist.broadcast(tensor, src=0)
    return tensor


def gather_columns(local: torch.Tensor, shard: int, total: int) -> torch.Tensor:
    """Concatenate each rank's [rows, <=shard] columns on rank 0 (trimmed to `total` columns);
    other ranks get their own piece back."""
    padded = local
    if local.shape[1] != shard:
        padded = torch.nn.functional.pad(local, (0, shard - local.shape[1]))
    padded = padded.contiguous()
    if dist.get_rank() != 0:
        dist.gather(padded, None, dst=0)
        return local
    pieces = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
    dist.gather(padded, pieces, dst=0)
    return torch.cat(pieces, dim=1)[:, :total]
