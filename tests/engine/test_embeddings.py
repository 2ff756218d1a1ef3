"""LLMEngine.embed on the float default model equals pooling transformers' final hidden states."""

from __future__ import annotations

import pytest
import torch

from localchat.errors import InvalidParameterError

pytestmark = pytest.mark.slow

TEXTS = ["The capital of France is", "def fibonacci(n):", "Hi"]


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embed_equals_a_direct_forward_pass(float_llm, hf_model, pooling):
    ids = [float_llm.engine.tokenize(text) for text in TEXTS]
    vectors = float_llm.engine.embed(ids, pooling)
    for token_ids, vector in zip(ids, vectors, strict=True):
        with torch.inference_mode():
            out = hf_model(torch.tensor([token_ids]), output_hidden_states=True)
        hidden = out.hidden_states[-1][0]
        pooled = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
        expected = torch.nn.functional.normalize(pooled, dim=0)
        torch.testing.assert_close(vector, expected, atol=2e-4, rtol=1e-3)
    # nothing stays allocated
    assert float_llm.engine.block_manager.usage == 0


def test_embed_rejects_unknown_pooling(float_llm):
    with pytest.raises(InvalidParameterError) as error:
        float_llm.engine.embed([[1, 2]], "max")
    assert error.value.param == "pooling"
