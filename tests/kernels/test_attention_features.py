"""Sliding windows, score softcapping and attention sinks in the paged attention paths: the torch
reference (its CPU flash path and its SDPA/explicit fallback) and the Triton kernels (under the
interpreter on the CPU), against a naive float64 attention written from the formulas, and against
Hugging Face's own eager attention (Gemma 2's, gpt-oss's) with its masks.

Keys before the window of a sequence's first query are NaN in the pool the paths read, so a path
that reads them, rather than skipping them, fails; the Triton kernels' pool is NaN outside the
sequences' blocks too (the reference's gather reads a short decode's padding and masks it).
"""

import functools
from types import SimpleNamespace

import pytest
import torch

from localchat.kernels import attention, dispatch
from localchat.kernels.attention import paged_attention, paged_attention_ref
from localchat.kernels.triton_attention import paged_attention_triton
from tests.kernels.conftest import DEVICE
from tests.kernels.naive_attention import OPTION_CASES, naive_attention, poison_outside_windows
from tests.kernels.test_triton_kernels import make_batch

TOL = {
    torch.float32: dict(atol=2e-5 if DEVICE == "cpu" else 2e-4, rtol=1e-4),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
}
DTYPES = [torch.float32, torch.float16]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _reference_fallback(*args, **options):
    """The reference as it runs where the CPU flash attention is not (SDPA with masks, explicit
    scores for sinks)."""
    flash = attention._flash_cpu
    attention._flash_cpu = None
    try:
        return paged_attention_ref(*args, **options)
    finally:
        attention._flash_cpu = flash


PATHS = {
    "reference": paged_attention_ref,
    "reference_fallback": _reference_fallback,
    # the decode kernel alone (the sinks in its last step), and with a reduce (the sinks there)
    "triton_1_split": functools.partial(paged_attention_triton, num_splits=1),
    "triton_3_splits": functools.partial(paged_attention_triton, num_splits=3),
}


def check(
    path,
    seqs,
    window=None,
    softcap=None,
    with_sinks=False,
    heads=(4, 2),
    dtype=torch.float32,
    head_dim=32,
    block_size=16,
    q_gain=1.0,
):
    num_q_heads, num_kv_heads = heads
    k_cache, v_cache, md, (k_poisoned, v_poisoned) = make_batch(
        seqs, num_kv_heads, head_dim, dtype, block_size
    )
    if path.startswith("reference"):
        k_poisoned, v_poisoned = k_cache, v_cache
    k_poisoned = poison_outside_windows(k_poisoned, md, window)
    v_poisoned = poison_outside_windows(v_poisoned, md, window)
    q = torch.randn(md.query_start_loc_cpu[-1], num_q_heads, head_dim) * q_gain
    q = q.to(dtype)
    sinks = torch.randn(num_q_heads) * 2 + 1 if with_sinks else None
    scale = head_dim**-0.5
    expected = naive_attention(q, k_cache, v_cache, md, scale, window, softcap, sinks)
    options = dict(sliding_window=window, softcap=softcap, sinks=sinks)
    for _ in range(2):  # a second layer reuses the step's plans and scratch
        got = PATHS[path](q, k_poisoned, v_poisoned, md, scale, **options)
        assert got.dtype == q.dtype and got.shape == q.shape
        torch.testing.assert_close(got.cpu().double(), expected, **TOL[dtype])
    return md


DECODES = [(1, 1), (5, 1), (16, 1), (17, 1), (33, 1), (40, 1)]
PREFILLS = [(1, 1), (17, 17), (33, 33), (40, 40)]
# a cached prefix (or earlier chunks) longer than most windows, chunks longer and shorter than them
CHUNKS = [(48, 7), (40, 17), (70, 16), (37, 30)]
MIXED = [(1, 1), (17, 1), (40, 1), (16, 16), (40, 9), (5, 5), (50, 2), (70, 33)]
# 1: only the query's own key; 16: a block; 17, 5: windows that cut through blocks; 33: a
# sequence's whole context exactly; 100: longer than every context
WINDOWS = [1, 5, 16, 17, 33, 100]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("window", WINDOWS)
def test_window_decodes(path, window):
    check(path, DECODES, window)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("window", WINDOWS)
def test_window_prefills(path, window):
    check(path, PREFILLS, window)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("window", [1, 5, 12, 17, 33, 100])
def test_window_chunked_prefill_after_a_cached_prefix(path, window):
    check(path, CHUNKS, window)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("heads", [(2, 2), (8, 1)])
def test_window_mixed_batch(path, heads):
    check(path, MIXED, 17, heads=heads)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("block_size", [8, 32])
