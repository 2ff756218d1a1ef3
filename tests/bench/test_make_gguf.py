"""Random-weight GGUF files: every quantization type round-trips through gguf's reader with the
right types, shapes and metadata, dequantizes to sane values, and loads and generates in
localchat."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from localchat.bench.gguf_shapes import PRESETS, ModelShape, resolve_shape
from localchat.bench.random_gguf import (
    QUANTS,
    default_tokenizer,
    estimated_size,
    plan,
    write_random_gguf,
)
from localchat.errors import InvalidParameterError
from tests.logits_reference import assert_follows, random_prompts

ROOT = Path(__file__).resolve().parents[2]
# hidden 256: every row is a whole number of K-quant super-blocks, so no type falls back
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 50000.0,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
EXPECTED_TYPE = {
    "q4_k_m": "Q4_K",
    "q5_k_m": "Q5_K",
    "q4_k": "Q4_K",
    "q5_k": "Q5_K",
    "q6_k": "Q6_K",
    "q8_0": "Q8_0",
    "q4_0": "Q4_0",
    "q4_1": "Q4_1",
    "q5_0": "Q5_0",
    "q5_1": "Q5_1",
    "f16": "F16",
    "bf16": "BF16",
    "f32": "F32",
    "mxfp4": "Q8_0",  # MXFP4_MOE: experts in MXFP4, every other matrix (all of a dense model) Q8_0
}

pytestmark = pytest.mark.usefixtures("module_cache_dir")


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(TINY_CONFIG))
    return path


@pytest.fixture(scope="module")
def tokenizer_fields(default_gguf):
    return default_tokenizer()


SMALL_VOCAB = 1024


@pytest.fixture(scope="module")
def small_tokenizer(tokenizer_fields):
    """The default tokenizer's first SMALL_VOCAB tokens (and as many of its merges): the types'
    round trips read a 1,024-token vocabulary, not 49,152 tokens and their merges each time."""
    fields, _ = tokenizer_fields
    cut = [
        (key, value[:SMALL_VOCAB] if isinstance(value, list) else value, kind, item)
        for key, value, kind, item in fields
    ]
    return cut, SMALL_VOCAB


def test_the_default_tokenizer_is_written_field_for_field(tokenizer_fields, tiny_config, tmp_path):
    fields, vocab = tokenizer_fields
    path = write_random_gguf(tmp_path / "tiny.gguf", resolve_shape(str(tiny_config)), "q8_0")
    reader = GGUFReader(str(path))
    meta = {key: field.contents() for key, field in reader.fields.items()}
    for key, value, _, _ in fields:
        assert meta[key] == value, key
    assert len(meta["tokenizer.ggml.tokens"]) == meta["llama.vocab_size"] == vocab
    assert [t.shape[1] for t in reader.tensors if t.name == "token_embd.weight"] == [vocab]


def _expected_type(name: str, quant: str) -> str:
    """The mix written out by hand: for 2 layers, llama.cpp's *_K_M rule gives layer 1 (the last
    eighth) Q6_K for attn_v and ffn_down; the output is Q6_K; 1-D tensors are F32."""
    if not name.endswith(".weight") or "norm" in name:
        return "F32"
    if quant in ("q4_k_m", "q5_k_m") and (
        name == "output.weight" or name in ("blk.1.attn_v.weight", "blk.1.ffn_down.weight")
    ):
        return "Q6_K"
    return EXPECTED_TYPE[quant]


@pytest.mark.parametrize("quant", list(QUANTS))
def test_every_quantization_round_trips(quant, tiny_config, small_tokenizer, tmp_path):
    fields, vocab = small_tokenizer
    path = write_random_gguf(
        tmp_path / f"tiny-{quant}.gguf",
        resolve_shape(str(tiny_config)),
        quant,
        seed=1,
        tokenizer=small_tokenizer,
    )
    reader = GGUFReader(str(path))
    meta = {key: field.contents() for key, field in reader.fields.items()}
    assert meta["general.architecture"] == "llama" and meta["general.file_type"] == int(
        QUANTS[quant][1]
    )
    assert (
        meta["llama.block_count"],
        meta["llama.embedding_length"],
        meta["llama.feed_forward_length"],
    ) == (2, 256, 512)
    assert (meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]) == (4, 2)
    assert meta["llama.context_length"] == 1024 and meta["llama.rope.freq_base"] == 50000.0
    assert meta["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert meta["llama.vocab_size"] == vocab and meta["llama.rope.dimension_count"] == 64
    for key, value, _, _ in fields:  # the tokenizer given, field for field
        assert meta[key] == value, key
    assert len(meta["tokenizer.ggml.tokens"]) == vocab
    tensors = {t.name: t for t in reader.tensors}
    expected_shapes = {
        "token_embd.weight": [256, vocab],
        "output.weight": [256, vocab],
        "blk.0.attn_q.weight": [256, 256],
        "blk.0.attn_k.weight": [256, 128],
        "blk.1.ffn_down.weight": [512, 256],
        "blk.1.ffn_up.weight": [256, 512],
        "output_norm.weight": [256],
    }
    for name, shape in expected_shapes.items():  # GGUF shapes: the numpy shape reversed
        assert list(tensors[name].shape) == shape, name
    assert len(tensors) == 1 + 2 * 9 + 2
    for name, tensor in tensors.items():
        assert tensor.tensor_type.name == _expected_type(name, quant), name
        values = np.asarray(dequantize(tensor.data, tensor.tensor_type))
        assert np.isfinite(values).all(), name
        if "norm" in name:
            assert (values == 1.0).all(), name
        else:
            assert 0.014 < values.std() < 0.03 and abs(values.mean()) < 0.004, (
                name,
                values.std(),
                values.mean(),
            )


def test_the_8b_q4_k_m_mix_matches_llama_cpp():
    """llama.cpp's quantize, on Llama-3.1-8B at Q4_K_M, logs 193 q4_K and 33 q6_K tensors, and 65
    f32 ones besides rope_freqs (which these files leave out)."""
    shape = replace(PRESETS["llama-8b"], vocab_size=49152)
    types = {spec.name: qtype.name for spec, qtype in plan(shape, "q4_k_m")}
    assert Counter(types.values()) == {"Q4_K": 193, "Q6_K": 33, "F32": 65}
    more_bits = [i for i in range(32) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"]
    assert more_bits == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert more_bits == [i for i in range(32) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"]
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert 4.0 < estimated_size(shape, "q4_k_m") / 2**30 < 4.4


def test_k_quants_fall_back_like_llama_cpp_on_odd_rows():
    """SmolLM2's rows of 576 are not whole 256-wide super-blocks: Q4_K -> Q5_0, Q6_K -> Q8_0; the
    tied embedding is the output, so it gets the output's type."""
    shape = replace(PRESETS["smollm2-135m"], vocab_size=49152)
    types = {spec.name: qtype.name for spec, qtype in plan(shape, "q4_k_m")}
    assert types["blk.0.attn_q.weight"] == "Q5_0" and types["token_embd.weight"] == "Q8_0"
    assert "output.weight" not in types
    assert types["blk.0.ffn_down.weight"] == "Q6_K"  # its rows are 1536 = 6 super-blocks
    assert types["blk.4.ffn_down.weight"] == "Q4_K"


