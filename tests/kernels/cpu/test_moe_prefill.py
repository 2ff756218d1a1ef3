"""A prefill's quantized experts in one C++ call (kernels/csrc/moe_prefill.h, SparseMoE.cpu_experts)
against the same experts run one after the other from Python (each expert's quant_linear on its
rows): the same outputs, the same greedy tokens, and the experts with enough rows for another GEMM
path left to run on their own."""

from __future__ import annotations

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.engine.modeling.moe import SparseMoE, route
from localchat.kernels.packed_weight import quantize_weight
from localchat.kernels.quant_linear import gemm_choices
from tests.family_models import VOCAB, build, save

pytestmark = pytest.mark.usefixtures("each_isa")
GENERIC_KERNELS = True  # the generic build too (conftest.py)


def _moe_layer(llm: LLM) -> SparseMoE:
    return next(m for m in llm.engine.runner.model.modules() if isinstance(m, SparseMoE))


def _routed(moe: SparseMoE, tokens: int, seed: int = 3):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, moe.router_weight.shape[1], generator=generator)
    weights, ids = route(hidden @ moe.router_weight.T, moe.moe)
    return hidden, weights, ids


def _one_by_one(moe: SparseMoE, hidden, weights, ids) -> torch.Tensor:
    grouped, moe._cpu_experts = moe._cpu_experts, False
    try:
        return moe._experts_in_turn(hidden, weights, ids)
    finally:
        moe._cpu_experts = grouped


def _calls(moe: SparseMoE, monkeypatch) -> list[int]:
    """Which experts' Python MLPs run (their rows go through quant_linear one expert at a time)."""
    called: list[int] = []
    for index, expert in enumerate(moe.experts):
        forward = expert.forward
        monkeypatch.setattr(
            expert, "forward", lambda x, i=index, f=forward: called.append(i) or f(x)
        )
    return called


@pytest.mark.parametrize(
    "family,quantization",
    [("qwen3-moe", "int4"), ("qwen3-moe", "int8"), ("mixtral", "int8"), ("olmoe", "int4")],
)
def test_the_grouped_experts_give_the_one_by_one_outputs(
    family, quantization, tmp_path, monkeypatch
):
    save(family, tmp_path)
    llm = LLM(str(tmp_path), max_model_len=256, kv_cache_memory="16MiB", quantization=quantization)
    moe = _moe_layer(llm)
    assert moe.cpu_experts() is not None
    hidden, weights, ids = _routed(moe, 37)
    called = _calls(moe, monkeypatch)
    grouped = moe._experts_in_turn(hidden, weights, ids)
    assert called == []  # every expert ran in the C++ call
    expected = _one_by_one(moe, hidden, weights, ids)
    assert sorted(set(called)) == sorted(set(ids.flatten().tolist()))
    # each pair's products are the same kernels' (batch-invariant); only the weighted sum's
    # rounding may differ (a fused multiply-add)
    torch.testing.assert_close(grouped, expected, rtol=1e-6, atol=1e-6)


def test_experts_with_enough_rows_for_the_dense_gemm_run_on_their_own(
    tmp_path, monkeypatch, gemm_env
):
    save("qwen3-moe", tmp_path)
    llm = LLM(str(tmp_path), max_model_len=256, kv_cache_memory="16MiB", quantization="int8")
    moe = _moe_layer(llm)
    hidden, weights, ids = _routed(moe, 64)
    counts = torch.bincount(ids.flatten(), minlength=moe.moe.num_experts)
    limit = int(counts.max())  # the busiest expert(s) take the dense GEMM, the rest the C++ call
    gemm_env(DENSE_MIN_ROWS=str(limit))
    called = _calls(moe, monkeypatch)
    mixed = moe._experts_in_turn(hidden, weights, ids)
    assert sorted(called) == sorted((counts >= limit).nonzero().flatten().tolist())
    expected = _one_by_one(moe, hidden, weights, ids)
    torch.testing.assert_close(mixed, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen3-moe", "olmoe"])
def test_a_prefill_on_the_grouped_experts_keeps_the_greedy_tokens(family, tmp_path):
    save(family, tmp_path)
    llm = LLM(str(tmp_path), max_model_len=256, kv_cache_memory="16MiB", quantization="int4")
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in (45, 9, 70)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tokens = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    for moe in llm.engine.runner.model.modules():
        if isinstance(moe, SparseMoE):
            assert moe.cpu_experts() is not None
            moe._cpu_experts = False
    llm.engine.runner.model.cpu_decode = None
    assert [out.outputs[0].token_ids for out in llm.generate(prompts, params)] == tokens


def test_a_wide_models_experts_take_one_activation_code(tmp_path, monkeypatch):
    """A model 2048 wide takes one int8 code per activation (kernels/quant_linear.py), its experts
    too, though their down projections have only 32 inputs: the grouped call gives the outputs
    of the one-by-one path taken with one code everywhere, not those of its width's two codes."""
    model = build("qwen3-moe", 0, hidden_size=2048, num_hidden_layers=1)
    model.save_pretrained(tmp_path, safe_serialization=True)
    llm = LLM(str(tmp_path), max_model_len=256, kv_cache_memory="16MiB", quantization="int4")
    moe = _moe_layer(llm)
    hidden, weights, ids = _routed(moe, 9)
    grouped = moe._experts_in_turn(hidden, weights, ids)
    two_codes = _one_by_one(moe, hidden, weights, ids)
    monkeypatch.setenv("LOCALCHAT_INT8_ACTIVATIONS", "1")
    gemm_choices.cache_clear()
    try:
        one_code = _one_by_one(moe, hidden, weights, ids)
    finally:
        monkeypatch.delenv("LOCALCHAT_INT8_ACTIVATIONS")
        gemm_choices.cache_clear()
    torch.testing.assert_close(grouped, one_code, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(grouped, two_codes, rtol=1e-4, atol=1e-4)


def test_experts_quantized_in_two_forms_run_one_by_one(tmp_path, monkeypatch):
    """Expert 0's gate_up in groups of 16 beside the others' groups of 32: their activations
    differ in layout, so the grouped call (one layout per projection) is not taken, and the
    outputs are the one-by-one path's."""
    save("qwen3-moe", tmp_path)
    llm = LLM(str(tmp_path), max_model_len=256, kv_cache_memory="16MiB", quantization="int8")
    moe = _moe_layer(llm)
    first = moe.experts[0]
    first.gate_up_weight = quantize_weight(first.gate_up_weight.dequantize(), 8, group_size=16)
    moe._cpu_experts = None  # built at load: build it again
    assert moe.cpu_experts() is not None and not moe.cpu_experts().batchable()
    hidden, weights, ids = _routed(moe, 37)
    called = _calls(moe, monkeypatch)
    out = moe._experts_in_turn(hidden, weights, ids)
    assert sorted(called) == sorted(set(ids.flatten().tolist()))
    torch.testing.assert_close(out, _one_by_one(moe, hidden, weights, ids), rtol=0, atol=0)


def test_experts_the_kernel_cannot_run_stay_one_by_one(tmp_path):
    """gpt-oss's experts (clamped SwiGLU with biases) have no C++ call."""
    save("gpt-oss", tmp_path)
    llm = LLM(str(tmp_path), max_model_len=256, kv_cache_memory="16MiB", quantization="int8")
    assert _moe_layer(llm).cpu_experts() is None
