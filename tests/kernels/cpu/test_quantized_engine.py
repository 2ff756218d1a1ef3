"""The engine on quantized weights: the default GGUF stays quantized and follows the float32 path;
dense checkpoints quantize with --quantization; bad combinations are named."""

from __future__ import annotations

import json

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.errors import InvalidParameterError
from localchat.kernels.packed_weight import PackedWeight
from tests.engine.loading.test_loading import tiny_config


def test_default_model_runs_quantized_and_follows_the_float32_path(llm, float_llm):
    model = llm.engine.runner.model
    layer = model.layers[0]
    assert (
        isinstance(layer.self_attn.qkv_weight, PackedWeight)
        and layer.self_attn.qkv_weight.source_type == "Q4_1"
    )
    assert isinstance(layer.mlp.down_weight, PackedWeight) and isinstance(
        model.embed_tokens, PackedWeight
    )
    assert (
        model.embed_tokens.source_type == "Q8_0" and model.packed_head is None
    )  # the tied head stays Q8_0
    assert not any(
        p.dim() == 2 and p.shape[0] > 512 for p in model.parameters()
    )  # no dense projection left
    text = (
        "Paged attention keeps the KV cache in fixed-size blocks, so memory is never fragmented. "
        * 12
    )
    ids = llm.engine.tokenize(text)[:256]
    quantized, reference = llm.engine.prompt_logits(ids), float_llm.engine.prompt_logits(ids)
    agreement = (quantized.argmax(-1) == reference.argmax(-1)).float().mean().item()
    kl = torch.nn.functional.kl_div(
        quantized.log_softmax(-1), reference.log_softmax(-1), log_target=True, reduction="none"
    ).sum(-1)
    assert agreement >= 0.99 and kl.max().item() < 1e-3, (agreement, kl.max().item())
    # and the decode fast path (one token per step) continues the prompt as the float32 path does
    params = SamplingParams(temperature=0, max_tokens=24)
    chat = [{"role": "user", "content": "Name three rivers in Europe."}]
    assert llm.chat(chat, params)[0].token_ids == float_llm.chat(chat, params)[0].token_ids


def test_quantized_weights_keep_the_kv_cache_in_float16(llm, float_llm):
    # as llama.cpp does: half the bytes per cached token, so twice the blocks in the same budget
    runner, dense = llm.engine.runner, float_llm.engine.runner
    assert runner.kv_cache is not None and runner.kv_cache.dtype == torch.float16
    assert dense.kv_cache is not None and dense.kv_cache.dtype == torch.float32
    assert runner.bytes_per_block() * 2 == dense.bytes_per_block()
    assert llm.engine.block_manager.num_blocks == 2 * float_llm.engine.block_manager.num_blocks
    as_float = LLM(kv_cache_dtype="float32", kv_cache_memory="64MiB", max_model_len=1024)
    assert as_float.engine.runner.kv_cache.dtype == torch.float32
    # a reply long enough to read many blocks back: the float16 pool continues it as float32 does
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    chat = [{"role": "user", "content": "Explain what a paged KV cache is, step by step."}]
    assert llm.chat(chat, params)[0].token_ids == as_float.chat(chat, params)[0].token_ids


@pytest.fixture(scope="module")
def tiny_dense(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    (path / "config.json").write_text(json.dumps(tiny_config("llama-3.2-1b", rope_scaling=None)))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(path), dtype=torch.float32
    ).save_pretrained(path)
    return path


@pytest.mark.parametrize(("quantization", "tolerance"), [("int8", 0.01), ("int4", 0.15)])
def test_dense_checkpoints_quantize_weight_only(tiny_dense, quantization, tolerance):
    dense = LLM(str(tiny_dense), max_model_len=256, kv_cache_memory="16MiB")
    quantized = LLM(
        str(tiny_dense), max_model_len=256, kv_cache_memory="16MiB", quantization=quantization
    )
    weight = quantized.engine.runner.model.layers[1].mlp.gate_up_weight
    assert isinstance(weight, PackedWeight) and weight.source_type == quantization
    ids = list(range(3, 60))
    expected, got = dense.engine.prompt_logits(ids), quantized.engine.prompt_logits(ids)
    error = ((got - expected).norm() / expected.norm()).item()
    assert 0 < error < tolerance, error


