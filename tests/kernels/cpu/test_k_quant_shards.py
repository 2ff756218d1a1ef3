"""Tensor-parallel cuts of a K-quant weight (sub-scales with a (d, dmin) pair per 256 inputs):
on super-block boundaries they keep the compact scales, inside one they take float16 scales, as
the GPU's kernels do. And Q6_K's u6 weights, cut plane by plane on their 128-weight chunks, a byte
per code elsewhere or on the GPU. Every value is held against an independent reference: gguf-py's
dequantization of the same blocks, or the codes and scales a weight was built from."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize

from localchat.engine.distributed.sharded_weights import take_columns, take_rows
from localchat.engine.loading.gguf_repack import file_blocks_weight
from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import quant_linear
from tests.kernels.cpu.test_cpu_quant_linear import as_u6, symmetric_u8
from tests.kernels.cpu.test_gguf_repack import random_blocks

K_TYPES = [T.Q4_K, T.Q5_K]


def k_weight(qtype: T, rows: int, cols: int, seed: int) -> tuple[PackedWeight, torch.Tensor]:
    """Random Q4_K or Q5_K blocks as our weight (repacked: u4 or u8 with compact scales) and as
    gguf-py dequantizes them."""
    raw = random_blocks(qtype, rows, cols, seed=seed)
    dense = np.asarray(gguf_dequantize(raw, qtype), dtype=np.float32).reshape(rows, cols)
    weight = file_blocks_weight(torch.from_numpy(raw), qtype).repacked()
    assert weight.super_scales is not None  # the compact form: the file's 12 bits a group
    return weight, torch.from_numpy(dense)


def assert_float16_scales_of(
    got: torch.Tensor, dense: torch.Tensor, w: PackedWeight, columns: slice = slice(None)
) -> None:
    """`got` is `dense` (columns `columns` of `w`) up to each group's scale and min rounded to
    float16, 2^-11 relative each: a weight scale x code + min is off by at most 2^-11 of
    |scale x code| + |min|. (w's exact float32 scales and mins only size the tolerance.)"""
    scales, mins = w.group_params()
    assert mins is not None
    terms = scales.repeat_interleave(32, dim=1).abs() * w.codes() + mins.abs().repeat_interleave(
        32, dim=1
    )
    bound = 2**-11 * terms[:, columns] * 1.001 + 1e-9
    error = (got - dense).abs()
    assert got.shape == dense.shape and (error <= bound).all(), (error / bound).max().item()


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_cuts_on_super_blocks_keep_the_file_scales(qtype):
    w, dense = k_weight(qtype, 12, 1024, seed=1)
    shard = take_columns(w, 256, 768)
    assert shard.super_scales is not None and shard.scales.dtype == torch.uint8
    torch.testing.assert_close(shard.dequantize(), dense[:, 256:768], rtol=1e-6, atol=1e-9)
    rows = take_rows(w, torch.tensor([1, 4, 7]))
    torch.testing.assert_close(rows.dequantize(), dense[[1, 4, 7]], rtol=1e-6, atol=1e-9)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        quant_linear(x, shard), x @ dense[:, 256:768].T, rtol=1e-3, atol=1e-3
    )


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_a_cut_inside_a_super_block_takes_float16_scales(qtype):
    w, dense = k_weight(qtype, 8, 1024, seed=2)
    shard = take_columns(w, 128, 640)  # group-aligned, not super-block aligned
    assert shard.super_scales is None and shard.scales.dtype == torch.float16
    assert_float16_scales_of(shard.dequantize(), dense[:, 128:640], w, slice(128, 640))
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(1))
    expected = x @ dense[:, 128:640].T
    scale = (x.abs() @ dense[:, 128:640].abs().T).max().item()
    torch.testing.assert_close(quant_linear(x, shard), expected, rtol=0, atol=2e-3 * scale)


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_leaving_the_cpu_takes_float16_scales(qtype):
    w, dense = k_weight(qtype, 4, 512, seed=3)
    moved = w.to("meta")  # the GPU's kernels read one float16 scale and min per group
    assert moved.super_scales is None and moved.scales.dtype == torch.float16
    assert moved.mins is not None and moved.mins.dtype == torch.float16
    # what .to() moves, here on the CPU: the file's weights up to float16 scales
    half = w.with_float16_scales()
    assert half.super_scales is None and half.scales.dtype == torch.float16
    assert_float16_scales_of(half.dequantize(), dense, w)
    in_blocks = file_blocks_weight(torch.from_numpy(random_blocks(qtype, 4, 512, seed=3)), qtype)
    assert_float16_scales_of(in_blocks.with_float16_scales().dequantize(), dense, w)


def test_u6_weights_are_cut_and_moved_a_byte_per_code():
    """Q6_K's two-plane u6 codes: a TP column cut inside a 128-weight chunk, and the GPU, take them
    a byte each (u8)."""
    source = symmetric_u8(12, 768, 16, 32)
    # the weight from the codes and float16 scales it was built from
    dense = (source.qweight.float() - 32) * source.scales.float().repeat_interleave(16, dim=1)
    w = as_u6(source)
    assert torch.equal(w.dequantize(), dense)
    shard = take_columns(w, 256, 512)  # on its 128-weight chunks: both planes cut
    assert shard.layout == "u6" and torch.equal(shard.dequantize(), dense[:, 256:512])
    inside = take_columns(w, 64, 448)
    assert inside.layout == "u8" and torch.equal(inside.dequantize(), dense[:, 64:448])
    rows = take_rows(w, torch.tensor([2, 5, 11]))
    assert rows.layout == "u6" and torch.equal(rows.dequantize(), dense[[2, 5, 11]])
    moved = w.to("meta")
    assert moved.layout == "u8" and tuple(moved.qweight.shape) == (12, 768)
    assert torch.equal(w.with_byte_codes().dequantize(), dense)