def test_window_other_block_sizes(path, block_size):
    check(path, MIXED, 12, block_size=block_size)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("features", OPTION_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softcap_and_sinks(path, features, dtype):
    check(path, MIXED, dtype=dtype, **OPTION_CASES[features])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("heads", [(2, 2), (8, 1)])
def test_all_three_gqa_and_chunks(path, heads):
    check(path, DECODES[:3] + CHUNKS, heads=heads, **OPTION_CASES["all"])


def test_options_left_out_are_the_plain_path():
    k_cache, v_cache, md, _ = make_batch(MIXED, 2, 32, torch.float32)
    q = torch.randn(md.query_start_loc_cpu[-1], 4, 32)
    plain = paged_attention_ref(q, k_cache, v_cache, md, 0.2)
    for options in [{}, dict(sliding_window=None, softcap=None, sinks=None)]:
        assert torch.equal(paged_attention_ref(q, k_cache, v_cache, md, 0.2, **options), plain)
    # a window no sequence reaches the end of changes nothing, to the bit
    assert torch.equal(paged_attention_ref(q, k_cache, v_cache, md, 0.2, sliding_window=70), plain)


def test_options_out_of_range_raise():
    k_cache, v_cache, md, _ = make_batch([(5, 1)], 1, 32, torch.float32)
    q = torch.randn(1, 2, 32)
    for options in [
        dict(sliding_window=0),
        dict(softcap=0.0),
        dict(sinks=torch.zeros(3)),
    ]:
        with pytest.raises(ValueError):
            paged_attention_ref(q, k_cache, v_cache, md, 0.2, **options)


@pytest.mark.skipif(DEVICE != "cpu", reason="the dispatch to Triton on the CPU")
def test_dispatch_passes_the_options_to_triton(monkeypatch):
    monkeypatch.setenv("LOCALCHAT_TRITON_ON_CPU", "1")
    dispatch._triton_on_cpu.cache_clear()
    try:
        k_cache, v_cache, md, _ = make_batch(MIXED, 2, 32, torch.float32)
        q = torch.randn(md.query_start_loc_cpu[-1], 4, 32) * 3
        options = dict(sliding_window=9, softcap=4.0, sinks=torch.randn(4))
        got = paged_attention(q, k_cache, v_cache, md, 0.2, **options)
        assert dispatch.use_triton(q)
        torch.testing.assert_close(
            got.double(),
            naive_attention(q, k_cache, v_cache, md, 0.2, 9, 4.0, options["sinks"]),
            **TOL[torch.float32],
        )
    finally:
        dispatch._triton_on_cpu.cache_clear()


# --- Hugging Face's eager attention ---------------------------------------------------------------


def hf_chunk(seq_len, q_len, num_q_heads, num_kv_heads, head_dim):
    """One sequence's chunk after a cached prefix: the batch, and its queries, keys and values as
    transformers' attention takes them ([1, heads, tokens, D])."""
    k_cache, v_cache, md, _ = make_batch([(seq_len, q_len)], num_kv_heads, head_dim, torch.float32)
    q = torch.randn(q_len, num_q_heads, head_dim)
    table, block_size = md.block_tables[0].tolist(), k_cache.shape[1]
    slots = [(table[p // block_size], p % block_size) for p in range(seq_len)]
    keys = torch.stack([k_cache[b, o] for b, o in slots]).transpose(0, 1)[None]
    values = torch.stack([v_cache[b, o] for b, o in slots]).transpose(0, 1)[None]
    return (k_cache, v_cache, md, q), (q.transpose(0, 1)[None], keys, values)


def hf_mask(seq_len, q_len, window):
    from transformers.masking_utils import eager_mask, sliding_window_causal_mask_function

    return eager_mask(
        batch_size=1,
        q_length=q_len,
        kv_length=seq_len,
        q_offset=seq_len - q_len,
        mask_function=sliding_window_causal_mask_function(window),
        dtype=torch.float32,
        device=DEVICE,
    )


@pytest.mark.parametrize("path", PATHS)
def test_equals_gemma2_eager_attention(path):
    # Gemma 2: a sliding-window layer with its scores capped
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    seq_len, q_len, window, softcap, heads = 60, 25, 20, 5.0, (4, 2)
    (k_cache, v_cache, md, q), (query, keys, values) = hf_chunk(seq_len, q_len, *heads, 32)
    q, query = q * 3, query * 3  # scores of a few units: the cap bends them
    module = SimpleNamespace(num_key_value_groups=2, head_dim=32, training=False)
    expected, _ = eager_attention_forward(
        module,
        query,
        keys,
        values,
        hf_mask(seq_len, q_len, window),
        scaling=0.2,
        softcap=softcap,
    )
    got = PATHS[path](q, k_cache, v_cache, md, 0.2, sliding_window=window, softcap=softcap)
    torch.testing.assert_close(got, expected[0], **TOL[torch.float32])


@pytest.mark.parametrize("path", PATHS)
def test_equals_gpt_oss_eager_attention(path):
    # gpt-oss: a sliding-window layer with a learned sink per head
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    seq_len, q_len, window, heads = 60, 25, 20, (4, 2)
    (k_cache, v_cache, md, q), (query, keys, values) = hf_chunk(seq_len, q_len, *heads, 32)
    sinks = torch.randn(4) * 2 + 1
    module = SimpleNamespace(num_key_value_groups=2, training=False, sinks=sinks)
    expected, _ = eager_attention_forward(
        module, query, keys, values, hf_mask(seq_len, q_len, window), scaling=0.2
    )
    got = PATHS[path](q, k_cache, v_cache, md, 0.2, sliding_window=window, sinks=sinks)
    torch.testing.assert_close(got, expected[0], **TOL[torch.float32])
