"""Prompt logprobs: how likely the model found each prompt token, given the tokens before it.

Filled chunk by chunk as a prompt is prefilled: the hidden state at position p scores the token at
p + 1. A chunk's logits are computed a block of rows at a time, at most about LOGITS_ELEMENTS
values each (64 MiB of float32), so a prefill chunk of thousands of tokens over a vocabulary of
hundreds of thousands never holds its whole [chunk, vocab] logits at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from localchat.engine.core.sequence import Sequence, TokenLogprob

LOGITS_ELEMENTS = 1 << 24  # the most logits one block computes (rows x vocabulary)
FIRST_ROWS = 16  # the first block's rows, whose logits tell the vocabulary's size


def fill_prompt_logprobs(
    seq: Sequence,
    hidden: torch.Tensor,
    start: int,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Score the prompt tokens that this step's chunk (hidden states of positions start, start + 1,
    ...) predicts, into `seq.prompt_logprobs` (a recomputed chunk, after a preemption, writes the
    same values)."""
    # the last prompt position scores output
    end = min(start + hidden.shape[0], seq.num_prompt_tokens - 1)
    if seq.prompt_logprobs is None or end <= start:
        return
    rows = FIRST_ROWS
    first = start
    while first < end:
        last = min(first + rows, end)
        logits = compute_logits(hidden[first - start : last - start])
        _score(seq, logits, first)
        rows = max(LOGITS_ELEMENTS // logits.shape[-1], 1)
        del logits
        first = last


def _score(seq: Sequence, logits: torch.Tensor, start: int) -> None:
    """Write the TokenLogprobs of the prompt tokens at start + 1, ... that `logits` (the rows of
    positions start, ...) predict."""
    assert seq.prompt_logprobs is not None
    logprobs = logits.float().log_softmax(dim=-1)
    end = start + logprobs.shape[0]
    targets = torch.tensor(seq.token_ids[start + 1 : end + 1], device=logprobs.device)
    chosen = logprobs.gather(1, targets[:, None])
    ranks = (logprobs > chosen).sum(dim=1) + 1
    k = seq.params.prompt_logprobs or 0
    top_values, top_ids = (
        logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long())
    )
    rows = zip(
        targets.tolist(),
        chosen[:, 0].tolist(),
        ranks.tolist(),
        top_ids.tolist(),
        top_values.tolist(),
        strict=True,
    )
    for offset, (token_id, logprob, rank, ids, values) in enumerate(rows, start=start + 1):
        seq.prompt_logprobs[offset] = TokenLogprob(
            token_id, logprob, rank, list(zip(ids, values, strict=True))
        )
