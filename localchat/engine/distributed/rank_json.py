"""Values the ranks exchange over the network, under torchrun (rank 0's settings, each rank's load
result): JSON bytes in a uint8 tensor, never a pickle. torch's broadcast_object_list and
all_gather_object unpickle what arrives, so whoever reaches a rank's sockets could run code in it;
JSON can only be data, and a payload that is not (a pickle's bytes are not UTF-8) is a ValueError.

The framing is the object collectives' (an int64 length, then the bytes), each length bounded by
MAX_BYTES before anything is allocated for it.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

MAX_BYTES = 1 << 20  # a JSON value sent between ranks; the settings take about 1 KiB


def encode(value: Any) -> torch.Tensor:
    """`value` (JSON's types only) as a uint8 tensor of its UTF-8 JSON text."""
    data = json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
    if len(data) > MAX_BYTES:
        raise ValueError(f"a value sent between ranks takes {len(data)} bytes, over {MAX_BYTES}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def decode(data: bytes, sender: str) -> Any:
    """The JSON value `data` holds; ValueError naming `sender` when it is not UTF-8 JSON."""
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{sender} sent {len(data)} bytes that are not JSON ({exc})") from None


def _length(size: torch.Tensor, sender: str) -> int:
    n = int(size.item())
    if not 0 < n <= MAX_BYTES:
        raise ValueError(f"{sender} announced a value of {n} bytes (1 to {MAX_BYTES} allowed)")
    return n


def broadcast_json(value: Any, group: Any) -> Any:
    """Rank 0's `value` on every rank of `group` (the others pass None and get rank 0's)."""
    if dist.get_rank(group) == 0:
        data = encode(value)
        dist.broadcast(torch.tensor([data.numel()], dtype=torch.int64), src=0, group=group)
        dist.broadcast(data, src=0, group=group)
        return value
    size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, src=0, group=group)
    data = torch.empty(_length(size, "rank 0"), dtype=torch.uint8)
    dist.broadcast(data, src=0, group=group)
    return decode(data.numpy().tobytes(), "rank 0")


def all_gather_json(value: Any, group: Any) -> list[Any]:
    """Every rank's `value`, in rank order, on every rank of `group`."""
    world = dist.get_world_size(group)
    data = encode(value)
    sizes = torch.zeros(world, dtype=torch.int64)
    dist.all_gather(list(sizes.split(1)), torch.tensor([data.numel()]), group=group)
    lengths = [_length(size, f"rank {rank}") for rank, size in enumerate(sizes)]
    longest = max(lengths)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: data.numel()] = data
    gathered = torch.empty(world * longest, dtype=torch.uint8)
    dist.all_gather(list(gathered.split(longest)), padded, group=group)
    return [
        decode(piece[:n].numpy().tobytes(), f"rank {rank}")
        for rank, (piece, n) in enumerate(zip(gathered.split(longest), lengths, strict=True))
    ]
