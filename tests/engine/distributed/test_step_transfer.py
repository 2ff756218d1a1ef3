"""A forward pass's inputs as rank 0 sends them to the other tensor-parallel ranks: what a rank
rebuilds from the header and the broadcasts (here a queue in place of the group) is rank 0's
batch, and for a step with image tokens its image rows, spans and embeddings in the runner's
dtype, which rank 0 runs too."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from localchat.engine.core.multimodal import StepImages
from localchat.engine.distributed import parallel_state, step_transfer
from localchat.kernels.attention_metadata import AttentionMetadata


class Group:
    """Rank 0's broadcasts, kept in order until the other rank takes them."""

    def __init__(self) -> None:
        self.sent: deque[torch.Tensor] = deque()

    def send(self, tensor: torch.Tensor) -> torch.Tensor:
        self.sent.append(tensor.clone())
        return tensor

    def receive(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.copy_(self.sent.popleft())


@pytest.fixture
def group(monkeypatch) -> Group:
    """The group, rank 0 broadcasting through it."""
    group = Group()
    monkeypatch.setattr(parallel_state, "broadcast", group.send)
    return group


def _batch() -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Two sequences: a decode, then a 7-token prefill chunk."""
    seq_lens = torch.tensor([12, 7], dtype=torch.int32)
    starts = torch.tensor([0, 1, 8], dtype=torch.int32)
    md = AttentionMetadata(
        slot_mapping=torch.arange(40, 48),
        query_start_loc=starts,
        seq_lens=seq_lens,
        block_tables=torch.tensor([[3, 4], [5, -1]], dtype=torch.int32),
        num_decodes=1,
        max_query_len=7,
        max_seq_len=12,
        seq_lens_cpu=seq_lens.tolist(),
        query_start_loc_cpu=starts.tolist(),
    )
    return torch.arange(100, 108), torch.tensor([11, 0, 1, 2, 3, 4, 5, 6]), md


def _receive(group: Group, monkeypatch, header, hidden: int, dtype: torch.dtype):
    """The other rank's side: what it runs."""
    monkeypatch.setattr(parallel_state, "broadcast", group.receive)
    input_ids, positions, md, rows, spans = step_transfer.receive_batch(header, torch.device("cpu"))
    images = step_transfer.receive_images(header, rows, spans, hidden, dtype)
    assert not group.sent
    return input_ids, positions, md, images


@pytest.mark.parametrize("with_images", [False, True], ids=["text", "images"])
def test_the_other_ranks_rebuild_rank_0s_step(group, monkeypatch, with_images):
    input_ids, positions, md = _batch()
    images = None
    if with_images:  # 4 image rows of the prefill, attending both ways in one span
        embeddings = torch.randn(4, 6, dtype=torch.float32)
        images = StepImages(torch.arange(3, 7), embeddings, [(3, 7, 1, 6)])
    header, payload = step_transfer.batch_payload(input_ids, positions, md, images)
    parallel_state.broadcast(payload)
    sent = None if images is None else step_transfer.broadcast_images(images, torch.bfloat16)
    got_ids, got_positions, got_md, got_images = _receive(
        group, monkeypatch, header, 6, torch.bfloat16
    )
    assert torch.equal(got_ids, input_ids) and torch.equal(got_positions, positions)
    for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
        assert torch.equal(getattr(got_md, name), getattr(md, name)), name
    assert got_md.seq_lens_cpu == md.seq_lens_cpu
    assert got_md.query_start_loc_cpu == md.query_start_loc_cpu
    scalars = ("num_decodes", "max_query_len", "max_seq_len")
    assert [getattr(got_md, n) for n in scalars] == [getattr(md, n) for n in scalars]
    if images is None:
        assert got_images is None and (header.image_rows, header.image_spans) == (0, 0)
        return
    assert sent is not None and got_images is not None
    assert sent.embeddings.dtype == torch.bfloat16  # rank 0 runs what it sent
    assert torch.equal(got_images.rows, images.rows)
    assert torch.equal(got_images.embeddings, sent.embeddings)
    assert got_images.spans == sent.spans == images.spans
