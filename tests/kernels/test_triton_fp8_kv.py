"""--kv-cache-dtype fp8 (CUDA): the Triton store writes float8 e4m3 values (scale 1.0) where the
torch reference does, and the attention kernels widen the pool's tiles as they load them, as for a
float16 pool. Run here through Triton's interpreter; tests/kernels/sm90_build.py compiles them for
an H100."""

from __future__ import annotations

import pytest
import torch

from localchat.kernels.attention import paged_attention_ref
from localchat.kernels.kv_cache import store_kv_cache_ref
from localchat.kernels.kv_quant import FP8
from localchat.kernels.triton_attention import paged_attention_triton
from localchat.kernels.triton_kv_cache import store_kv_cache_triton
from tests.kernels.test_triton_kernels import make_batch


def test_store_puts_float8_values_in_their_slots():
    """Values float8 holds exactly, so that the interpreter's conversion (which rounds otherwise
    than the GPU's round-to-nearest, cvt.rn.satfinite, as torch's) changes none of them."""
    tokens, num_kv_heads, head_dim, num_blocks = 9, 3, 64, 6
    fused = (torch.randn(tokens, 3 * num_kv_heads, head_dim) * 40).to(FP8).float()
    key, value = fused[:, num_kv_heads : 2 * num_kv_heads], fused[:, 2 * num_kv_heads :]
    slots = torch.randperm(num_blocks * 16)[:tokens]
    slots[[2, 5]] = -1  # padding tokens
    caches = [torch.zeros(num_blocks, 16, num_kv_heads, head_dim, dtype=FP8) for _ in range(2)]
    expected = [c.clone() for c in caches]
    store_kv_cache_ref(key, value, *expected, slots)
    store_kv_cache_triton(key, value, *caches, slots)
    for got, want in zip(caches, expected, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    stored = expected[0].view(-1, num_kv_heads, head_dim)[slots[0]].float()
    assert torch.equal(stored, key[0]) and stored.abs().max() > 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_attention_reads_a_float8_pool(dtype):
    seqs = [(1, 1), (17, 1), (33, 1), (16, 16), (40, 9)]
    k_cache, v_cache, md, poisoned = make_batch(seqs, 2, 64, torch.float32)
    k_cache, v_cache = k_cache.to(FP8), v_cache.to(FP8)
    k_poisoned, v_poisoned = (cache.to(FP8) for cache in poisoned)  # NaN stays NaN
    q = torch.randn(md.query_start_loc_cpu[-1], 4, 64, dtype=dtype)
    expected = paged_attention_ref(q, k_cache, v_cache, md, 0.125)
    got = paged_attention_triton(q, k_poisoned, v_poisoned, md, 0.125)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)
