"""The fused CPU decode step (rotary + KV store + paged attention) equals the per-op reference
path."""

from __future__ import annotations

import pytest
import torch

from localchat.kernels.attention import paged_attention_ref
from localchat.kernels.attention_metadata import AttentionMetadata
from localchat.kernels.decode_attention import fused_decode_attention
from localchat.kernels.kv_cache import store_kv_cache_ref
from localchat.kernels.rotary import rotary_embedding_ref
from tests.cpu_kernels import kernels_or_skip

pytestmark = pytest.mark.usefixtures("each_isa")  # each build of the kernels (conftest.py)
GENERIC_KERNELS = True  # the generic build too (conftest.py)


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(9, 3, 64, 64), (8, 8, 32, 32), (16, 2, 80, 40)])
def test_fused_decode_equals_reference(heads, pool_dtype):
    kernels_or_skip()
    num_heads, num_kv_heads, head_dim, rotary_half = (
        heads  # the last case: partial rotary (dims 80, rotary 80)
    )
    generator = torch.Generator().manual_seed(0)
    block_size, num_blocks = 16, 40
    seq_lens = [1, 17, 16, 70]  # a first token, block boundaries, several blocks
    tables = torch.full((len(seq_lens), 6), -1, dtype=torch.int32)
    free = torch.randperm(num_blocks, generator=generator).tolist()
    for row, length in enumerate(seq_lens):
        for b in range(-(-length // block_size)):
            tables[row, b] = free.pop()
    positions = torch.tensor([n - 1 for n in seq_lens])
    slots = torch.tensor(
        [
            int(tables[i, p // block_size]) * block_size + int(p) % block_size
            for i, p in enumerate(positions)
        ],
        dtype=torch.int64,
    )
    md = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=torch.arange(len(seq_lens) + 1, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        num_decodes=len(seq_lens),
        max_query_len=1,
        max_seq_len=max(seq_lens),
        seq_lens_cpu=seq_lens,
        query_start_loc_cpu=list(range(len(seq_lens) + 1)),
    )
    pool = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=generator).to(
        pool_dtype
    )
    qkv = torch.randn(len(seq_lens), (num_heads + 2 * num_kv_heads) * head_dim, generator=generator)
    angles = positions[:, None].float() * torch.rand(
        rotary_half // 2 if rotary_half < head_dim else head_dim // 2, generator=generator
    )
    cos, sin = angles.cos(), angles.sin()

    ref_pool = pool.clone()
    q, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1
    )
    q, k = rotary_embedding_ref(
        q.reshape(-1, num_heads, head_dim), k.reshape(-1, num_kv_heads, head_dim), cos, sin
    )
    store_kv_cache_ref(k, v.reshape(-1, num_kv_heads, head_dim), ref_pool[0], ref_pool[1], slots)
    expected = paged_attention_ref(q, ref_pool[0], ref_pool[1], md, head_dim**-0.5).reshape(
        len(seq_lens), -1
    )

    got = fused_decode_attention(
        qkv.clone(),
        pool[0],
        pool[1],
        cos,
        sin,
        md,
        num_heads,
        num_kv_heads,
        head_dim,
        head_dim**-0.5,
    )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # the keys stored are the rotated ones, rounded to the pool's type as torch rounds, to the bit
    if pool_dtype != torch.float32:
        assert torch.equal(pool, ref_pool)
    torch.testing.assert_close(pool, ref_pool, rtol=1e-6, atol=1e-6)


def test_fast_path_declines_what_it_does_not_cover():
    md = AttentionMetadata(
        slot_mapping=torch.zeros(3, dtype=torch.int64),
        query_start_loc=torch.tensor([0, 1, 3]),
        seq_lens=torch.tensor([4, 2], dtype=torch.int32),
        block_tables=torch.zeros(2, 1),
        num_decodes=1,
        max_query_len=2,
        max_seq_len=4,
    )
    qkv = torch.zeros(3, 3 * 64)
    pool = torch.zeros(2, 1, 16, 1, 64)
    assert (
        fused_decode_attention(qkv, pool[0], pool[1], qkv, qkv, md, 1, 1, 64, 1.0) is None
    )  # a prefill inside
    md.num_decodes = 3
    assert (
        fused_decode_attention(qkv.half(), pool[0], pool[1], qkv, qkv, md, 1, 1, 64, 1.0) is None
    )  # float16
