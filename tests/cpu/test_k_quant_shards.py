"""Tensor-parallel cuts of a K-quant weight (sub-scales with a (d, dmin) pair per 256 inputs):
on super-block boundaries they keep the compact scales, inside one they take float16 scales. And
Q6_K's u6 weights, cut plane by plane on their 128-weight chunks, a byte per code elsewhere or on
the GPU."""

from __future__ import annotations

import torch

from localchat.engine.distributed.sharded_weights import take_columns, take_rows
from localchat.kernels.quant_linear import quant_linear
from tests.cpu.test_cpu_quant_linear import as_u6, k_quant, symmetric_u8


def test_cuts_on_super_blocks_keep_the_file_scales():
    for layout in ("u4", "u8"):
        w = k_quant(layout, 12, 1024)
        dense = w.dequantize()
        shard = take_columns(w, 256, 768)
        assert shard.super_scales is not None and shard.scales.dtype == torch.uint8
        assert torch.equal(shard.dequantize(), dense[:, 256:768])
        rows = take_rows(w, torch.tensor([1, 4, 7]))
        assert torch.equal(rows.dequantize(), dense[[1, 4, 7]])
        x = torch.randn(3, 512)
        torch.testing.assert_close(
            quant_linear(x, shard), x @ dense[:, 256:768].T, rtol=1e-3, atol=1e-3
        )


def test_a_cut_inside_a_super_block_takes_float16_scales():
    w = k_quant("u4", 8, 1024)
    shard = take_columns(w, 128, 640)  # group-aligned, not super-block aligned
    assert shard.super_scales is None and shard.scales.dtype == torch.float16
    expected = w.with_float16_scales().dequantize()[:, 128:640]
    assert torch.equal(shard.dequantize(), expected)


def test_leaving_the_cpu_takes_float16_scales():
    moved = k_quant("u8", 4, 512).to("meta")  # the GPU's kernels read one float16 scale per group
    assert moved.super_scales is None and moved.scales.dtype == torch.float16
    assert moved.mins is not None and moved.mins.dtype == torch.float16


def test_u6_weights_are_cut_and_moved_a_byte_per_code():
    """Q6_K's two-plane u6 codes: a TP column cut inside a 128-weight chunk, and the GPU, take them
    a byte each (u8)."""
    w = as_u6(symmetric_u8(12, 768, 16, 32))
    dense = w.dequantize()
    shard = take_columns(w, 256, 512)  # on its 128-weight chunks: both planes cut
    assert shard.layout == "u6" and torch.equal(shard.dequantize(), dense[:, 256:512])
    inside = take_columns(w, 64, 448)
    assert inside.layout == "u8" and torch.equal(inside.dequantize(), dense[:, 64:448])
    rows = take_rows(w, torch.tensor([2, 5, 11]))
    assert rows.layout == "u6" and torch.equal(rows.dequantize(), dense[[2, 5, 11]])
    moved = w.to("meta")
    assert moved.layout == "u8" and tuple(moved.qweight.shape) == (12, 768)
    assert torch.equal(w.with_byte_codes().dequantize(), dense)
