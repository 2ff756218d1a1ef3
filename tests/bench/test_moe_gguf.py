"""Random-weight mixture-of-experts GGUF files (the C5 workload's Qwen3-30B-A3B shape): llama.cpp's
tensor names, 3-D stacked experts, its Q4_K_M mix, and the expert metadata."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from localchat.bench.gguf_shapes import PRESETS, ModelShape
from localchat.bench.random_gguf import estimated_size, plan, write_random_gguf
from localchat.errors import InvalidParameterError

pytestmark = pytest.mark.usefixtures("module_cache_dir")


def test_the_c5_shape_plans_llama_cpps_q4_k_m_mix():
    shape = replace(PRESETS["qwen3-30b-a3b"], vocab_size=49152)
    types = {spec.name: qtype.name for spec, qtype in plan(shape, "q4_k_m")}
    shapes = {spec.name: spec.shape for spec, _ in plan(shape, "q4_k_m")}
    assert shapes["blk.0.ffn_gate_exps.weight"] == (128, 768, 2048)
    assert shapes["blk.0.ffn_down_exps.weight"] == (128, 2048, 768)
    assert shapes["blk.0.ffn_gate_inp.weight"] == (128, 2048)
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"  # llama.cpp never quantizes the router
    # the *_K_M rule's layers (first and last sixth of 48, every third between) get Q6_K downs
    more_bits = [i for i in range(48) if types[f"blk.{i}.ffn_down_exps.weight"] == "Q6_K"]
    assert more_bits == [*range(6), *range(8, 42, 3), *range(42, 48)]
    assert all(types[f"blk.{i}.ffn_gate_exps.weight"] == "Q4_K" for i in range(48))
    # per layer: 4 norms and the router in F32, 7 matrices (q, k, v, o, 3 expert stacks) of which
    # half the layers' v and down are Q6_K; then the embedding (Q4_K), final norm, output (Q6_K)
    assert Counter(types.values()) == {"Q4_K": 48 * 7 - 48 + 1, "Q6_K": 48 + 1, "F32": 48 * 5 + 1}
    # Qwen3-30B-A3B-Q4_K_M.gguf is 18.6 GB (its 151,936-token vocabulary is larger than ours)
    assert 16.5 < estimated_size(shape, "q4_k_m") / 2**30 < 17.5


def test_a_small_moe_file_round_trips_with_its_expert_metadata(tmp_path):
    shape = ModelShape(
        "tiny-moe",
        "qwen3moe",
        256,
        2,
        4,
        2,
        512,
        head_dim=64,
        explicit_head_dim=True,
        num_experts=8,
        num_experts_per_tok=2,
        expert_intermediate_size=256,
    )
    path = write_random_gguf(tmp_path / "moe.gguf", shape, "q4_k_m", seed=3)
    reader = GGUFReader(str(path))
    meta = {key: field.contents() for key, field in reader.fields.items()}
    assert meta["general.architecture"] == "qwen3moe"
    assert (meta["qwen3moe.expert_count"], meta["qwen3moe.expert_used_count"]) == (8, 2)
    assert meta["qwen3moe.expert_feed_forward_length"] == 256
    tensors = {t.name: t for t in reader.tensors}
    gate = tensors["blk.0.ffn_gate_exps.weight"]
    assert list(gate.shape) == [256, 256, 8]  # GGUF's order: the numpy shape reversed
    values = np.asarray(dequantize(gate.data, gate.tensor_type)).reshape(8, 256, 256)
    assert 0.014 < values.std() < 0.03  # each expert drawn like a matrix
    assert all(0.01 < values[e].std() < 0.035 for e in range(8))
    assert tensors["blk.1.ffn_down_exps.weight"].tensor_type.name == "Q6_K"
    router = tensors["blk.0.ffn_gate_inp.weight"]
    assert router.tensor_type.name == "F32" and list(router.shape) == [256, 8]


def test_experts_belong_to_the_moe_architecture():
    with pytest.raises(InvalidParameterError, match="num_experts"):
        ModelShape("x", "qwen3", 256, 2, 4, 2, 512, num_experts=8, num_experts_per_tok=2)
    with pytest.raises(InvalidParameterError, match="num_experts"):
        ModelShape("x", "qwen3moe", 256, 2, 4, 2, 512)
    with pytest.raises(InvalidParameterError, match="num_experts_per_tok"):
        ModelShape("x", "qwen3moe", 256, 2, 4, 2, 512, num_experts=8, num_experts_per_tok=9)


def test_a_loaded_moe_files_experts_stay_in_its_memory_map(tmp_path, monkeypatch):
    """Every expert's weights are read in the GGUF's own blocks, from its memory map: none is
    copied into memory (a Qwen3-30B-A3B's experts are most of its 18 GB; fusing each expert's gate
    and up once copied them all, and the load took 11 GB more and 30 times as long)."""
    from localchat import LLM
    from localchat.engine.modeling.moe import SparseMoE
    from localchat.kernels.packed_weight import FILE_BLOCKS
    from tests.kernels.cpu.test_file_blocks import _mapped_file

    monkeypatch.setenv("LOCALCHAT_CACHE_DIR", str(tmp_path / "cache"))
    shape = ModelShape(
        "tiny-moe", "qwen3moe", 256, 2, 4, 2, 512, head_dim=64, explicit_head_dim=True,
        num_experts=8, num_experts_per_tok=2, expert_intermediate_size=256,
    )  # fmt: skip
    path = write_random_gguf(tmp_path / "moe.gguf", shape, "q4_k_m", seed=3)
    model = LLM(str(path), max_model_len=128).engine.runner.model
    blocks = [m for m in model.modules() if isinstance(m, SparseMoE)]
    assert len(blocks) == 2
    parts = [
        part
        for block in blocks
        for expert in block.experts
        for weight in (expert.gate_up_weight, expert.down_weight)
        for part in (weight if isinstance(weight, tuple) else (weight,))
    ]
    assert len(parts) == 2 * 8 * 3  # gate and up stay apart: stacked, they would be a copy
    assert all(part.layout in FILE_BLOCKS for part in parts)
    assert all(_mapped_file(part.qweight.data_ptr()) == str(path) for part in parts)
