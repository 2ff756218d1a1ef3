"""Weights read in the GGUF file's own blocks: Q6_K, Q4_K, Q5_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and
MXFP4 projections (PackedWeight layouts q6k, q4k, q5k, q8_0, q4_0, q4_1, q5_0, q5_1 and mxfp4; each
ISA's kernels in kernels/csrc/quant/arch/, the generic ones in quant/generic/), where every
kernel path gives the bits of the same weight repacked (as u6, u4 or u8; the 5-bit types' integer
products, and MXFP4's, read as u4's, differ from the u8 repack's in float rounding only) and the
reference reads the blocks as gguf-py does, and an untied embedding (GgufRows). A loaded model
reads them all from the file's memory map, with the replies and logprobs of a load that repacks
them."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize

from localchat import LLM, SamplingParams
from localchat.bench.gguf_shapes import ModelShape
from localchat.bench.random_gguf import write_random_gguf
from localchat.engine.distributed.sharded_weights import take_columns, take_rows
from localchat.engine.loading import gguf_checkpoint, gguf_repack
from localchat.engine.loading.gguf_repack import (
    GROUP_BLOCK_TYPES,
    file_blocks_weight,
    repack,
    repack_reference,
)
from localchat.engine.loading.gguf_rows import GgufRows
from localchat.engine.modeling.decoder import PROJECTIONS
from localchat.errors import InvalidParameterError
from localchat.kernels import cpu_extension
from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import (
    embedding_rows,
    fuse,
    interleave_for_kernel,
    quant_linear,
)
from tests.kernels.cpu.test_cpu_quant_linear import run
from tests.kernels.cpu.test_gguf_repack import random_blocks

pytestmark = pytest.mark.usefixtures("each_isa")  # each build of the kernels (conftest.py)
GENERIC_KERNELS = True  # the generic build too (conftest.py)

# rows: whole passes of four, a short last pass, fewer than a pass; 1 to 16 blocks a row, odd
# counts among them (4096 inputs: the bf16 GEMM path's size)
SHAPES = [(42, 512), (3, 256), (9, 1280), (12, 4096)]
TYPES = [T.Q6_K, T.Q4_K, T.Q5_K, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.MXFP4]
# read as u4 with a fifth bit added in registers (MXFP4: with its codes looked up), where their
# repack is u8: the same integer products, summed in other lanes (float rounding apart, the same
# results)
FIVE_BITS = (T.Q5_K, T.Q5_0, T.Q5_1, T.MXFP4)
# layout, bits, arrangement
BLOCKS = {
    T.Q6_K: ("q6k", 6, 2),
    T.Q4_K: ("q4k", 4, 3),
    T.Q5_K: ("q5k", 5, 4),
    T.Q8_0: ("q8_0", 8, 5),
    T.Q4_0: ("q4_0", 4, 6),
    T.Q4_1: ("q4_1", 4, 7),
    T.Q5_0: ("q5_0", 5, 8),
    T.Q5_1: ("q5_1", 5, 9),
    T.MXFP4: ("mxfp4", 5, 10),
}
BLOCK_LAYOUTS = ("q6k", "q4k", "q5k", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4")
# Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 rows are whole 32-weight blocks: an odd count of them (a short
# last chunk of one, two or three groups) and a short last block of 16 groups
GROUP_SHAPES = [(7, 800), (5, 352), (6, 576)]


def shapes_of(qtype: T) -> list[tuple[int, int]]:
    return SHAPES + (GROUP_SHAPES if qtype in GROUP_BLOCK_TYPES else [])


CASES = [(qtype, shape) for qtype in TYPES for shape in shapes_of(qtype)]


def pair(
    qtype: T, rows: int, cols: int, seed: int = 0
) -> tuple[np.ndarray, PackedWeight, PackedWeight]:
    """Random blocks, and the weight in them and repacked (row-major u6 or u4)."""
    raw = random_blocks(qtype, rows, cols, seed=seed)
    blocks = torch.from_numpy(raw)
    return raw, file_blocks_weight(blocks, qtype), repack_reference(blocks, qtype, rows)


def interleaved_copy(weight: PackedWeight) -> PackedWeight:
    """A copy of a repacked weight in the kernels' interleaved layout (interleave_for_kernel works
    in place)."""
    copy = dataclasses.replace(
        weight,
        qweight=weight.qweight.clone(),
        scales=weight.scales.clone(),
        mins=None if weight.mins is None else weight.mins.clone(),
        super_scales=None if weight.super_scales is None else weight.super_scales.clone(),
    )
    return interleave_for_kernel(copy)


@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=str)
def test_the_reference_reads_the_blocks_as_gguf_py(qtype, shape):
    raw, q, repacked = pair(qtype, *shape)
    layout, bits, arrangement = BLOCKS[qtype]
    assert (q.layout, q.bits, q.arrangement) == (layout, bits, arrangement)
    assert q.shape == repacked.shape == shape
    expected = torch.from_numpy(np.asarray(gguf_dequantize(raw, qtype), dtype=np.float32))
    # Q6_K's group scales d * sub-scale are rounded to float16 (below 2^-11 relative); the
    # others' differ from gguf-py's only in float32 rounding
    rtol = 1e-3 if qtype == T.Q6_K else 1e-6
    torch.testing.assert_close(q.dequantize(), expected.reshape(shape), rtol=rtol, atol=1e-7)
    assert torch.equal(q.codes(), repacked.codes())
    for ours, theirs in zip(q.group_params(), repacked.group_params(), strict=True):
        assert (ours is None and theirs is None) or torch.equal(ours, theirs)
    ids = torch.tensor([[shape[0] - 1, 0]])
    assert torch.equal(q.dequantize(ids), repacked.dequantize(ids))


@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=str)
def test_every_kernel_path_gives_the_repacked_bits(ext, qtype, shape):
    _, q, repacked = pair(qtype, *shape, seed=shape[0])
    inter = interleaved_copy(repacked)
    generator = torch.Generator().manual_seed(7)
    for batch in (1, 3, 40, 70):  # a decode, a small batch, panels, the bf16 GEMM from 64 rows
        x = torch.randn(batch, shape[1], generator=generator)
        for precise in (True, False):
            expected = run(ext, x, repacked, precise=precise)
            got = run(ext, x, q, precise=precise)
            assert torch.equal(run(ext, x, inter, precise=precise), expected), (batch, precise)
            if qtype not in FIVE_BITS:
                assert torch.equal(got, expected), (batch, precise)
                continue
            # u8 sums a group's products in other lanes than the kernels for 5-bit blocks do,
            # whose decode and panels agree with each other bit for bit
            scale = expected.abs().max().item()
            torch.testing.assert_close(got, expected, rtol=0, atol=2e-6 * scale)
            assert torch.equal(run(ext, x[-1:], q, precise=precise), got[-1:]), (batch, precise)
        ours, theirs = quant_linear(x, q), quant_linear(x, repacked)
        if qtype in FIVE_BITS:  # (the bf16 GEMM's products are equal: their weights are)
            torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-6 * theirs.abs().max().item())
        else:
            assert torch.equal(ours, theirs), batch
    args = (q.qweight, q.scales, None, None, q.bits, q.group_size, q.zero_point, q.arrangement)
    assert torch.equal(ext.dequantize(*args), repacked.dequantize())
    ids = torch.tensor([[shape[0] - 1, 0, 1], [shape[0] // 2, 2, 0]])
    assert torch.equal(embedding_rows(q, ids, torch.float32), repacked.dequantize(ids))
    assert torch.equal(
        embedding_rows(q, ids[0], torch.bfloat16), repacked.dequantize(ids[0]).bfloat16()
    )


@pytest.mark.slow  # it makes its own build (about a minute)
@pytest.mark.parametrize("each_isa", ["native"], indirect=True)
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1], ids=lambda t: t.name)
def test_q4_blocks_without_vbmi_give_the_repacked_bits(ext, qtype, monkeypatch):
    """The AVX-512 VNNI kernels for Q4_0 and Q4_1 blocks take their bytes apart with VBMI's byte
    permutes where the CPU has them; the build without them (older AVX-512 servers) gathers the
    scales and loads the codes 16 bytes at a time, with the same bits. (Only on the native build:
    the AVX2 one has neither path.)"""
    has_vbmi = "avx512vbmi" in cpu_extension._cpu_signature().split()  # (the /proc/cpuinfo flags)
    if ext.simd_isa() != "avx512-vnni" or not has_vbmi:
        pytest.skip(
            "needs AVX-512 VNNI with VBMI: without them the native build already is the build "
            "without VBMI's permutes, which the other tests run"
        )
    module = _no_vbmi_build()
    assert module.simd_isa() == "avx512-vnni"
    monkeypatch.setattr(cpu_extension, "_module", module)
    monkeypatch.setenv("LOCALCHAT_CPU_BLOCK_CACHE_MB", "0")
    generator = torch.Generator().manual_seed(3)
    for shape in [*GROUP_SHAPES, (12, 4096)]:
        _, q, repacked = pair(qtype, *shape, seed=shape[0])
        for batch in (1, 3, 70):
            x = torch.randn(batch, shape[1], generator=generator)
            for precise in (True, False):
                expected = run(module, x, repacked, precise=precise)
                assert torch.equal(run(module, x, q, precise=precise), expected), (shape, batch)


@functools.cache
def _no_vbmi_build():
    return cpu_extension.build_kernels(("-mno-avx512vbmi",))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K], ids=lambda t: t.name)
def test_k_blocks_are_exact_on_representable_values(ext, qtype):
    """With d = dmin = 2^-8, small power-of-two sub-scales and small sub-mins, and integer
    activations whose 32-blocks peak at 127 (quantized to themselves), every product and sum is
    exact in float32: the decode and the panels must give the float64 result exactly, so a code,
    lane or group taken from the wrong place cannot hide."""
    rows, cols = 12, 512
    raw = random_blocks(qtype, rows, cols, seed=4)
    blocks = raw.reshape(-1, raw.shape[1] // (cols // 256))
    rng = np.random.default_rng(4)
    blocks[:, 0:4] = np.array([2**-8, 2**-8], dtype=np.float16).view(np.uint8)
    sub = 1 << rng.integers(0, 3, size=(blocks.shape[0], 8))
    sub_min = rng.integers(0, 4, size=(blocks.shape[0], 8))
    blocks[:, 4:8] = sub[:, :4]
    blocks[:, 8:12] = sub_min[:, :4]
    blocks[:, 12:16] = sub[:, 4:] | (sub_min[:, 4:] << 4)
    assert_exact(ext, file_blocks_weight(torch.from_numpy(raw), qtype), seed=5)


def assert_exact(ext, q: PackedWeight, seed: int) -> None:
    """The decode and the panels give x @ W.T exactly, for integer activations whose 32-blocks
    peak at 127 (quantized to themselves) and a weight whose products and sums are exact in
    float32."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-127, 128, (5, q.in_features), generator=generator).float()
    x[:, ::32] = 127.0
    expected = (x.double() @ q.dequantize().double().T).float()
    for batch in (1, 5):  # the GEMV and the panel kernel
        for precise in (False, True):
            assert torch.equal(run(ext, x[:batch], q, precise=precise), expected[:batch])


