"""The CPU kernel's interleaved weight layout (kernels/packed_weight.py): the C++ rearrangement
against the torch reference, and every kernel path giving the same bits in either layout."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from localchat.kernels.packed_weight import (
    CODE_UNIT,
    GROUP_UNIT,
    PackedWeight,
    interleave_rows,
)
from localchat.kernels.quant_linear import embedding_rows, interleave_for_kernel, quant_linear
from tests.kernels.cpu.test_cpu_quant_linear import run, weights

pytestmark = pytest.mark.usefixtures("each_isa")  # each build of the kernels (conftest.py)
GENERIC_KERNELS = True  # the generic build too (conftest.py)


def copy(w: PackedWeight) -> PackedWeight:
    return dataclasses.replace(
        w,
        qweight=w.qweight.clone(),
        scales=w.scales.clone(),
        mins=None if w.mins is None else w.mins.clone(),
        super_scales=None if w.super_scales is None else w.super_scales.clone(),
    )


# rows: whole blocks of four, a partial block, fewer than one block; columns: whole 64-byte pieces
# and a short last one (576 / 2 = 288 bytes), 16-group blocks and a short one
SHAPES = [(40, 576), (37, 96), (3, 64), (13, 1536), (13, 768), (8, 512), (9, 640)]


@pytest.mark.parametrize("shape", SHAPES)
def test_torch_layout_round_trips_and_moves_only_whole_blocks(shape):
    rows, width = shape
    t = torch.arange(rows * width, dtype=torch.int32).reshape(rows, width)
    inter = interleave_rows(t, CODE_UNIT)
    assert torch.equal(interleave_rows(inter, CODE_UNIT, back=True), t)
    whole = rows // 4 * 4
    assert torch.equal(inter[whole:], t[whole:])  # a partial block stays row-major
    if whole and width > CODE_UNIT:
        # the first block: row 0's first piece, then row 1's first piece
        flat = inter[:4].reshape(-1)
        assert torch.equal(flat[:CODE_UNIT], t[0, :CODE_UNIT])
        assert torch.equal(flat[CODE_UNIT : 2 * CODE_UNIT], t[1, :CODE_UNIT])


@pytest.mark.parametrize("shape", SHAPES)
def test_cpp_rearrangement_equals_the_torch_reference(ext, shape):
    rows, cols = shape
    for name, w in weights(rows, cols).items():
        plain = copy(w)
        inter = interleave_for_kernel(w)  # in place: w's tensors are inter's now
        assert inter.interleaved and inter.qweight.data_ptr() == w.qweight.data_ptr()
        assert torch.equal(inter.qweight, interleave_rows(plain.qweight, CODE_UNIT)), name
        assert torch.equal(inter.scales, interleave_rows(plain.scales, GROUP_UNIT)), name
        if plain.mins is not None:  # K-quant mins (top bits, two groups a byte): half the unit
            unit = GROUP_UNIT if plain.super_scales is None else GROUP_UNIT // 2
            assert torch.equal(inter.mins, interleave_rows(plain.mins, unit)), name
        back = inter.row_major()
        assert torch.equal(back.qweight, plain.qweight) and torch.equal(back.scales, plain.scales)
        assert plain.mins is None or torch.equal(back.mins, plain.mins), name
        assert interleave_for_kernel(inter) is inter  # already interleaved: untouched


@pytest.mark.parametrize("shape", SHAPES)
def test_every_path_gives_the_same_bits_in_both_layouts(ext, shape):
    rows, cols = shape
    generator = torch.Generator().manual_seed(rows)
    for name, w in weights(rows, cols).items():
        plain = copy(w)
        inter = interleave_for_kernel(w)
        dense = plain.dequantize()
        assert torch.equal(inter.dequantize(), dense), name
        cpp_dense = ext.dequantize(
            inter.qweight,
            inter.scales,
            inter.mins,
            inter.super_scales,
            w.bits,
            w.group_size,
            w.zero_point,
            True,
        )
        assert torch.equal(cpp_dense, dense), name
        for batch in (1, 3, 40):  # a decode, a small batch, more than one panel of rows
            x = torch.randn(batch, cols, generator=generator)
            for precise in (True, False):
                for vnni in (True, False):
                    expected = run(ext, x, plain, precise=precise, vnni=vnni)
                    got = run(ext, x, inter, precise=precise, vnni=vnni)
                    assert torch.equal(got, expected), (name, batch, precise, vnni)
            assert torch.equal(quant_linear(x, inter), quant_linear(x, plain)), (name, batch)


def test_row_lookups_and_moves_read_the_interleaved_layout(ext):
    w = weights(41, 576)["u8-g32-sym"]  # an embedding tied to the LM head (Q8_0-like)
    plain = copy(w)
    inter = interleave_for_kernel(w)
    ids = torch.tensor([[40, 0, 5], [39, 17, 36]])  # the partial block's row, first, middle
    assert torch.equal(inter.dequantize(ids), plain.dequantize(ids))
    assert torch.equal(inter.dequantize(slice(3, 9)), plain.dequantize(slice(3, 9)))
    order = torch.tensor([3, 1, 40, 2])
    picked = inter.select_rows(order)
    assert not picked.interleaved and torch.equal(picked.qweight, plain.qweight[order])
    moved = inter.to("meta")  # leaving the CPU: row-major again
    assert not moved.interleaved and moved.qweight.shape == plain.qweight.shape


@pytest.mark.parametrize("shape", [(41, 576), (13, 1536), (9, 512)])
def test_the_cpp_row_lookup_equals_the_reference_in_both_layouts(ext, shape):
    """embedding_rows (the C++ dequantize_rows) gives PackedWeight.dequantize's floats exactly, for
    every layout, rows in whole blocks, the partial block and the first, in any shape."""
    rows = shape[0]
    ids = torch.tensor([[rows - 1, 0, 5], [rows - 2, rows // 2, 1]])
    for name, w in weights(*shape).items():
        expected = w.dequantize(ids)
        assert torch.equal(embedding_rows(copy(w), ids, torch.float32), expected), name
        inter = interleave_for_kernel(copy(w))
        assert inter.interleaved
        assert torch.equal(embedding_rows(inter, ids, torch.float32), expected), name
        half = embedding_rows(inter, ids[0], torch.bfloat16)
        assert half.dtype == torch.bfloat16 and torch.equal(half, expected[0].bfloat16()), name
    with pytest.raises(RuntimeError, match="out of range"):
        embedding_rows(w, torch.tensor([rows]), torch.float32)


def test_fusing_interleaved_parts(ext):
    """Parts of whole 4-row blocks stack interleaved as they are; a part with a partial block makes
    the stack row-major. Either way the fused weight multiplies like its parts."""
    from localchat.kernels.quant_linear import fuse

    for rows in (8, 6):
        for name, w in weights(rows, 512).items():
            parts = [copy(w), copy(w)]
            plain = fuse([copy(w), copy(w)])
            fused = fuse([interleave_for_kernel(p) for p in parts])
            assert fused.interleaved == (rows % 4 == 0), (name, rows)
            assert torch.equal(fused.dequantize(), plain.dequantize()), (name, rows)
            x = torch.randn(1, 512)
            assert torch.equal(quant_linear(x, fused), quant_linear(x, plain)), (name, rows)
