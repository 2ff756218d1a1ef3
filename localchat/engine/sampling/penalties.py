"""Repetition, presence and frequency penalties, applied to the token ids a sequence has seen and
nowhere else.

A sequence's token history is kept as tensors between steps (the prompt's distinct ids once, the
output ids grown by the new tokens), so a step converts only its new tokens and never builds a dense
[rows, vocab] mask.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from localchat.engine.core.sequence import Sequence


class _TokenHistory:
    """A sequence's distinct prompt ids and its output ids so far, as int64 tensors."""

    def __init__(self, seq: Sequence):
        self.prompt_ids = torch.from_numpy(
            np.unique(np.asarray(seq.token_ids[: seq.num_prompt_tokens], np.int64))
        )
        self._output = torch.empty(0, dtype=torch.int64)
        self._num_output = 0
        self._last_token: int | None = None

    def output_ids(self, seq: Sequence) -> torch.Tensor:
        num, done = seq.num_output_tokens, self._num_output
        if done and (
            num < done or seq.token_ids[seq.num_prompt_tokens + done - 1] != self._last_token
        ):
            done = 0  # the output changed under us (never happens today): start over
        if num > done:
            new = torch.from_numpy(
                np.asarray(seq.token_ids[seq.num_prompt_tokens + done :], np.int64)
            )
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


# one value for every penalized row, or a [rows] tensor when rows differ
Factor = float | torch.Tensor


@dataclass
class Penalties:
    """Penalties of a batch as flat indices (row * vocab + token id) into its [rows, vocab] logits.

    `seen` lists the prompt and output ids of rows with a repetition penalty (repeats are harmless:
    every copy writes the same value); `counted` the distinct output ids of rows with a presence or
    frequency penalty, with their counts. An index's row is index // vocab_size.
    """

    vocab_size: int
    seen: torch.Tensor | None  # [S] int64
    repetition: Factor | None
    counted: torch.Tensor | None  # [C] int64, distinct
    counts: torch.Tensor | None  # [C] float32
    frequency: Factor | None
    presence: Factor | None

    @classmethod
    def from_seqs(cls, seqs: list[Sequence], vocab_size: int) -> Penalties | None:
        seen, seen_rows, counted, counted_rows = [], [], [], []
        for row, seq in enumerate(seqs):
            params = seq.params
            if not params.has_penalties:
                continue
            history = _history(seq)
            output = history.output_ids(seq)
            if params.repetition_penalty != 1.0:
                seen.append(torch.cat([history.prompt_ids, output]) + row * vocab_size)
                seen_rows.append(row)
            if (params.frequency_penalty != 0.0 or params.presence_penalty != 0.0) and len(output):
                counted.append(output + row * vocab_size)
                counted_rows.append(row)
        if not seen and not counted:
            return None
        penalties = cls(vocab_size, None, None, None, None, None, None)
        if seen:
            penalties.seen = torch.cat(seen)
            penalties.repetition = _factor(seqs, seen_rows, "repetition_penalty")
        if counted:
            distinct, counts = torch.cat(counted).unique(return_counts=True)
            penalties.counted, penalties.counts = distinct, counts.to(torch.float32)
            penalties.frequency = _factor(seqs, counted_rows, "frequency_penalty")
            penalties.presence = _factor(seqs, counted_rows, "presence_penalty")
        return penalties

    def to(self, device) -> Penalties:
        def move(t):
            return t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t

        return Penalties(
            self.vocab_size,
            *(
                move(t)
                for t in (
                    self.seen,
                    self.repetition,
                    self.counted,
                    self.counts,
                    self.frequency,
                    self.presence,
                )
            ),
        )

    def apply_(self, logits: torch.Tensor) -> None:
        """Penalize [rows, vocab] float32 logits in place: repetition first (divide positive logits,
        multiply negative ones), then frequency (times the count) and presence (once)."""
        flat = logits.view(-1)
        # from_seqs sets seen with repetition, and counted with counts, frequency and presence
        if self.seen is not None and self.repetition is not None:
            values, factor = flat[self.seen], self._per_index(self.repetition, self.seen)
            flat[self.seen] = torch.where(values > 0, values / factor, values * factor)
        if (
            self.counted is not None
            and self.counts is not None
            and self.frequency is not None
            and self.presence is not None
        ):
            frequency = self._per_index(self.frequency, self.counted)
            presence = self._per_index(self.presence, self.counted)
            flat[self.counted] = flat[self.counted] - frequency * self.counts - presence

    def _per_index(self, factor: Factor, indices: torch.Tensor) -> Factor:
        return factor if isinstance(factor, float) else factor[indices // self.vocab_size]


def _factor(seqs: list[Sequence], rows: list[int], name: str) -> Factor:
    values = [getattr(seqs[row].params, name) for row in rows]
    if len(set(values)) == 1:
        return float(values[0])
    return torch.tensor([getattr(seq.params, name) for seq in seqs], dtype=torch.float32)
