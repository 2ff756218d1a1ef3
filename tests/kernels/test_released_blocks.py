"""Block tables in which a sliding-window group's blocks before the window were given back (the
BlockManager writes -1 there and may hand the block to another sequence): every attention path
(the torch reference, the Triton kernels under the interpreter, the CPU fused decode) gives the
same output as over the whole table, because none reads a table entry before its first query's
window.

Two forms of a released entry: -1, as the engine writes it (a path that read it would index before
the pool), and the id of a block full of NaN (a path that read it would turn NaN).
"""

from __future__ import annotations

import functools

import pytest
import torch

from localchat.kernels.attention import paged_attention_ref
from localchat.kernels.attention_metadata import AttentionMetadata
from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.decode_attention import fused_decode_attention
from localchat.kernels.triton_attention import paged_attention_triton
from tests.kernels.conftest import DEVICE
from tests.kernels.naive_attention import naive_attention
from tests.kernels.test_triton_kernels import make_batch

BLOCK_SIZE = 8
WINDOW = 12
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
# (seq_len, query_len): decodes first, then chunks after a context longer than the window, a
# prefill that fits the window, and a chunk that starts within the first window
BATCH = [(5, 1), (40, 1), (61, 1), (48, 7), (70, 16), (9, 9), (20, 10)]


def _released(md, window: int) -> list[tuple[int, int]]:
    """(row, block) entries the window has left: wholly before each sequence's first query's
    window, as BlockManager._release_outside_windows gives them back."""
    entries = []
    for row in range(md.num_seqs):
        q_len = md.query_start_loc_cpu[row + 1] - md.query_start_loc_cpu[row]
        computed = md.seq_lens_cpu[row] - q_len
        first_needed = max(computed - window + 1, 0) // BLOCK_SIZE
        entries += [(row, block) for block in range(first_needed)]
    return entries


def _release(k_cache, v_cache, md, window: int, to_nan_block: bool):
    """Copies of the pool and metadata with the released entries replaced (by -1, or by a block
    full of NaN appended to the pool) and the released blocks' contents NaN."""
    k, v, tables = k_cache.clone(), v_cache.clone(), md.block_tables.clone()
    nan_block = k.shape[0]
    if to_nan_block:
        nan = torch.full((1, *k.shape[1:]), float("nan"), dtype=k.dtype)
        k, v = torch.cat([k, nan]), torch.cat([v, nan])
    entries = _released(md, window)
    assert entries, "the batch must release something"
    for row, block in entries:
        released = int(tables[row, block])
        k[released] = v[released] = float("nan")  # handed to another sequence, say
        tables[row, block] = nan_block if to_nan_block else -1
    released_md = md.with_tables(md.slot_mapping, tables)
    return k, v, released_md


def _fused_decode(q, k_cache, v_cache, md, scale, *, sliding_window):
    """The CPU fused decode as the engine calls it: its q/k/v row holds the token's query and the
    key and value already in its slot (stored again unchanged), with an identity rotation."""
    nd = md.num_decodes
    slots = md.slot_mapping[:nd]
    rows = [q[:nd].reshape(nd, -1)]
    for cache in (k_cache, v_cache):
        rows.append(cache.view(-1, KV_HEADS, HEAD_DIM)[slots].reshape(nd, -1).float())
    qkv = torch.cat(rows, dim=1).contiguous()
    cos, sin = torch.ones(nd, HEAD_DIM // 2), torch.zeros(nd, HEAD_DIM // 2)
    decode_md = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=md.query_start_loc[: nd + 1],
        seq_lens=md.seq_lens[:nd],
        block_tables=md.block_tables[:nd],
        num_decodes=nd,
        max_query_len=1,
        max_seq_len=max(md.seq_lens_cpu[:nd]),
        seq_lens_cpu=md.seq_lens_cpu[:nd],
        query_start_loc_cpu=list(range(nd + 1)),
    )
    out = fused_decode_attention(
        qkv, k_cache, v_cache, cos, sin, decode_md, HEADS, KV_HEADS, HEAD_DIM, scale,
        sliding_window=sliding_window,
    )  # fmt: skip
    assert out is not None
    return out.view(nd, HEADS, HEAD_DIM)


PATHS = {
    "reference": paged_attention_ref,
    "triton_1_split": functools.partial(paged_attention_triton, num_splits=1),
    "triton_3_splits": functools.partial(paged_attention_triton, num_splits=3),
    "cpu_fused_decode": _fused_decode,
}


@pytest.mark.parametrize("to_nan_block", [False, True], ids=["minus_one", "nan_block"])
@pytest.mark.parametrize("path", PATHS)
def test_released_blocks_are_never_read(path, to_nan_block):
    if path == "cpu_fused_decode" and (DEVICE != "cpu" or cpu_kernels() is None):
        pytest.skip("the CPU fused decode needs the C++ kernels on the CPU")
    torch.manual_seed(0)
    k_cache, v_cache, md, _ = make_batch(BATCH, KV_HEADS, HEAD_DIM, torch.float32, BLOCK_SIZE)
    q = torch.randn(md.query_start_loc_cpu[-1], HEADS, HEAD_DIM)
    scale = HEAD_DIM**-0.5
    expected = naive_attention(q, k_cache, v_cache, md, scale, WINDOW)
    k_released, v_released, released_md = _release(k_cache, v_cache, md, WINDOW, to_nan_block)
    got = PATHS[path](q, k_released, v_released, released_md, scale, sliding_window=WINDOW)
    rows = got.shape[0]  # the fused decode computes the decodes only
    torch.testing.assert_close(got.cpu().double(), expected[:rows], atol=2e-5, rtol=1e-4)