@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_q5_blocks_are_exact_on_representable_values(ext, qtype):
    """With d = 2^-8, a min of a small multiple of 2^-8 (Q5_1), and integer activations whose
    32-blocks peak at 127 (quantized to themselves), every product and sum is exact in float32:
    the decode and the panels must give the float64 result exactly, so a fifth bit taken from the
    wrong place cannot hide (the tests above compare with the u8 repack within float rounding)."""
    rows, cols = 12, 1024
    raw = random_blocks(qtype, rows, cols, seed=6)
    blocks = raw.reshape(rows * cols // 32, -1)
    blocks[:, 0:2] = np.array([2**-8], dtype=np.float16).view(np.uint8)
    if qtype == T.Q5_1:
        mins = np.random.default_rng(6).integers(-8, 8, size=blocks.shape[0]) * 2.0**-8
        blocks[:, 2:4] = mins.astype(np.float16).view(np.uint8).reshape(-1, 2)
    assert_exact(ext, file_blocks_weight(torch.from_numpy(raw), qtype), seed=6)


def test_mxfp4_blocks_are_exact_on_representable_values(ext):
    """With 2^-8 scales (E8M0 byte 120) and integer activations whose 32-blocks peak at 127
    (quantized to themselves), every product and sum is exact in float32: the decode and the
    panels must give the float64 result of gguf-py's values exactly, so a code read with a wrong
    value or sign, or a scale with a wrong exponent, cannot hide."""
    rows, cols = 12, 1024
    raw = random_blocks(T.MXFP4, rows, cols, seed=8)
    raw.reshape(rows * cols // 32, -1)[:, 0] = 120
    q = file_blocks_weight(torch.from_numpy(raw), T.MXFP4)
    values = np.asarray(gguf_dequantize(raw, T.MXFP4), dtype=np.float32).reshape(rows, cols)
    assert torch.equal(q.dequantize(), torch.from_numpy(values))
    assert_exact(ext, q, seed=8)


@pytest.mark.parametrize("qtype", GROUP_BLOCK_TYPES, ids=lambda t: t.name)
def test_group_blocks_from_2048_inputs_stay_in_their_blocks(ext, qtype):
    """Short Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and MXFP4 rows (a small model's) keep the repack; long
    ones are read in the blocks."""
    repacked_layout = "u4" if qtype in (T.Q4_0, T.Q4_1) else "u8"
    for cols, layout in ((512, repacked_layout), (2048, BLOCKS[qtype][0])):
        raw = random_blocks(qtype, 4, cols, seed=1)
        weight = repack(raw, qtype, (4, cols), None, True)
        assert weight.layout == layout
        assert torch.equal(
            weight.dequantize(), repack_reference(torch.from_numpy(raw), qtype, 4).dequantize()
        )


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_the_generic_kernels_read_blocks_as_the_repack(ext, qtype):
    """The generic kernels (use_simd=False; what runs where an ISA has no kernel for a layout) read
    every type's blocks, and give the repacked weight's bits: both become the same codes, scales and
    mins before the same arithmetic."""
    _, q, repacked = pair(qtype, 8, 512)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(9))
    for precise in (True, False):
        for rows in (x, x[:1]):
            got = run(ext, rows, q, precise=precise, vnni=False)
            assert torch.equal(got, run(ext, rows, repacked, precise=precise, vnni=False))
            assert torch.equal(
                got, run(ext, rows, interleaved_copy(repacked), precise=precise, vnni=False)
            )
    with pytest.raises(ValueError, match=f"{q.layout} weights"):
        dataclasses.replace(q, scales=torch.empty(8, 16, dtype=torch.float16))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_moves_cuts_and_fusing_keep_the_values(qtype):
    _, q, repacked = pair(qtype, 10, 512)
    dense = repacked.dequantize()
    moved = q.to("meta")  # leaving the CPU: float16 scales, u6's codes a byte each
    four_bits = qtype in (T.Q4_K, T.Q4_0, T.Q4_1)
    assert moved.layout == ("u4" if four_bits else "u8") and moved.super_scales is None
    assert moved.qweight.shape == repacked.row_major().qweight.shape[:1] + moved.qweight.shape[1:]
    assert torch.equal(q.with_byte_codes().dequantize(), dense)
    assert torch.equal(q.repacked().qweight, repacked.qweight) and repacked.repacked() is repacked
    rows = torch.tensor([1, 4, 9])
    picked = take_rows(q, rows)
    assert isinstance(picked, PackedWeight) and picked.layout == q.layout
    assert torch.equal(picked.dequantize(), dense[rows])
    cut = take_columns(q, 256, 512)
    assert isinstance(cut, PackedWeight)
    assert torch.equal(cut.dequantize(), dense[:, 256:])
    _, q2, repacked2 = pair(qtype, 6, 512, seed=3)
    fused = fuse([q, q2])  # the file's blocks stay apart, read in place (never stacked: a copy)
    assert isinstance(fused, tuple) and fused[0] is q and fused[1] is q2
    stacked = fuse([repacked, repacked2])
    assert isinstance(stacked, PackedWeight) and stacked.layout == repacked.layout
    assert torch.equal(stacked.dequantize(), torch.cat((dense, repacked2.dequantize())))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_0], ids=lambda t: t.name)
