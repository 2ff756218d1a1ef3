"""Every GGUF type end to end: a random-weight model in one type, loaded as users load it (the
file's blocks, or their repack, on the C++ kernels), against the float32 path on gguf-py's
dequantization of the same file (--quantization none: test_parity.py holds it against
transformers, and test_make_gguf.py holds random files against transformers reading them).

The activations take two int8 codes everywhere (LOCALCHAT_INT8_ACTIVATIONS=0), so the quantized
path follows the float one to the float16 KV cache's rounding (3-6e-4 of the largest logit), and
a code, scale or min read wrong shows."""

from __future__ import annotations

import pytest

from localchat import LLM
from localchat.bench.gguf_shapes import ModelShape
from localchat.bench.random_gguf import QUANTS, write_random_gguf
from localchat.kernels.packed_weight import PackedWeight
from tests.logits_reference import assert_follows, random_prompts

# 256 inputs: whole K-quant super-blocks, so no type falls back; ffn_down's 2048 inputs: Q4_0 to
# Q8_0 are read in the file's blocks there (GROUP_BLOCKS_MIN_INPUTS) and repacked elsewhere
SHAPE = ModelShape("tiny-llama", "llama", 256, 2, 4, 2, 2048)
TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k", "q4_k_m", "f16", "bf16"]
# the layouts the file's weights are read in (down, then the others), by type
LAYOUTS = {
    "q4_0": {"q4_0", "u4"},
    "q4_1": {"q4_1", "u4"},
    "q5_0": {"q5_0", "u8"},
    "q5_1": {"q5_1", "u8"},
    "q8_0": {"q8_0", "u8"},
    "q4_k": {"q4k"},
    "q5_k": {"q5k"},
    "q6_k": {"q6k"},
    "q4_k_m": {"q4k", "q6k"},
    "f16": set(),
    "bf16": set(),
}


@pytest.mark.parametrize("quant", TYPES)
def test_a_model_in_each_type_follows_the_float_path(quant, default_gguf, tmp_path, gemm_env):
    gemm_env(INT8_ACTIVATIONS="0")
    path = write_random_gguf(tmp_path / f"tiny-{quant}.gguf", SHAPE, quant, seed=1)
    llm = LLM(str(path), max_model_len=256, kv_cache_memory="16MiB")
    model = llm.engine.runner.model
    weights = [
        part
        for layer in model.layers
        for weight in (layer.mlp.down_weight, layer.self_attn.o_weight, layer.mlp.gate_up_weight)
        for part in (weight if isinstance(weight, tuple) else (weight,))
    ]
    layouts = {w.layout for w in weights if isinstance(w, PackedWeight)}
    assert layouts == LAYOUTS[quant], layouts
    assert {w.source_type for w in weights if isinstance(w, PackedWeight)} <= {
        QUANTS[quant][0].name,
        "Q6_K",
    }
    reference = LLM(str(path), max_model_len=256, kv_cache_memory="16MiB", quantization="none")
    assert not isinstance(reference.engine.runner.model.layers[0].mlp.down_weight, PackedWeight)
    prompts = random_prompts(2, 40, vocab=49152, seed=0)
    assert_follows(llm, reference.engine.prompt_logits, prompts, rtol=2e-3)
