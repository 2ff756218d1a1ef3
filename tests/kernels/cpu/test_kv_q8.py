"""The q8_0 KV pool (kernels/kv_quant.py): the torch quantization is llama.cpp's Q8_0, the C++
store gives its bytes, and the fused C++ decode (rotary, store, attention reading the int8 codes)
equals the per-op torch path over the same pool, with a window, a softcap and sinks too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from localchat.kernels.attention import paged_attention_ref
from localchat.kernels.attention_metadata import AttentionMetadata
from localchat.kernels.decode_attention import fused_decode_attention
from localchat.kernels.kv_cache import store_kv_cache, store_kv_cache_ref
from localchat.kernels.kv_quant import dequantize_q8_0, kv_row_bytes, quantize_q8_0
from localchat.kernels.rotary import rotary_embedding_ref
from tests.cpu_kernels import kernels_or_skip
from tests.kernels.cpu.test_decode_attention_features import BLOCK_SIZE, SEQ_LENS, decode_batch
from tests.kernels.naive_attention import OPTION_CASES

pytestmark = pytest.mark.usefixtures("each_isa")  # each build of the kernels (conftest.py)
GENERIC_KERNELS = True  # the generic build too: its q8_0 rows are quant/generic/kv_q8.h's


def test_the_torch_quantization_is_llama_cpps_q8_0():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 128, generator=generator) * torch.rand(7, 3, 1, generator=generator)
    x[0, 0, :32] = 0  # a block of zeros: scale 0, codes 0
    ours = quantize_q8_0(x)
    assert ours.dtype == torch.int8 and ours.shape == (7, 3, 4 * 34)
    # gguf-py's Q8_0 (bit for bit ggml's reference): d = max|x| / 127, codes round(x / d)
    theirs = quants.quantize(x.reshape(-1, 128).numpy(), GGMLQuantizationType.Q8_0)
    assert np.array_equal(ours.reshape(-1, 4 * 34).view(torch.uint8).numpy(), theirs)
    back = dequantize_q8_0(ours)
    expected = quants.dequantize(theirs, GGMLQuantizationType.Q8_0).reshape(x.shape)
    assert torch.equal(back, torch.from_numpy(expected))
    # ties go to even (as llama.cpp's x86 and ARM quantize_row_q8_0 round), not away from zero
    tie = torch.tensor([2.5, -3.5, 0.5] + [0.0] * 28 + [127.0])
    assert quantize_q8_0(tie)[2:5].tolist() == [2, -4, 0]
    # 34 bytes per 32 values: 0.53 of float16's
    assert kv_row_bytes(torch.int8, 64) / kv_row_bytes(torch.float16, 64) == 34 / 64


def test_the_cpp_store_gives_the_torch_bytes():
    """The per-op path's store (C++ where the kernels are built) quantizes as quantize_q8_0,
    through strided views of a fused qkv, skipping slot -1."""
    kernels_or_skip()
    generator = torch.Generator().manual_seed(1)
    tokens, num_kv_heads, head_dim, num_blocks = 37, 3, 64, 6
    qkv = torch.randn(tokens, (9 + 2 * num_kv_heads) * head_dim, generator=generator) * 3
    k = qkv[:, 9 * head_dim : 12 * head_dim].view(tokens, num_kv_heads, head_dim)
    v = qkv[:, 12 * head_dim :].view(tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=generator)[:tokens]
    slots[[3, 20]] = -1
    shape = (2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim // 32 * 34)
    pool = torch.randint(-128, 128, shape, dtype=torch.int8, generator=generator)
    expected = pool.clone()
    store_kv_cache(k, v, pool[0], pool[1], slots)
    store_kv_cache_ref(k, v, expected[0], expected[1], slots)
    assert torch.equal(pool, expected)
    assert torch.equal(pool[0].view(-1, num_kv_heads, 68)[slots[0]], quantize_q8_0(k[0]))


def poison(rows: torch.Tensor) -> torch.Tensor:
    """Give every q8_0 block of `rows` (int8 [..., blocks * 34]) a NaN scale, in place."""
    blocks = rows.view(*rows.shape[:-1], -1, 34)
    blocks[..., :2] = torch.tensor([float("nan")], dtype=torch.float16).view(torch.int8)
    return rows


def poison_before_windows(cache, md, window):
    """A copy of a q8_0 cache whose keys before each sequence's window have NaN scales."""
    poisoned = cache.clone()
    for i in range(md.num_seqs):
        for p in range(max(0, md.seq_lens_cpu[i] - window) if window else 0):
            poison(poisoned[int(md.block_tables[i, p // BLOCK_SIZE]), p % BLOCK_SIZE])
    return poisoned


def check(heads, window=None, softcap=None, with_sinks=False, q_gain=1.0, rotary=None):
    num_heads, num_kv_heads, head_dim = heads
    generator = torch.Generator().manual_seed(0)
    # the slots outside the sequences' keys are NaN, so their q8_0 rows get NaN scales in the pool
    # the C++ decode reads; the torch path's, whose padded gathers reach them, holds zeros there
    md, values = decode_batch(SEQ_LENS, num_kv_heads, head_dim, torch.float32, generator)
    poisoned, pool = quantize_q8_0(values * 2), quantize_q8_0(values.nan_to_num() * 2)
    qkv = torch.randn(len(SEQ_LENS), (num_heads + 2 * num_kv_heads) * head_dim, generator=generator)
    qkv[:, : num_heads * head_dim] *= q_gain
    angles = (md.seq_lens.float() - 1)[:, None] * torch.rand(
        (rotary or head_dim) // 2, generator=generator
    )
    cos, sin = angles.cos(), angles.sin()
    sinks = torch.randn(num_heads, generator=generator) * 2 + 1 if with_sinks else None
    scale = head_dim**-0.5
    options = dict(sliding_window=window, softcap=softcap, sinks=sinks)

    # the per-op torch path: rotary, the quantized store, attention over the dequantized rows
    ref_pool = pool.clone()
    q, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1
    )
    q, k = rotary_embedding_ref(
        q.reshape(-1, num_heads, head_dim), k.reshape(-1, num_kv_heads, head_dim), cos, sin
    )
    v = v.reshape(-1, num_kv_heads, head_dim)
    store_kv_cache_ref(k, v, ref_pool[0], ref_pool[1], md.slot_mapping)
    expected = paged_attention_ref(q, ref_pool[0], ref_pool[1], md, scale, **options)

    got_pool = torch.stack([poison_before_windows(poisoned[i], md, window) for i in range(2)])
    got = fused_decode_attention(
        qkv.clone(), got_pool[0], got_pool[1], cos, sin, md, num_heads, num_kv_heads, head_dim,
        scale, **options,
    )  # fmt: skip
    assert got is not None, "the fast path declined a q8_0 pool"
    torch.testing.assert_close(got, expected.reshape(len(SEQ_LENS), -1), atol=2e-5, rtol=1e-4)
    # the current token's key and value stored as the torch path quantizes them, to the bit
    stored = md.slot_mapping
    for i in range(2):
        flat, ref_flat = got_pool[i].view(-1, num_kv_heads, got_pool.shape[-1]), ref_pool[i]
        assert torch.equal(flat[stored], ref_flat.view_as(flat)[stored])


# (query heads, KV heads, head_dim): grouped queries, one KV head per query head, a head_dim of
# three blocks, wide heads
HEADS = [(9, 3, 64), (8, 8, 32), (12, 4, 96), (4, 1, 128)]


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: "-".join(map(str, h)))
def test_fused_decode_over_a_q8_0_pool_equals_the_torch_path(heads):
    kernels_or_skip()
    check(heads)


def test_partial_rotary_over_a_q8_0_pool():
    kernels_or_skip()
    check((8, 2, 64), rotary=32)


@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_window_softcap_and_sinks_over_a_q8_0_pool(case):
    kernels_or_skip()
    check((8, 2, 64), **OPTION_CASES[case])


@pytest.mark.parametrize("window", [1, 5, 16, 17, 33])
def test_windows_read_no_key_before_them(window):
    kernels_or_skip()
    check((9, 3, 64), window=window)


def test_the_torch_path_reads_a_mixed_batch_as_its_dequantized_pool():
    """Decodes and prefills (one after a cached prefix, one under a window) over a q8_0 pool give
    what the same attention gives over the float32 values the pool holds."""
    generator = torch.Generator().manual_seed(3)
    num_heads, num_kv_heads, head_dim, num_blocks = 6, 2, 64, 24
    pool = quantize_q8_0(torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim) * 2)
    dense = dequantize_q8_0(pool)
    # two decodes (lengths 20, 40), a prefill of 9 after 23 cached, a prefill of 30 from scratch
    seq_lens, q_lens = [20, 40, 32, 30], [1, 1, 9, 30]
    tables = torch.randperm(num_blocks, generator=generator)[:12].view(4, 3).to(torch.int32)
    starts = [0, *np.cumsum(q_lens).tolist()]
    md = AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.int64),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        num_decodes=2,
        max_query_len=30,
        max_seq_len=40,
        seq_lens_cpu=seq_lens,
        query_start_loc_cpu=starts,
    )
    q = torch.randn(starts[-1], num_heads, head_dim, generator=generator)
    for window in (None, 7):
        got = paged_attention_ref(q, pool[0], pool[1], md, 0.125, sliding_window=window)
        md.reference_plan, md.window_plans = None, {}
        want = paged_attention_ref(q, dense[0], dense[1], md, 0.125, sliding_window=window)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
