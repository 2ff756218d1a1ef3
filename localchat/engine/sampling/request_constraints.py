"""RequestConstraints: what one request asks of its logits, which the logits processors
(logits_processors.py) apply to its rows."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from localchat.engine.sampling.sampling_params import SamplingParams


class RequestConstraints:
    """What one request asks of its logits: a grammar (compiled off-thread), a fixed additive bias
    (logit_bias and allowed_token_ids folded into one row) and bad-word token sequences."""

    def __init__(self, params: SamplingParams, bad_words_ids: list[list[int]]):
        self.logit_bias = dict(params.logit_bias or {})
        self.allowed_token_ids = list(params.allowed_token_ids or [])
        self.bad_words_ids = bad_words_ids
        self.grammar: Future | None = None
        self._bias: torch.Tensor | None = None

    @property
    def has_bias(self) -> bool:
        return bool(self.logit_bias or self.allowed_token_ids)

    def bias_row(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        """The request's [vocab] float32 additive bias on `device` (built once)."""
        if self._bias is None:
            bias = torch.zeros(vocab_size, dtype=torch.float32)
            if self.allowed_token_ids:
                bias.fill_(float("-inf"))
                bias[torch.tensor(self.allowed_token_ids)] = 0.0
            for token_id, value in self.logit_bias.items():
                bias[token_id] += value
            self._bias = bias.to(device)
        return self._bias
