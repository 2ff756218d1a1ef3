"""C7's KV figures: the bytes of a context's keys and values, from a model's shape (no model
needed)."""

from __future__ import annotations

import pytest
import torch

from localchat.bench.gguf_shapes import resolve_shape
from localchat.bench.kv_bytes import KVShape, kv_note, kv_record
from localchat.kernels.kv_quant import Q8_0

# C4's file: Llama-3.1-8B's 32 layers, 8 KV heads of 128
C4_SHAPE = KVShape(32, 8, 128)
F16_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # keys and values, 2 bytes a value


def test_the_c4_preset_has_the_8b_kv_shape():
    shape = resolve_shape("llama-8b")
    assert KVShape(shape.num_layers, shape.num_kv_heads, shape.dim_per_head) == C4_SHAPE


def test_bytes_per_token_of_each_dtype():
    assert C4_SHAPE.bytes(1, torch.float16) == F16_PER_TOKEN == 128 << 10
    assert C4_SHAPE.bytes(1, torch.float32) == 2 * F16_PER_TOKEN
    assert C4_SHAPE.bytes(1, Q8_0) == F16_PER_TOKEN * 34 // 64  # 34 bytes per 32 values
    assert C4_SHAPE.bytes(8448, torch.float16) == 8448 * F16_PER_TOKEN


def test_the_record_of_a_float16_run():
    record = kv_record(C4_SHAPE, 8192 + 256, torch.float16, "auto")
    assert record["tokens"] == 8448
    assert (record["layers"], record["kv_heads"], record["head_dim"]) == (32, 8, 128)
    assert record["run_dtype"] == "float16" and record["kv_cache_dtype_flag"] == "auto"
    assert record["run_bytes"] == record["float16_bytes"] == 8448 * F16_PER_TOKEN
    assert record["q8_0_bytes"] == 8448 * F16_PER_TOKEN * 34 // 64
    assert record["q8_0_over_float16"] == pytest.approx(34 / 64)
    assert record["q8_0_over_float16"] <= record["q8_0_over_float16_max"] == 0.55
    note = kv_note(record)
    assert "8,448 tokens" in note and "the run used float16 (--kv-cache-dtype auto)" in note
    assert "q8_0 would hold 561.0 MiB, 0.531x of float16's 1.0 GiB (target <= 0.55x)" in note


def test_the_record_of_a_q8_0_run():
    record = kv_record(C4_SHAPE, 8448, Q8_0, "q8_0")
    assert record["run_dtype"] == "q8_0" and record["run_bytes"] == record["q8_0_bytes"]
    assert record["run_over_float16"] == pytest.approx(34 / 64)
    note = kv_note(record)
    assert "the run used --kv-cache-dtype q8_0, 561.0 MiB, 0.531x" in note
    assert note.endswith("(target <= 0.55x, met)")