def test_gguf_rows_read_what_the_repacked_weight_reads(qtype):
    raw = random_blocks(qtype, 37, 512, seed=9)
    rows = GgufRows(raw, qtype, (37, 512))
    ids = torch.tensor([[36, 0, 5], [5, 17, 1]])
    packed = interleave_for_kernel(repack(raw, qtype, (37, 512)))
    assert torch.equal(rows.rows(ids, torch.float32), embedding_rows(packed, ids, torch.float32))
    assert torch.equal(rows.dequantize(), packed.dequantize())
    assert (
        rows.rows(ids[0], torch.bfloat16).dtype == torch.bfloat16 and rows.source_type == qtype.name
    )
    with pytest.raises(InvalidParameterError, match="token ids"):
        rows.rows(torch.tensor([37]), torch.float32)


def _mapped_file(address: int) -> str | None:
    """The file behind the mapping of this process that holds `address`, if any."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(a, 16) for a in fields[0].split("-"))
            if start <= address < end:
                return fields[5] if len(fields) > 5 else None
    return None


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["q4_k_m", "q5_k_m", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_a_loaded_model_reads_blocks_and_its_embedding_from_the_file_map(
    ext, tmp_path, monkeypatch, quant, each_isa
):
    """Q6_K, Q4_K, Q5_K, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 projections and the untied embedding
    stay in the file's memory map, and the model answers with the tokens and logprobs of a load
    that repacks them (the 5-bit types' within float rounding: the u8 repack sums their products
    in other lanes)."""
    if each_isa != "native" and quant not in ("q4_k_m", "q4_0"):
        # every type's kernels are compared on each build above; a whole model per build for a
        # k-quant and a legacy type is enough to show a build's engine reads the file's blocks
        pytest.skip("the other builds load one k-quant and one legacy file")
    monkeypatch.setattr(gguf_repack, "GROUP_BLOCKS_MIN_INPUTS", 256)  # (the tiny model's rows)
    shape = ModelShape("tiny-llama", "llama", 256, 4, 4, 2, 512)
    path = tmp_path / f"tiny-{quant}.gguf"
    write_random_gguf(path, shape, quant, std=0.05)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    llm = LLM(str(path), max_model_len=256)
    model = llm.engine.runner.model
    weights = [model.lm_head] + [
        getattr(getattr(layer, module), name)
        for layer in model.layers
        for module, name in PROJECTIONS
    ]
    parts = [p for w in weights for p in (w if isinstance(w, tuple) else (w,))]
    for layout in {"q4_k_m": ("q6k", "q4k"), "q5_k_m": ("q6k", "q5k")}.get(quant, (quant,)):
        assert any(isinstance(p, PackedWeight) and p.layout == layout for p in parts), layout
    # o_proj is neither fused with another projection nor reordered (as q and k are): a view
    outputs = [layer.self_attn.o_weight for layer in model.layers]
    assert all(w.layout in BLOCK_LAYOUTS for w in outputs)
    assert all(_mapped_file(w.qweight.data_ptr()) == str(path) for w in outputs)
    assert isinstance(model.embed_tokens, GgufRows)
    assert _mapped_file(model.embed_tokens.blocks.ctypes.data) == str(path)
    prompt = list(range(100, 130))
    ours = llm.generate([prompt], params)[0].outputs[0]
    real = gguf_repack.file_blocks_weight
    monkeypatch.setattr(
        gguf_repack,
        "file_blocks_weight",
        lambda blocks, qtype: interleaved_copy(real(blocks, qtype).repacked()),
    )

    class Repacked(GgufRows):  # what gguf_weights made before: the embedding repacked
        def __new__(cls, raw, qtype, shape):
            return repack(raw, qtype, shape, None, True)

    monkeypatch.setattr(gguf_checkpoint, "GgufRows", Repacked)
    repacked = LLM(str(path), max_model_len=256)
    assert isinstance(repacked.engine.runner.model.embed_tokens, PackedWeight)
    assert all(
        not isinstance(w, PackedWeight) or w.layout not in BLOCK_LAYOUTS
        for layer in repacked.engine.runner.model.layers
        for w in (layer.self_attn.o_weight, layer.mlp.down_weight)
    )
    theirs = repacked.generate([prompt], params)[0].outputs[0]
    assert theirs.token_ids == ours.token_ids
    if quant not in ("q5_k_m", "q5_0", "q5_1"):
        assert theirs.logprobs == ours.logprobs
        return
    for mine, other in zip(ours.logprobs, theirs.logprobs, strict=True):
        assert mine.logprob == pytest.approx(other.logprob, abs=1e-3)
