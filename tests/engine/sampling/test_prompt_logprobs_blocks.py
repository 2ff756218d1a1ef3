"""Prompt logprobs of a long prefill chunk are computed a bounded block of rows at a time (never
the chunk's whole [tokens, vocabulary] logits at once), and equal those of one block."""

from __future__ import annotations

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.engine.sampling import prompt_logprobs

VOCAB = 512  # tiny_qwen3's
BLOCK_ROWS = 8


def _prompt_logprobs(llm: LLM, prompt: list[int]) -> tuple[list, list[int]]:
    """The prompt's logprobs, and the rows of each logits computation its request made."""
    model = llm.engine.runner.model
    compute_logits = model.compute_logits
    rows: list[int] = []

    def counted(hidden: torch.Tensor) -> torch.Tensor:
        rows.append(hidden.shape[0])
        return compute_logits(hidden)

    model.compute_logits = counted
    try:
        params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3)
        output = llm.generate([prompt], params)[0]
    finally:
        del model.compute_logits
    assert output.prompt_logprobs is not None
    return output.prompt_logprobs, rows


def test_prompt_logprobs_of_a_long_chunk_come_in_bounded_blocks(tiny_qwen3, monkeypatch):
    llm = LLM(tiny_qwen3, max_model_len=512, kv_cache_memory="4MiB", max_num_batched_tokens=400)
    prompt = [(i * 13) % 500 + 5 for i in range(300)]  # one prefill chunk
    whole, _ = _prompt_logprobs(llm, prompt)
    monkeypatch.setattr(prompt_logprobs, "LOGITS_ELEMENTS", BLOCK_ROWS * VOCAB, raising=False)
    blocked, rows = _prompt_logprobs(llm, prompt)
    first = getattr(prompt_logprobs, "FIRST_ROWS", BLOCK_ROWS)
    assert max(rows) <= max(first, BLOCK_ROWS), rows
    assert sum(rows) >= len(prompt) - 1  # every prompt position scored (and one sampled)
    assert whole[0] is None and blocked[0] is None
    for one, other in zip(whole[1:], blocked[1:], strict=True):
        assert one.token_id == other.token_id and abs(one.rank - other.rank) <= 1  # near ties
        assert one.logprob == pytest.approx(other.logprob, abs=1e-4)
        assert [v for _, v in one.top] == pytest.approx([v for _, v in other.top], abs=1e-4)
