"""Weights read in the GGUF file's own blocks: Q6_K projections (PackedWeight layout q6k,
kernels/csrc/quant_q6k.h), where every kernel path gives the bits of the same weight repacked as
u6 and the reference reads the blocks as gguf-py does, and an untied embedding (GgufRows). A loaded
model reads both from the file's memory map, with the replies and logprobs of a load that repacks
them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize

from localchat import LLM, SamplingParams
from localchat.bench.gguf_shapes import ModelShape
from localchat.bench.random_gguf import write_random_gguf
from localchat.engine import gguf_checkpoint, gguf_repack
from localchat.engine.distributed.sharded_weights import take_columns, take_rows
from localchat.engine.gguf_repack import q6k_weight, repack, repack_reference
from localchat.engine.gguf_rows import GgufRows
from localchat.engine.models.decoder import PROJECTIONS
from localchat.errors import InvalidParameterError
from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import (
    embedding_rows,
    fuse,
    interleave_for_kernel,
    quant_linear,
)
from tests.cpu.test_cpu_quant_linear import run
from tests.cpu.test_gguf_repack import random_blocks

pytestmark = pytest.mark.usefixtures("each_isa")  # native and AVX2 kernels (conftest.py)

# rows: whole passes of four, a short last pass, fewer than a pass; 1 to 16 blocks a row (4096
# inputs: the bf16 GEMM path's size)
SHAPES = [(42, 512), (3, 256), (9, 1536), (12, 4096)]


def pair(rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, PackedWeight, PackedWeight]:
    """Random Q6_K blocks, and the weight as q6k and as (row-major) u6."""
    raw = random_blocks(T.Q6_K, rows, cols, seed=seed)
    blocks = torch.from_numpy(raw)
    return raw, q6k_weight(blocks), repack_reference(blocks, T.Q6_K, rows)


def interleaved_u6(u6: PackedWeight) -> PackedWeight:
    """A copy of u6 in the kernels' interleaved layout (interleave_for_kernel works in place)."""
    copy = dataclasses.replace(u6, qweight=u6.qweight.clone(), scales=u6.scales.clone())
    return interleave_for_kernel(copy)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_reference_reads_the_blocks_as_gguf_py(shape):
    raw, q, u6 = pair(*shape)
    assert q.shape == u6.shape == shape and q.bits == 6 and q.arrangement == 2
    expected = torch.from_numpy(np.asarray(gguf_dequantize(raw, T.Q6_K), dtype=np.float32))
    # each group's scale d * sub-scale is rounded to float16 (below 2^-11 relative)
    torch.testing.assert_close(q.dequantize(), expected.reshape(shape), rtol=1e-3, atol=1e-7)
    assert torch.equal(q.codes(), u6.codes())
    assert torch.equal(q.group_params()[0], u6.group_params()[0]) and q.group_params()[1] is None
    ids = torch.tensor([[shape[0] - 1, 0]])
    assert torch.equal(q.dequantize(ids), u6.dequantize(ids))


