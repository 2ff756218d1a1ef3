"""Tensor parallelism of the families with mixture-of-experts MLPs, attention sinks, biases on the
row-parallel projections and q/k norms over the whole projection: real spawned ranks over gloo,
against one process and transformers on the same tiny random weights (tests/family_models.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.engine.distributed.shard_plan import check_tensor_parallel, plan_shards
from localchat.engine.modeling.spec import DecoderSpec, LayerSpec, MoESpec
from localchat.errors import InvalidParameterError
from tests.family_models import FAMILIES, VOCAB, WINDOW, hf_greedy, random_prompts, save

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
NEW_TOKENS = 8
# Llama with biases on q/k/v, o and the MLP (o's and down's are row-parallel)
FAMILIES = {
    **FAMILIES,
    "llama-biases": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
}


@pytest.mark.parametrize(
    ("family", "size"),
    [
        ("qwen3-moe", 2),
        ("qwen2-moe", 2),  # a shared expert with its gate, a dense layer among the MoE ones
        ("mixtral", 2),
        ("olmoe", 4),  # q/k norms over the whole projection; 2 KV heads, each on two ranks
        ("gpt-oss", 2),  # sinks, expert and o biases, clamped SwiGLU, windows
        ("olmo2", 2),  # q/k norms over the whole projection, dense
        ("llama-biases", 2),
    ],
)
def test_greedy_tokens_equal_one_rank_and_transformers(family, size, tmp_path, monkeypatch):
    monkeypatch.setattr("tests.family_models.FAMILIES", FAMILIES)
    hf = save(family, tmp_path)
    prompts = random_prompts([5, WINDOW + 3, 40], seed=3)
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    with torch.no_grad():
        hf_logits = hf(torch.tensor([prompts[-1]])).logits[0]
    options = dict(max_model_len=128, kv_cache_memory="16MiB", max_num_batched_tokens=32)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    one = LLM(str(tmp_path), **options)
    one_logits = one.engine.prompt_logits(prompts[-1])
    llm = LLM(str(tmp_path), tensor_parallel_size=size, **options)
    try:
        tokens = [out.token_ids for out in llm.generate(prompts, params)]
        logits = llm.engine.prompt_logits(prompts[-1])
    finally:
        llm.engine.runner.close()
    assert tokens == expected
    torch.testing.assert_close(logits, one_logits, rtol=0, atol=1e-4)
    torch.testing.assert_close(logits, hf_logits, rtol=1e-4, atol=1e-4)


def _moe_spec(width: int = 96, **moe) -> DecoderSpec:
    fields = dict(num_experts=8, top_k=2, intermediate_size=32) | moe
    return DecoderSpec(
        VOCAB, 64, width, 2, 4, 2, 16, 1e-6, False,
        moe=MoESpec(**fields), layers=(LayerSpec(moe=True), LayerSpec(moe=True)),
    )  # fmt: skip


def test_every_rank_holds_every_experts_share_of_the_width():
    spec = _moe_spec(shared_expert_size=48)
    plans = [plan_shards(spec, rank, 2) for rank in range(2)]
    assert [p.expert_intermediate for p in plans] == [range(0, 16), range(16, 32)]
    assert [p.shared_expert_intermediate for p in plans] == [range(0, 24), range(24, 48)]
    assert [p.kv_replicas for p in plans] == [1, 1]
    assert plan_shards(spec, 3, 4).kv_replicas == 2


def test_widths_that_do_not_split_are_refused_by_name():
    with pytest.raises(InvalidParameterError, match="each expert's width 30"):
        check_tensor_parallel(_moe_spec(intermediate_size=30), 4)
    with pytest.raises(InvalidParameterError, match="the shared expert's width 6"):
        check_tensor_parallel(_moe_spec(shared_expert_size=6), 4)
    # where every layer is MoE, the dense MLP's width (unused) does not matter
    check_tensor_parallel(_moe_spec(width=90), 4)
    spec = dataclasses.replace(_moe_spec(width=90), layers=(LayerSpec(moe=True), LayerSpec()))
    with pytest.raises(InvalidParameterError, match="the MLP width 90"):
        check_tensor_parallel(spec, 4)
