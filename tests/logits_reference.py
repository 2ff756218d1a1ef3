"""An engine's prefill logits and greedy decode held against a reference forward pass (transformers,
or our float32 path on gguf-py's dequantized weights): prompts' logits close, and every greedy token
the reference's own choice (up to ties, which random-weight files have) with its log-probability."""

from __future__ import annotations

from collections.abc import Callable

import torch

from localchat import LLM, SamplingParams

Reference = Callable[[list[int]], torch.Tensor]  # token ids -> [len, vocab] float32 logits


def random_prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(count)]


def assert_follows(
    llm: LLM, reference: Reference, prompts: list[list[int]], *, rtol: float, max_tokens: int = 8
) -> None:
    """`rtol`: the largest logit error allowed, relative to the largest reference logit (the
    log-probabilities get twice that, as an absolute bound)."""
    scales = []
    for ids in prompts:
        expected = reference(ids)
        scales.append(expected.abs().max().item())
        got = llm.engine.prompt_logits(ids)
        torch.testing.assert_close(got, expected, rtol=0, atol=rtol * scales[-1])
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    # the first prompt alone (a single decode: one C++ call for all layers), then all as a batch
    for count in (1, len(prompts)):
        for ids, scale, output in zip(
            prompts, scales, llm.generate(prompts[:count], params), strict=False
        ):
            tokens, logprobs = output.token_ids, output.outputs[0].logprobs
            assert len(tokens) == max_tokens and logprobs is not None
            expected = torch.log_softmax(reference(ids + tokens)[len(ids) - 1 : -1], dim=-1)
            bound = 2 * rtol * scale
            for step, (token, ours) in enumerate(zip(tokens, logprobs, strict=True)):
                assert expected[step, token].item() >= expected[step].max().item() - bound, step
                assert abs(ours.logprob - expected[step, token].item()) <= bound, (step, ours)
