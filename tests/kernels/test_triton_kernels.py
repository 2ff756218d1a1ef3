"""The Triton kernels, run by Triton's interpreter on the CPU, against their torch references.

float32 is compared tightly, float16 loosely (the interpreter's bfloat16 is broken, so it is not
covered). Shapes are small: the interpreter runs every program in Python.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from localchat import kernels
from localchat.kernels import (
    dispatch,
    triton_activation,
    triton_attention,
    triton_kv_cache,
    triton_norm,
    triton_rotary,
)
from localchat.kernels.activation import (
    gelu_tanh_and_mul_ref,
    silu_and_mul_ref,
    swiglu_oai_and_mul_ref,
)
from localchat.kernels.attention import paged_attention_ref
from localchat.kernels.attention_metadata import AttentionMetadata
from localchat.kernels.kv_cache import store_kv_cache_ref
from localchat.kernels.norm import rms_norm_ref
from localchat.kernels.rotary import rotary_embedding_ref
from localchat.kernels.triton_activation import act_and_mul_triton, silu_and_mul_triton
from localchat.kernels.triton_attention import paged_attention_triton
from localchat.kernels.triton_kv_cache import store_kv_cache_triton
from localchat.kernels.triton_norm import rms_norm_triton
from localchat.kernels.triton_rotary import rotary_embedding_triton
from tests.kernels.conftest import (
    DEVICE,  # imports the Triton kernels interpreted, on the CPU
)

ON_GPU = DEVICE != "cpu"
# On a GPU float32 matmuls in the attention kernels run as 3xTF32: close to, not exactly, float32.
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
ATTN_TOL = {
    torch.float32: dict(atol=1e-4 if ON_GPU else 1e-5, rtol=1e-4),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}
# The interpreter's bfloat16 arithmetic is broken (Triton issues #4972, #11584): bfloat16 only on a
# GPU.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
cpu_only = pytest.mark.skipif(ON_GPU, reason="checks the CPU dispatch and the interpreter")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --- store_kv_cache -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_heads,head_dim", [(3, 64), (2, 128)])
def test_store_kv_cache(dtype, num_kv_heads, head_dim):
    num_blocks, block_size, tokens = 6, 16, 9
    # key/value as strided views of a fused projection output, like the attention layer passes them.
    fused = torch.randn(tokens, 3 * num_kv_heads, head_dim, dtype=dtype)
    key, value = fused[:, num_kv_heads : 2 * num_kv_heads], fused[:, 2 * num_kv_heads :]
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[[2, 5]] = -1  # padding tokens
    caches = [
        torch.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype) for _ in range(2)
    ]
    expected = [c.clone() for c in caches]
    store_kv_cache_ref(key, value, *expected, slots)
    store_kv_cache_triton(key, value, *caches, slots)
    torch.testing.assert_close(caches[0], expected[0], atol=0, rtol=0)
    torch.testing.assert_close(caches[1], expected[1], atol=0, rtol=0)


# --- rms_norm -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 576])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, hidden, with_residual):
    x = torch.randn(2, 3, hidden, dtype=dtype)
    weight = torch.randn(hidden, dtype=dtype)
    residual = torch.randn_like(x) if with_residual else None
    expected = rms_norm_ref(x, weight, 1e-6, residual)
    got = rms_norm_triton(x, weight, 1e-6, residual)
    if with_residual:
        torch.testing.assert_close(got[1], expected[1], atol=0, rtol=0)  # the new residual: exact
        got, expected = got[0], expected[0]
    torch.testing.assert_close(got, expected, **TOL[dtype])


# --- rotary ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (128, 64), (64, 32)])
def test_rotary(dtype, head_dim, rotary_dim):
    tokens, num_q_heads, num_kv_heads = 5, 6, 2
    # q and k as strided views into one fused qkv output.
    qkv = torch.randn(tokens, num_q_heads + 2 * num_kv_heads, head_dim, dtype=dtype)
    q, k = qkv[:, :num_q_heads], qkv[:, num_q_heads : num_q_heads + num_kv_heads]
    positions = torch.randint(0, 4096, (tokens,)).float()
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    angles = positions[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    expected_q, expected_k = rotary_embedding_ref(q, k, cos, sin)
    before = qkv.clone()
    got_q, got_k = rotary_embedding_triton(q, k, cos, sin)
    torch.testing.assert_close(got_q, expected_q, **TOL[dtype])
    torch.testing.assert_close(got_k, expected_k, **TOL[dtype])
    torch.testing.assert_close(qkv, before, atol=0, rtol=0)  # inputs untouched


# --- silu_and_mul ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 100])
def test_silu_and_mul(dtype, d):
    x = torch.randn(2, 3, 2 * d, dtype=dtype)
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_ref(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_and_mul(dtype):
    x = 3 * torch.randn(2, 3, 200, dtype=dtype)
    got = act_and_mul_triton(x, "gelu_tanh")
    torch.testing.assert_close(got, gelu_tanh_and_mul_ref(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_oai_and_mul(dtype):
    x = 6 * torch.randn(5, 256, dtype=dtype)  # both halves cross the clamp at +-limit
    assert (x.abs() > 4.0).any()
    got = act_and_mul_triton(x, "swiglu_oai", limit=4.0, alpha=1.702)
    torch.testing.assert_close(got, swiglu_oai_and_mul_ref(x, 4.0, 1.702), **TOL[dtype])


# --- paged attention ------------------------------------------------------------------------------


def make_batch(seqs, num_kv_heads, head_dim, dtype, block_size=16, spare_blocks=3):
    """A pool holding every sequence's keys, and AttentionMetadata describing the batch, per its
    docstring.

    seqs: (seq_len, query_len) per sequence, decodes (query_len 1) first. Each sequence gets random,
    non-contiguous blocks; rows of block_tables are padded with -1. Returns (k_cache, v_cache, md,
    poisoned): poisoned are copies of the caches with NaN in every slot no query may read
    (unallocated blocks and the tail of each sequence's last block), to catch a kernel reading past
    a sequence's keys.
    """
    num_decodes = sum(1 for seq_len, q_len in seqs if q_len == 1 and seq_len >= 1)
    assert all(q_len == 1 for _, q_len in seqs[:num_decodes])
    blocks_per_seq = [-(-seq_len // block_size) for seq_len, _ in seqs]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks).tolist()
    max_blocks = max(blocks_per_seq) + 1  # one extra column of -1 padding
    block_tables = torch.full((len(seqs), max_blocks), -1, dtype=torch.int32)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    readable = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    slot_mapping, query_start_loc = [], [0]
    for i, ((seq_len, q_len), n) in enumerate(zip(seqs, blocks_per_seq, strict=True)):
        blocks, order = order[:n], order[n:]
        block_tables[i, :n] = torch.tensor(blocks, dtype=torch.int32)
        slots = [
            blocks[pos // block_size] * block_size + pos % block_size for pos in range(seq_len)
        ]
        readable[slots] = True
        slot_mapping += slots[seq_len - q_len :]
        query_start_loc.append(query_start_loc[-1] + q_len)
    seq_lens = [seq_len for seq_len, _ in seqs]
    md = AttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64),
        query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=block_tables,
        num_decodes=num_decodes,
        max_query_len=max(q_len for _, q_len in seqs),
        max_seq_len=max(seq_lens),
        seq_lens_cpu=seq_lens,
        query_start_loc_cpu=query_start_loc,
    )
    poisoned = []
    for cache in (k_cache, v_cache):
        p = cache.clone().view(-1, num_kv_heads, head_dim)
        p[~readable] = float("nan")
        poisoned.append(p.view_as(cache))
    return k_cache, v_cache, md, poisoned


def check_attention(
    seqs,
    num_q_heads,
    num_kv_heads,
    head_dim,
    dtype,
    num_splits=None,
    layers=1,
    block_size=16,
    cache_dtype=None,
):
    k_cache, v_cache, md, (k_poisoned, v_poisoned) = make_batch(
        seqs, num_kv_heads, head_dim, cache_dtype or dtype, block_size
    )
    scale = head_dim**-0.5
    for _ in range(layers):  # later layers reuse the step's scratch (split-K buffers)
        q = torch.randn(md.query_start_loc_cpu[-1], num_q_heads, head_dim, dtype=dtype)
        expected = paged_attention_ref(q, k_cache, v_cache, md, scale)
        got = paged_attention_triton(q, k_poisoned, v_poisoned, md, scale, num_splits=num_splits)
        assert got.dtype == q.dtype and got.shape == q.shape
        torch.testing.assert_close(got, expected, **ATTN_TOL[dtype])


BOUNDARY_LENS = [1, 15, 16, 17, 32, 33]


@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(2, 2), (4, 2), (8, 1)])
def test_decode(num_q_heads, num_kv_heads, num_splits):
    seqs = [(n, 1) for n in BOUNDARY_LENS]
    check_attention(seqs, num_q_heads, num_kv_heads, 64, torch.float32, num_splits)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_head_dim_128(dtype):
    check_attention([(33, 1), (16, 1), (70, 1)], 4, 2, 128, dtype)


def test_decode_non_power_of_two_heads():
    check_attention([(17, 1), (40, 1)], 6, 3, 64, torch.float32)


@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(2, 2), (4, 2), (8, 1)])
def test_prefill(num_q_heads, num_kv_heads):
    # Whole prompts: query length == sequence length (a prefill of 1 token goes through the prefill
    # kernel).
    seqs = [(n, n) for n in [15, 16, 17, 33]] + [(1, 1)]
    # a 1-token prompt is a decode by the batch's definition: put it first
    seqs = seqs[-1:] + seqs[:-1]
    check_attention(seqs, num_q_heads, num_kv_heads, 64, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_head_dim_128(dtype):
    check_attention([(17, 17), (32, 32)], 4, 2, 128, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_prefill_with_cached_prefix(dtype):
    # Prefixes (cache hits or earlier chunks) already in the pool; only the last chunk's queries are
    # given.
    seqs = [(40, 7), (33, 17), (48, 16), (20, 1)]
    check_attention(seqs[-1:] + seqs[:-1], 4, 2, 64, dtype)  # (20, 1) is a decode: first
    check_attention([(40, 7), (33, 17), (48, 16)], 8, 1, 64, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mixed_batch(dtype):
    seqs = [(1, 1), (17, 1), (33, 1), (16, 16), (40, 9), (5, 5), (50, 2)]
    check_attention(seqs, 4, 2, 64, dtype, layers=2)


@pytest.mark.parametrize("block_size", [8, 32])
def test_other_block_sizes(block_size):
    check_attention(
        [(9, 1), (33, 1), (40, 9), (17, 17)], 4, 2, 64, torch.float32, block_size=block_size
    )


def test_a_float16_pool_under_float32_queries():
    # --kv-cache-dtype float16 with a float32 model: the kernels widen the pool's tiles as they load
    seqs = [(1, 1), (17, 1), (33, 1), (16, 16), (40, 9)]
    check_attention(seqs, 4, 2, 64, torch.float32, cache_dtype=torch.float16)


def test_head_dim_not_power_of_two():
    check_attention([(17, 1), (33, 1), (40, 9), (17, 17)], 4, 2, 80, torch.float32)


# --- the compiled kernels -------------------------------------------------------------------------


@cpu_only
def test_kernels_build_for_sm90():
    # The interpreter never compiles; build for an H100/H200 target in a fresh process without it.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).parents[2]), env.get("PYTHONPATH")])
    )
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("sm90_build.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]


# --- dispatch -------------------------------------------------------------------------------------


@pytest.fixture
def fresh_dispatch():
    """use_triton caches its environment check; clear it around a test that changes the
    environment."""
    dispatch._triton_on_cpu.cache_clear()
    yield
    dispatch._triton_on_cpu.cache_clear()


def _forbid_triton(monkeypatch):
    """Make every Triton entry point raise, so a dispatcher that picks one fails the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a CPU tensor was dispatched to a Triton kernel")

    for module, name in [
        (triton_activation, "silu_and_mul_triton"),
        (triton_activation, "act_and_mul_triton"),
        (triton_attention, "paged_attention_triton"),
        (triton_kv_cache, "store_kv_cache_triton"),
        (triton_norm, "rms_norm_triton"),
        (triton_rotary, "rotary_embedding_triton"),
    ]:
        monkeypatch.setattr(module, name, forbidden)


@cpu_only
@pytest.mark.parametrize("interpret", [None, "1"])
def test_dispatch_uses_references_on_cpu(monkeypatch, fresh_dispatch, interpret):
    # Without LOCALCHAT_TRITON_ON_CPU=1, CPU tensors take the references, with or without the
    # interpreter.
    monkeypatch.delenv("LOCALCHAT_TRITON_ON_CPU", raising=False)
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    assert dispatch.use_triton(torch.zeros(1)) is False
    _forbid_triton(monkeypatch)
    x = torch.randn(3, 2, 64)
    kernels.silu_and_mul(x)
    kernels.rms_norm(x, torch.ones(64), 1e-6, residual=x)
    kernels.rotary_embedding(x, x, torch.ones(3, 16), torch.zeros(3, 16))
    k_cache, v_cache, md, _ = make_batch([(5, 1), (9, 4)], 2, 64, torch.float32)
    kernels.store_kv_cache(x[:2], x[:2], k_cache, v_cache, torch.tensor([0, -1]))
    kernels.paged_attention(torch.randn(5, 2, 64), k_cache, v_cache, md, 0.125)


@cpu_only
def test_dispatch_opt_in_on_cpu(monkeypatch, fresh_dispatch):
    monkeypatch.setenv("LOCALCHAT_TRITON_ON_CPU", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dispatch.use_triton(torch.zeros(1)) is True
