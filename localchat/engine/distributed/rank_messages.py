"""What rank 0 tells the other tensor-parallel ranks, and what a spawned rank reports while it
loads. Over a spawned rank's pipe the messages go as they are; under torchrun a command goes by
broadcast as its code and integers (`to_ints` and `from_ints`, parallel_state.send_command).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from localchat.engine.distributed.step_transfer import BatchHeader

# --- commands (rank 0 -> the others) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Forward:
    """Run a forward pass; its inputs follow by broadcast (step_transfer.py)."""

    header: BatchHeader


@dataclass(frozen=True, slots=True)
class ComputeLogits:
    """Project hidden states of this shape (broadcast next) to logits."""

    shape: tuple[int, int]


@dataclass(frozen=True, slots=True)
class AllocateKV:
    """Allocate this rank's KV cache of `num_blocks` blocks."""

    num_blocks: int


@dataclass(frozen=True, slots=True)
class Ping:
    """Answer over the control group (parallel_state.answer_ping)."""


@dataclass(frozen=True, slots=True)
class Exit:
    """Leave the group and exit."""


RankCommand = Forward | ComputeLogits | AllocateKV | Ping | Exit
_KINDS: tuple[type[RankCommand], ...] = (Forward, ComputeLogits, AllocateKV, Ping, Exit)


def to_ints(command: RankCommand) -> tuple[int, tuple[int, ...]]:
    """A command as its code and integers (for a broadcast)."""
    match command:
        case Forward(header):
            values = dataclasses.astuple(header)
        case ComputeLogits(shape):
            values = tuple(shape)
        case AllocateKV(num_blocks):
            values = (num_blocks,)
        case _:
            values = ()
    return _KINDS.index(type(command)), values


def from_ints(code: int, values: list[int]) -> RankCommand:
    """The command `to_ints` made `code` and `values` (padded with zeros) of."""
    kind = _KINDS[code]
    if kind is Forward:
        return Forward(BatchHeader(*values[: len(dataclasses.fields(BatchHeader))]))
    if kind is ComputeLogits:
        return ComputeLogits((values[0], values[1]))
    if kind is AllocateKV:
        return AllocateKV(values[0])
    return Ping() if kind is Ping else Exit()


# --- a spawned rank's reports (the others -> rank 0) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class RankStarted:
    """The process runs (before it joins the group)."""


@dataclass(frozen=True, slots=True)
class RankReady:
    """Its shard is loaded."""


@dataclass(frozen=True, slots=True)
class RankLoadFailed:
    """Loading raised; `traceback` says where."""

    traceback: str


RankReport = RankStarted | RankReady | RankLoadFailed
