"""The fused CPU decode step (kernels/csrc/decode_attention.h) with a sliding window, a score
softcap and sinks, against the naive float64 attention of tests/kernels/naive_attention.py.

Every slot of the pool the kernel must not read (outside the sequences' blocks, and the keys before
each window) is NaN, so a kernel that reads a key the window excludes, rather than starting at the
window's first key, fails.
"""

from __future__ import annotations

import pytest
import torch

from localchat.kernels.attention_metadata import AttentionMetadata
from localchat.kernels.decode_attention import fused_decode_attention
from localchat.kernels.kv_cache import store_kv_cache_ref
from localchat.kernels.rotary import rotary_embedding_ref
from tests.kernels.naive_attention import OPTION_CASES, naive_attention, poison_outside_windows

pytestmark = pytest.mark.usefixtures("each_isa")  # each build of the kernels (conftest.py)
GENERIC_KERNELS = True  # the generic build too (conftest.py)

BLOCK_SIZE = 16
SEQ_LENS = [1, 5, 16, 17, 33, 70]  # a first token, a block's edges, several blocks


def decode_batch(seq_lens, num_kv_heads, head_dim, pool_dtype, generator):
    """Decodes over random blocks: the metadata, and a pool whose slots outside the sequences'
    blocks are NaN."""
    num_blocks = sum(-(-n // BLOCK_SIZE) for n in seq_lens) + 2
    tables = torch.full((len(seq_lens), -(-max(seq_lens) // BLOCK_SIZE) + 1), -1, dtype=torch.int32)
    free = torch.randperm(num_blocks, generator=generator).tolist()
    pool = torch.full((2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), float("nan"))
    for row, length in enumerate(seq_lens):
        for b in range(-(-length // BLOCK_SIZE)):
            tables[row, b] = block = free.pop()
            used = min(BLOCK_SIZE, length - b * BLOCK_SIZE)
            pool[:, block, :used] = torch.randn(
                2, used, num_kv_heads, head_dim, generator=generator
            )
    slots = torch.tensor(
        [int(tables[i, (n - 1) // BLOCK_SIZE]) * BLOCK_SIZE + (n - 1) % BLOCK_SIZE
         for i, n in enumerate(seq_lens)],
        dtype=torch.int64,
    )  # fmt: skip
    md = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=torch.arange(len(seq_lens) + 1, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        num_decodes=len(seq_lens),
        max_query_len=1,
        max_seq_len=max(seq_lens),
        seq_lens_cpu=list(seq_lens),
        query_start_loc_cpu=list(range(len(seq_lens) + 1)),
    )
    return md, pool.to(pool_dtype)


def check(
    window=None,
    softcap=None,
    with_sinks=False,
    heads=(8, 2, 64),
    pool_dtype=torch.float32,
    q_gain=1.0,
    seq_lens=SEQ_LENS,
):
    num_heads, num_kv_heads, head_dim = heads
    generator = torch.Generator().manual_seed(0)
    md, pool = decode_batch(seq_lens, num_kv_heads, head_dim, pool_dtype, generator)
    qkv = torch.randn(len(seq_lens), (num_heads + 2 * num_kv_heads) * head_dim, generator=generator)
    qkv[:, : num_heads * head_dim] *= q_gain
    positions = md.seq_lens.long() - 1
    angles = positions[:, None].float() * torch.rand(head_dim // 2, generator=generator)
    cos, sin = angles.cos(), angles.sin()
    sinks = torch.randn(num_heads, generator=generator) * 2 + 1 if with_sinks else None
    scale = head_dim**-0.5

    # the expected output: the rotated token's key and value stored, then the naive attention
    ref_pool = pool.clone()
    q, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1
    )
    q, k = rotary_embedding_ref(
        q.reshape(-1, num_heads, head_dim), k.reshape(-1, num_kv_heads, head_dim), cos, sin
    )
    v = v.reshape(-1, num_kv_heads, head_dim)
    store_kv_cache_ref(k, v, ref_pool[0], ref_pool[1], md.slot_mapping)
    expected = naive_attention(q, ref_pool[0], ref_pool[1], md, scale, window, softcap, sinks)

    got = fused_decode_attention(
        qkv.clone(),
        poison_outside_windows(pool[0], md, window),
        poison_outside_windows(pool[1], md, window),
        cos,
        sin,
        md,
        num_heads,
        num_kv_heads,
        head_dim,
        scale,
        sliding_window=window,
        softcap=softcap,
        sinks=sinks,
    )
    assert got is not None, "the fast path declined"
    torch.testing.assert_close(
        got.double(), expected.reshape(len(seq_lens), -1), atol=2e-5, rtol=1e-4
    )


# 1: the query's own key only; 16: a block; 5, 17: windows that cut through blocks; 33: one
# sequence's whole context exactly; 100: longer than every context
@pytest.mark.parametrize("window", [1, 5, 16, 17, 33, 100])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_window(window, pool_dtype):
    check(window, pool_dtype=pool_dtype)


@pytest.mark.parametrize("heads", [(8, 8, 32), (9, 3, 64), (16, 2, 80), (4, 1, 128)])
def test_window_head_shapes(heads):
    check(12, heads=heads)


@pytest.mark.parametrize("features", OPTION_CASES)
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16])
def test_softcap_and_sinks(features, pool_dtype):
    check(pool_dtype=pool_dtype, **OPTION_CASES[features])


@pytest.mark.parametrize("heads", [(9, 3, 64), (16, 2, 80)])
def test_all_three_on_long_contexts(heads):
    # a window of 200 over contexts up to 1000: many blocks skipped, many read
    check(200, softcap=20.0, with_sinks=True, heads=heads, q_gain=4.0, seq_lens=[3, 200, 201, 999])


def test_large_softcap_arguments():
    # scores far past the tanh's knee, both signs: the cap holds them at +-softcap
    check(softcap=1.0, q_gain=30.0, heads=(4, 2, 64))


def test_options_out_of_range_raise():
    md, pool = decode_batch([4], 1, 64, torch.float32, torch.Generator().manual_seed(0))
    qkv = torch.zeros(1, 3 * 64)
    for options in [dict(sliding_window=0), dict(softcap=-1.0), dict(sinks=torch.zeros(2))]:
        with pytest.raises(ValueError):
            fused_decode_attention(qkv, pool[0], pool[1], qkv, qkv, md, 1, 1, 64, 1.0, **options)
