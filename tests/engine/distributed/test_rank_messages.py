"""The tensor-parallel ranks' commands as torchrun broadcasts them: each survives to_ints and
from_ints (padded to the broadcast's width) unchanged."""

from __future__ import annotations

import pytest

from localchat.engine.distributed.parallel_state import COMMAND_WIDTH
from localchat.engine.distributed.rank_messages import (
    AllocateKV,
    ComputeLogits,
    Exit,
    Forward,
    Ping,
    RankCommand,
    from_ints,
    to_ints,
)
from localchat.engine.distributed.step_transfer import BatchHeader


def _has_images(command: RankCommand) -> bool:
    return isinstance(command, Forward) and command.header.image_rows > 0


@pytest.mark.parametrize(
    "command",
    [
        Forward(BatchHeader(37, 3, 5, 2, 16, 200)),
        Forward(BatchHeader(37, 3, 5, 2, 16, 200, image_rows=12, image_spans=3)),
        ComputeLogits((3, 576)),
        AllocateKV(364),
        Ping(),
        Exit(),
    ],
    ids=lambda command: type(command).__name__ + ("+images" if _has_images(command) else ""),
)
def test_a_command_survives_its_broadcast(command: RankCommand):
    code, values = to_ints(command)
    assert len(values) < COMMAND_WIDTH
    padded = list(values) + [0] * (COMMAND_WIDTH - 1 - len(values))
    assert from_ints(code, padded) == command
