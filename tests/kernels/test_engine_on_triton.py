"""The whole engine with every kernel swapped for its Triton version (run by the interpreter): a
mixed batch with chunked prefill, a cached prefix and decodes gives the same tokens and logits as
the references."""

from __future__ import annotations

import json

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.kernels import dispatch
from tests.kernels.conftest import DEVICE

pytestmark = pytest.mark.skipif(
    DEVICE != "cpu", reason="the interpreter run; on a GPU the kernels run natively"
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.engine.loading.test_loading import tiny_config

    path = tmp_path_factory.mktemp("tiny-qwen3")
    (path / "config.json").write_text(json.dumps(tiny_config("qwen3-0.6b", num_hidden_layers=1)))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).save_pretrained(path)
    return str(path)


def run(model: str, prompts: list[list[int]]):
    llm = LLM(
        model, max_model_len=256, kv_cache_memory="4MiB", max_num_batched_tokens=24, block_size=8
    )
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    # the second prompt reused the first's blocks
    assert llm.engine.block_manager.prefix_cache_hits >= 16
    return [o.token_ids for o in outputs], llm.engine.prompt_logits(
        prompts[0] + outputs[0].token_ids
    )


def test_triton_kernels_in_the_engine_match_the_references(tiny_model, monkeypatch):
    generator = torch.Generator().manual_seed(2)
    shared = torch.randint(0, 512, (17,), generator=generator).tolist()
    prompts = [
        [*shared, 5, 6],
        [*shared, 7],
        torch.randint(0, 512, (40,), generator=generator).tolist(),
        [3],
    ]
    expected_tokens, expected_logits = run(tiny_model, prompts)
    monkeypatch.setenv("LOCALCHAT_TRITON_ON_CPU", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    dispatch._triton_on_cpu.cache_clear()
    try:
        assert dispatch.use_triton(torch.zeros(1))
        tokens, logits = run(tiny_model, prompts)
    finally:
        dispatch._triton_on_cpu.cache_clear()
    assert tokens == expected_tokens
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4)
