"""The whole-layer C++ decode path (engine/modeling/cpu_decode.py) on the shapes that used to fall
back to per-op layers: a Q4_K_M file whose q/k (Q4_K) and v (Q6_K) cannot be fused into one
PackedWeight, and Qwen3's per-head q/k norms. Each must give the per-op path's reply and
logprobs."""

from __future__ import annotations

import pytest

from localchat import LLM, SamplingParams
from tests.kernels.cpu.stack_batches import SHAPES, random_llm

# native and AVX2 kernels (conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("each_isa")]
GENERIC_KERNELS = True  # the generic build too (conftest.py)

# (shape, KV pool dtype): a GGUF file's pool is float16 unless asked otherwise
CASES = [(name, "auto") for name in sorted(SHAPES)] + [
    ("llama-q4_k_m", "float32"),
    ("llama-q4_k_m", "bfloat16"),
    ("llama-q4_k_m", "q8_0"),  # int8 codes and a scale per 32 values (kernels/kv_quant.py)
    ("qwen3-q4_k_m", "q8_0"),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: "-".join(case))
def mixed_llm(request, tmp_path_factory):
    return random_llm(tmp_path_factory.mktemp("mixed"), *request.param)


def _run(llm: LLM, fused: bool):
    model = llm.engine.runner.model
    saved = model.cpu_decode
    if not fused:
        model.cpu_decode = None
    try:
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=0)
        return llm.generate([list(range(100, 140))], params)[0]
    finally:
        model.cpu_decode = saved


def test_mixed_types_and_qk_norms_run_the_whole_layer_path(mixed_llm):
    model = mixed_llm.engine.runner.model
    assert model.cpu_decode is not None and model.cpu_decode.num_layers == len(model.layers)
    kinds = [layer.self_attn.qkv_weight for layer in model.layers]
    assert any(isinstance(w, tuple) for w in kinds), "the file should mix Q4_K and Q6_K in some qkv"
    fused, per_op = _run(mixed_llm, True), _run(mixed_llm, False)
    assert fused.token_ids == per_op.token_ids
    # activations are rounded to int8 codes, so a rounding-level difference between the two paths
    # can move a code by one step: the logprobs agree to about 1e-3, where a wrong layer would be
    # off by whole units
    for a, b in zip(fused.outputs[0].logprobs, per_op.outputs[0].logprobs, strict=True):
        assert abs(a.logprob - b.logprob) < 5e-3


@pytest.mark.parametrize("threads", [1, 3])
def test_the_threads_share_each_projection_whatever_their_count(mixed_llm, threads):
    # three threads on two cores keep one of them behind at every projection, so the others claim
    # its rows: a row skipped or written twice by the sharing would change the reply or its logprobs
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fused, per_op = _run(mixed_llm, True), _run(mixed_llm, False)
    finally:
        torch.set_num_threads(saved)
    assert fused.token_ids == per_op.token_ids
    for a, b in zip(fused.outputs[0].logprobs, per_op.outputs[0].logprobs, strict=True):
        assert abs(a.logprob - b.logprob) < 5e-3
