"""Every GGUF quantized type repacks into a PackedWeight that dequantizes exactly as gguf-py
does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from localchat.engine.loading import gguf_repack
from localchat.engine.loading.gguf_repack import (
    FILE_BLOCK_TYPES,
    GROUP_BLOCK_TYPES,
    QUANTIZED_TYPES,
    repack,
    repack_reference,
)
from localchat.kernels.packed_weight import pack_k_params, unpack_k_params
from localchat.kernels.quant_linear import interleave_for_kernel
from tests.cpu_kernels import kernels_or_skip

# byte offsets of each type's float16 fields inside a block (random bytes there could be inf/nan)
_F16_FIELDS = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
}
# byte offsets of each type's E8M0 exponent bytes (set to 2^-18 to 2^2 scales, where real weights'
# lie and float16 holds them exactly)
_E8M0_FIELDS = {T.MXFP4: (0,)}


def random_blocks(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random codes and sub-scales with sane float16 super-block scales, as [rows, row_bytes]
    uint8."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
    for offset in _F16_FIELDS.get(qtype, ()):
        values = rng.uniform(-2e-3, 2e-3, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = values.view(np.uint8).reshape(-1, 2)
    for offset in _E8M0_FIELDS.get(qtype, ()):
        blocks[:, offset] = rng.integers(110, 131, size=blocks.shape[0], dtype=np.uint8)
    assert qtype in _F16_FIELDS or qtype in _E8M0_FIELDS, f"add {qtype.name}'s scale fields"
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("qtype", QUANTIZED_TYPES, ids=lambda t: t.name)
def test_repack_matches_gguf_dequantize(qtype):
    rows, cols = 24, 512
    data = random_blocks(qtype, rows, cols)
    expected = torch.from_numpy(dequantize(data, qtype).reshape(rows, cols).astype(np.float32))
    packed = repack(data, qtype, (rows, cols))
    assert packed.shape == (rows, cols)
    got = packed.dequantize()
    # Q4_K/Q5_K keep the file's sub-scales and (d, dmin), so only float32 rounding differs; Q6_K
    # rounds (super-block scale x sub-block scale) to float16: 2^-11 relative per group
    tolerance = {T.Q4_K: 1e-6, T.Q5_K: 1e-6, T.Q6_K: 2e-3}.get(qtype, 1e-7)
    assert torch.allclose(
        got, expected, rtol=tolerance, atol=tolerance * expected.abs().max().item()
    )
    # the codes cover their whole range, so a wrong bit position cannot hide
    codes = packed.codes()
    assert codes.max().item() == (
        15
        if packed.layout == "u4"
        else {T.Q5_0: 31, T.Q5_1: 31, T.Q5_K: 31, T.Q6_K: 63, T.Q8_0: 255, T.MXFP4: 24}[qtype]
    )
    if qtype == T.MXFP4:  # the doubled E2M1 values around 12: every one, and nothing between
        assert set(codes.unique().tolist()) == {12 + v for v in (0, 1, 2, 3, 4, 6, 8, 12)} | {
            12 - v for v in (1, 2, 3, 4, 6, 8, 12)
        }


@pytest.mark.parametrize("qtype", QUANTIZED_TYPES, ids=lambda t: t.name)
def test_cpp_repack_equals_the_torch_reference_bit_for_bit(qtype):
    kernels_or_skip()
    rows, cols = 40, 1024
    data = random_blocks(qtype, rows, cols, seed=3)
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(1))
    fast = repack(data, qtype, (rows, cols), order)
    reference = repack_reference(torch.from_numpy(data), qtype, rows).select_rows(order)
    assert (fast.layout, fast.group_size, fast.zero_point, fast.source_type) == (
        reference.layout,
        reference.group_size,
        reference.zero_point,
        reference.source_type,
    )
    assert torch.equal(fast.qweight, reference.qweight)
    assert torch.equal(fast.scales.view(torch.int16), reference.scales.view(torch.int16))
    assert (fast.mins is None) == (reference.mins is None)
    if fast.mins is not None:
        assert torch.equal(fast.mins.view(torch.int16), reference.mins.view(torch.int16))
    assert (fast.super_scales is None) == (qtype not in (T.Q4_K, T.Q5_K))
    if fast.super_scales is not None:
        assert fast.scales.dtype == fast.mins.dtype == torch.uint8
        assert torch.equal(
            fast.super_scales.view(torch.int16), reference.super_scales.view(torch.int16)
        )


@pytest.mark.parametrize("qtype", QUANTIZED_TYPES, ids=lambda t: t.name)
def test_repack_straight_into_the_interleaved_layout(qtype, monkeypatch):
    """Repacking with interleave gives what interleaving the repacked weight gives (42 rows: the
    last two stay row-major); types the kernels read in their blocks are kept as the file has
    them, and the C++ repack still interleaves them when asked."""
    kernels_or_skip()
    rows, cols = 42, 512
    data = random_blocks(qtype, rows, cols, seed=5)
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(2))
    direct = repack(data, qtype, (rows, cols), order, interleave=True)
    later = interleave_for_kernel(repack(data, qtype, (rows, cols), order))
    if qtype in GROUP_BLOCK_TYPES:  # rows this short keep the repack (GROUP_BLOCKS_MIN_INPUTS)
        assert direct.layout == later.layout
    elif qtype in FILE_BLOCK_TYPES:  # the kernels read these blocks as the file has them
        assert direct.layout == FILE_BLOCK_TYPES[qtype] and direct.repacked().layout == later.layout
        assert torch.equal(direct.qweight, torch.from_numpy(data).reshape(rows, -1)[order])
        assert torch.equal(direct.dequantize(), later.dequantize())
        monkeypatch.setattr(gguf_repack, "FILE_BLOCK_TYPES", {})
        direct = repack(data, qtype, (rows, cols), order, interleave=True)
    assert direct.interleaved and later.interleaved
    for got, expected in [
        (direct.qweight, later.qweight),
        (direct.scales, later.scales),
        (direct.mins, later.mins),
        (direct.super_scales, later.super_scales),
    ]:
        assert (got is None) == (expected is None)
        if got is not None:
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
    assert torch.equal(direct.dequantize(), repack(data, qtype, (rows, cols), order).dequantize())


def test_k_quant_sub_scales_take_the_files_twelve_bits_a_group():
    """Every (sub-scale, sub-min) pair survives the packing, and a Q4_K weight in memory is as
    large as its blocks in the file (144 bytes a 256 weights, not 148), in both layouts."""
    values = torch.arange(64 * 64, dtype=torch.int32)
    sub_scales, sub_mins = (values // 64).reshape(64, 64), (values % 64).reshape(64, 64)
    scales, mins = pack_k_params(sub_scales, sub_mins)
    assert scales.shape == (64, 64) and mins.shape == (64, 32)
    got_scales, got_mins = unpack_k_params(scales, mins)
    assert torch.equal(got_scales.to(torch.int32), sub_scales)
    assert torch.equal(got_mins.to(torch.int32), sub_mins)
    data = random_blocks(T.Q4_K, 8, 768)
    packed = repack(data, T.Q4_K, (8, 768))
    assert packed.nbytes == data.nbytes
    assert interleave_for_kernel(packed).nbytes == data.nbytes


def test_repack_rejects_unsupported_type():
    with pytest.raises(NotImplementedError, match="IQ2_XXS"):
        repack(np.zeros((1, 66), dtype=np.uint8), T.IQ2_XXS, (1, 256))


@pytest.mark.parametrize("damage", ["cut-in-half", "not-gguf"])
def test_a_damaged_file_is_named_not_a_traceback(default_gguf, tmp_path, damage):
    from localchat import LLM
    from localchat.errors import InvalidModelFileError

    path = tmp_path / "model.gguf"
    if damage == "cut-in-half":
        data = default_gguf.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_text("hello, I am not a GGUF file\n")
    with pytest.raises(InvalidModelFileError, match=r"model\.gguf is not a readable GGUF file"):
        LLM(str(path))
