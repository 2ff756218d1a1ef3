"""Repetition, presence and frequency penalties, applied to the token ids a sequence has seen and nowhere else.

A sequence's token history is kept as tensors between steps (the prompt's distinct ids once, the output ids
grown by the new tokens), so a step converts only its new tokens and never builds a dense [rows, vocab] mask.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from localchat.engine.sequence import Sequence


class _TokenHistory:
    """A sequence's distinct prompt ids and its output ids so far, as int64 tensors."""

    def __init__(self, seq: Sequence):
        self.prompt_ids = torch.from_numpy(np.unique(np.asarray(seq.token_ids[:seq.num_prompt_tokens], np.int64)))
        self._output = torch.empty(0, dtype=torch.int64)
        self._num_output = 0
        self._last_token: int | None = None

    def output_ids(self, seq: Sequence) -> torch.Tensor:
        num, done = seq.num_output_tokens, self._num_output
        if done and (num < done or seq.token_ids[seq.num_prompt_tokens + done - 1] != self._last_token):
            done = 0  # the output changed under us (never happens today): start over
        if num > done:
            new = torch.from_numpy(np.asarray(seq.token_ids[seq.num_prompt_tokens + done:], np.int64))
            if num > len(self._output):
                grown = torch.empty(max(num, 2 * len(self._output), 64), dtype=torch.int64)
                grown[:done] = self._output[:done]
                self._output = grown
            self._output[done:num] = new
        self._num_output = num
        self._last_token = seq.token_ids[-1] if num else None
        return self._output[:num]


_histories: weakref.WeakKeyDictionary[Sequence, _TokenHistory] = weakref.WeakKeyDictionary()


def _history(seq: Sequence) -> _TokenHistory:
    history = _histories.get(seq)
    if history is None:
        history = _histories[seq] = _TokenHistory(seq)
    return history


@dataclass
class Penalties:
    """Penalties of a batch as flat indices (row * vocab + token id) into its [rows, vocab] logits.

    `seen` lists the prompt and output ids of rows with a repetition penalty (repeats are harmless: every copy
    writes the same value); `counted` the distinct output ids of rows with a presence or frequency penalty,
    with their counts. The factors are per row; an index's row is index // vocab_size.
    """

    vocab_size: int
    repetition: torch.Tensor            # [rows] float32
    frequency: torch.Tensor             # [rows] float32
    presence: torch.Tensor              # [rows] float32
    seen: torch.Tensor | None           # [S] int64
    counted: torch.Tensor | None        # [C] int64, distinct
    counts: torch.Tensor | None         # [C] float32

    @classmethod
    def from_seqs(cls, seqs: list[Sequence], vocab_size: int) -> Penalties | None:
        seen, counted = [], []
        for row, seq in enumerate(seqs):
            params = seq.params
            if not params.has_penalties:
                continue
            history = _history(seq)
            output = history.output_ids(seq)
            if params.repetition_penalty != 1.0:
                seen.append(torch.cat([history.prompt_ids, output]) + row * vocab_size)
            if (params.frequency_penalty != 0.0 or params.presence_penalty != 0.0) and len(output):
                counted.append(output + row * vocab_size)
        if not seen and not counted:
            return None
        factors = [torch.tensor([getattr(seq.params, name) for seq in seqs], dtype=torch.float32)
                   for name in ("repetition_penalty", "frequency_penalty", "presence_penalty")]
        distinct = counts = None
        if counted:
            distinct, counts = torch.cat(counted).unique(return_counts=True)
            counts = counts.to(torch.float32)
        return cls(vocab_size, *factors, torch.cat(seen) if seen else None, distinct, counts)

    def to(self, device) -> Penalties:
        move = lambda t: None if t is None else t.to(device, non_blocking=True)
        return Penalties(self.vocab_size, *(move(t) for t in (self.repetition, self.frequency, self.presence,
                                                             self.seen, self.counted, self.counts)))

    def apply_(self, logits: torch.Tensor) -> None:
        """Penalize [rows, vocab] float32 logits in place: repetition first (divide
        positive logits, multiply negative ones), then frequency (times the count) and presence (once)."""
        flat = logits.view(-1)
        if self.seen is not None:
            values, factor = flat[self.seen], self.repetition[self.seen // self.vocab_size]
            flat[self.seen] = torch.where(values > 0, values / factor, values * factor)
        if self.counted is not None:
            rows = self.counted // self.vocab_size
            flat[self.counted] = flat[self.counted] - self.frequency[rows] * self.counts - self.presence[rows]
