"""Fixtures for engine tests: the Hugging Face reference on the same GGUF weights, computed once."""

from __future__ import annotations

import pytest
import torch

# Varied prompts: chat-formatted and raw, code, lists, non-English, a long one (~200 tokens).
RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "List three colors:",
    "1, 2, 3, 4,",
    "Der schnelle braune Fuchs springt",
    "Explain gravity in one sentence. " * 20,
]
CHAT_MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]
NUM_NEW_TOKENS = 40


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> str:
    """A one-layer Qwen3 of random weights (64 wide, a vocabulary of 512, no tokenizer), saved as
    safetensors: an engine that loads in a second, for tests that need a real one."""
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.engine.loading.test_loading import tiny_config

    path = tmp_path_factory.mktemp("tiny-qwen3")
    (path / "config.json").write_text(json.dumps(tiny_config("qwen3-0.6b", num_hidden_layers=1)))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def hf_model(default_gguf):
    """transformers' own GGUF loading (its dequantization and Q/K un-permutation), float32."""
    from transformers import AutoModelForCausalLM

    from localchat.bench.gguf_parsing import shared_gguf_parsing

    with shared_gguf_parsing():
        model = AutoModelForCausalLM.from_pretrained(
            str(default_gguf.parent), gguf_file=default_gguf.name, dtype=torch.float32
        )
    return model.eval()


@pytest.fixture(scope="session")
def parity_prompts(llm):
    """Token ids of the test prompts (8 of them), as the engine tokenizes them."""
    prompts = [llm.engine.tokenize(p) for p in RAW_PROMPTS]
    prompts.append(llm.render_chat(CHAT_MESSAGES))
    return prompts


@pytest.fixture(scope="session")
def hf_parity_outputs(hf_model, parity_prompts):
    """HF greedy continuation of each prompt, run alone (no padding), EOS banned like min_tokens
    does."""
    outputs = []
    with torch.no_grad():
        for ids in parity_prompts:
            tensor = torch.tensor([ids])
            out = hf_model.generate(
                tensor,
                attention_mask=torch.ones_like(tensor),
                do_sample=False,
                max_new_tokens=NUM_NEW_TOKENS,
                min_new_tokens=NUM_NEW_TOKENS,
            )
            outputs.append(out[0, len(ids) :].tolist())
    return outputs


def greedy_params():
    from localchat import SamplingParams

    return SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS)