@pytest.mark.parametrize("shape", SHAPES)
def test_every_kernel_path_gives_the_u6_bits(ext, shape):
    _, q, u6 = pair(*shape, seed=shape[0])
    inter = interleaved_u6(u6)
    generator = torch.Generator().manual_seed(7)
    for batch in (1, 3, 40, 70):  # a decode, a small batch, panels, the bf16 GEMM from 64 rows
        x = torch.randn(batch, shape[1], generator=generator)
        for precise in (True, False):
            expected = run(ext, x, u6, precise=precise)
            assert torch.equal(run(ext, x, q, precise=precise), expected), (batch, precise)
            assert torch.equal(run(ext, x, inter, precise=precise), expected), (batch, precise)
        assert torch.equal(quant_linear(x, q), quant_linear(x, u6)), batch
    args = (q.qweight, q.scales, None, None, 6, 16, 32, q.arrangement)
    assert torch.equal(ext.dequantize(*args), u6.dequantize())
    ids = torch.tensor([[shape[0] - 1, 0, 1], [shape[0] // 2, 2, 0]])
    assert torch.equal(embedding_rows(q, ids, torch.float32), u6.dequantize(ids))
    assert torch.equal(embedding_rows(q, ids[0], torch.bfloat16), u6.dequantize(ids[0]).bfloat16())


def test_only_the_vector_kernels_read_blocks(ext):
    _, q, _ = pair(8, 256)
    with pytest.raises(RuntimeError, match="vector kernels"):
        run(ext, torch.randn(1, 256), q, precise=True, vnni=False)
    with pytest.raises(ValueError, match="q6k weights"):
        dataclasses.replace(q, scales=torch.empty(8, 16, dtype=torch.float16))


def test_moves_cuts_and_fusing_keep_the_values():
    _, q, u6 = pair(10, 512)
    moved = q.to("meta")  # leaving the CPU: a byte a code, as u6 leaves it
    assert moved.layout == "u8" and moved.qweight.shape == (10, 512)
    assert torch.equal(q.with_byte_codes().dequantize(), u6.dequantize())
    assert torch.equal(q.as_u6().qweight, u6.qweight) and u6.as_u6() is u6
    rows = torch.tensor([1, 4, 9])
    picked = take_rows(q, rows)
    assert isinstance(picked, PackedWeight) and picked.layout == "q6k"
    assert torch.equal(picked.dequantize(), u6.dequantize()[rows])
    cut = take_columns(q, 256, 512)
    assert isinstance(cut, PackedWeight)
    assert torch.equal(cut.dequantize(), u6.dequantize()[:, 256:])
    _, q2, u62 = pair(6, 512, seed=3)
    fused = fuse([q, q2])
    assert isinstance(fused, PackedWeight) and fused.layout == "q6k"
    assert torch.equal(fused.dequantize(), torch.cat((u6.dequantize(), u62.dequantize())))


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
def test_a_loaded_model_reads_q6k_and_its_embedding_from_the_file_map(ext, tmp_path, monkeypatch):
    """Q6_K projections and the untied embedding stay in the file's memory map, and the model
    answers with the tokens and logprobs of a load that repacks them."""
    shape = ModelShape("tiny-llama", "llama", 256, 4, 4, 2, 512)
    path = tmp_path / "tiny-q4_k_m.gguf"
    write_random_gguf(path, shape, "q4_k_m", std=0.05)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    llm = LLM(str(path), max_model_len=256)
    model = llm.engine.runner.model
    weights = [model.lm_head] + [
        getattr(getattr(layer, module), name)
        for layer in model.layers
        for module, name in PROJECTIONS
    ]
    parts = [p for w in weights for p in (w if isinstance(w, tuple) else (w,))]
    q6k = [p for p in parts if isinstance(p, PackedWeight) and p.layout == "q6k"]
    assert q6k, "a Q4_K_M file stores some v and down projections as Q6_K"
    assert all(_mapped_file(w.qweight.data_ptr()) == str(path) for w in q6k)
    assert isinstance(model.embed_tokens, GgufRows)
    assert _mapped_file(model.embed_tokens.blocks.ctypes.data) == str(path)
    prompt = list(range(100, 130))
    ours = llm.generate([prompt], params)[0].outputs[0]
    real = gguf_repack.q6k_weight
    monkeypatch.setattr(
        gguf_repack, "q6k_weight", lambda blocks: interleaved_u6(real(blocks).as_u6())
    )

    class Repacked(GgufRows):  # what gguf_weights made before: the embedding repacked
        def __new__(cls, raw, qtype, shape):
            return repack(raw, qtype, shape, None, True)

    monkeypatch.setattr(gguf_checkpoint, "GgufRows", Repacked)
    repacked = LLM(str(path), max_model_len=256)
    assert isinstance(repacked.engine.runner.model.embed_tokens, PackedWeight)
    theirs = repacked.generate([prompt], params)[0].outputs[0]
    assert theirs.token_ids == ours.token_ids and theirs.logprobs == ours.logprobs