def test_dummy_weights_quantize_and_generate(tmp_path):
    """Random weights quantized as they are drawn (one parameter at a time) are those weights:
    the model follows the float one drawn from the same seed, as a quantized checkpoint does."""
    config = tiny_config("qwen2.5-0.5b", hidden_size=128, intermediate_size=256)
    (tmp_path / "config.json").write_text(json.dumps(config))
    options = {"load_format": "dummy", "max_model_len": 128, "kv_cache_memory": "16MiB"}
    quantized = LLM(str(tmp_path), quantization="int4", **options)
    dense = LLM(str(tmp_path), **options)
    assert isinstance(quantized.engine.runner.model.layers[0].self_attn.qkv_weight, PackedWeight)
    ids = list(range(3, 60))
    expected, got = dense.engine.prompt_logits(ids), quantized.engine.prompt_logits(ids)
    error = ((got - expected).norm() / expected.norm()).item()
    assert 0 < error < 0.15, error  # int4's error, as for a dense checkpoint quantized above
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert len(quantized.generate([[1, 2, 3, 4]], params)[0].token_ids) == 4


def test_requantizing_a_gguf_is_refused(default_gguf):
    with pytest.raises(InvalidParameterError, match="already quantized") as info:
        LLM(str(default_gguf), quantization="int4")
    assert info.value.param == "quantization"
    with pytest.raises(InvalidParameterError, match="quantization"):
        LLM(quantization="int3")


def test_whole_layer_decode_path_equals_the_per_op_path(llm):
    """A single decode runs each layer as one C++ call; turning that off must not change a greedy
    reply (and the per-token logprobs agree to float rounding)."""
    model = llm.engine.runner.model
    assert model.cpu_decode is not None and model.cpu_decode.num_layers == len(model.layers)
    ids = llm.render_chat([{"role": "user", "content": "Describe a lighthouse at night."}])
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=0)
    fused = llm.generate([ids], params)[0]
    saved, model.cpu_decode = model.cpu_decode, None
    try:
        per_op = llm.generate([ids], params)[0]
    finally:
        model.cpu_decode = saved
    assert fused.token_ids == per_op.token_ids
    # activation codes are rounded, so a float-rounding difference can move one by a step (about
    # 1e-3 on a logprob after 30 layers); a wrong layer would be off by whole units
    for a, b in zip(fused.outputs[0].logprobs, per_op.outputs[0].logprobs, strict=True):
        assert abs(a.logprob - b.logprob) < 5e-3


BATCH_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a quiet village by the sea,",
    "List three colours:",
    "Water boils at",
    "The quick brown fox jumps over the lazy dog. Then the dog",
    "Translate to French: good morning",
    "1, 1, 2, 3, 5, 8,",
]


@pytest.mark.parametrize("size", [2, 5, 8])
def test_batched_decodes_on_the_stack_equal_the_per_op_path(llm, size):
    """A batch of 2-8 sequences decodes in one stack call per step (and its short prompts are
    prefilled there too): the greedy replies of the per-op path, logprobs to float rounding."""
    model = llm.engine.runner.model
    stack = model.cpu_decode
    prompts = [llm.engine.tokenize(text) for text in BATCH_PROMPTS[:size]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
    sizes: list[int] = []
    forward = stack.forward
    stack.forward = lambda hidden, ctx: sizes.append(hidden.shape[0]) or forward(hidden, ctx)
    try:
        fused = llm.generate(prompts, params)
    finally:
        del stack.forward
    assert sizes.count(size) >= 23  # every step after the prompts' ran the whole batch
    model.cpu_decode = None
    try:
        per_op = llm.generate(prompts, params)
    finally:
        model.cpu_decode = stack
    for a, b in zip(fused, per_op, strict=True):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert abs(x.logprob - y.logprob) < 5e-3