def test_qwen_shapes_carry_their_extra_tensors(tmp_path):
    qwen2 = ModelShape(
        "q2", "qwen2", 896, 2, 14, 2, 4864, tie_word_embeddings=True, vocab_size=49152
    )
    names = {spec.name: qtype.name for spec, qtype in plan(qwen2, "q8_0")}
    assert names["blk.0.attn_q.bias"] == names["blk.0.attn_v.bias"] == "F32"
    config = {**TINY_CONFIG, "architectures": ["Qwen3ForCausalLM"], "head_dim": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    qwen3 = replace(resolve_shape(str(tmp_path)), vocab_size=49152)
    assert (qwen3.arch, qwen3.dim_per_head, qwen3.explicit_head_dim) == ("qwen3", 128, True)
    specs = {spec.name: spec.shape for spec, _ in plan(qwen3, "q8_0")}
    assert specs["blk.0.attn_q_norm.weight"] == (128,) and specs["blk.0.attn_q.weight"] == (
        512,
        256,
    )
    with pytest.raises(InvalidParameterError):
        resolve_shape("no-such-preset")
    with pytest.raises(InvalidParameterError):
        plan(qwen3, "q3_k")


@pytest.mark.parametrize(("arch", "quant"), [("llama", "q4_k_m"), ("qwen3", "q8_0")])
def test_the_file_loads_and_generates_in_localchat(arch, quant, tmp_path, default_gguf):
    """It loads in localchat and in transformers, and the two agree: prompt logits, and greedy
    tokens with their log-probabilities (the file's weights, read the same way by both)."""
    import torch
    from transformers import AutoModelForCausalLM

    from localchat import LLM
    from localchat.bench.gguf_parsing import shared_gguf_parsing

    # qwen3: head_dim != hidden / heads, as in Qwen3 itself
    head_dim = 128 if arch == "qwen3" else None
    shape = ModelShape(
        f"tiny-{arch}",
        arch,
        256,
        2,
        4,
        2,
        512,
        head_dim=head_dim,
        explicit_head_dim=head_dim is not None,
    )
    path = write_random_gguf(tmp_path / f"{arch}.gguf", shape, quant)
    if head_dim:
        assert GGUFReader(str(path)).fields["qwen3.attention.key_length"].contents() == 128
    llm = LLM(str(path), max_model_len=256, kv_cache_memory="64MiB")
    # the file as transformers reads it (gguf-py's dequantization, its own Q/K un-permutation)
    with shared_gguf_parsing():
        hf = AutoModelForCausalLM.from_pretrained(
            str(tmp_path), gguf_file=path.name, dtype=torch.float32
        ).eval()

    def reference(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0]

    prompts = [llm.engine.tokenize("Hello"), *random_prompts(1, 30, vocab=hf.config.vocab_size)]
    assert_follows(llm, reference, prompts, rtol=2e-3, max_tokens=6)


def test_the_script(tiny_config, tmp_path, default_gguf):
    out = tmp_path / "cli.gguf"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/make_gguf.py"),
            str(tiny_config),
            str(out),
            "--quant",
            "q4_0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert {t.tensor_type.name for t in GGUFReader(str(out)).tensors} == {"Q4_0", "F32"}
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/make_gguf.py"), "llama-9z", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert bad.returncode == 2 and "error:" in bad.stderr and "Traceback" not in bad.stderr
