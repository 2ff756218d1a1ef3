"""Sampler: turn a batch of last-position logits into tokens, vectorized over the batch.

Per row: min_tokens masking, repetition/presence/frequency penalties, then greedy argmax, or temperature,
top-k, top-p and min-p followed by an exponential race (argmax of p / q, q ~ Exp(1)), which draws from p.
A seeded request draws its q from its own generator, so its samples do not depend on its batch companions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localchat.engine.sequence import Sequence, TokenLogprob


@dataclass
class SamplingBatch:
    """Per-row sampling parameters as tensors on the logits' device."""

    temperature: torch.Tensor        # [B] float32; 0 = greedy
    top_k: torch.Tensor | None       # [B] int64 (vocab size = off), None if no row filters
    top_p: torch.Tensor | None       # [B] float32
    min_p: torch.Tensor | None       # [B] float32
    penalties: tuple | None          # (repetition, presence, frequency, prompt_mask, output_counts)
    banned: list[tuple[int, list[int]]]  # (row, token ids) masked until min_tokens
    generators: list[torch.Generator | None]
    num_logprobs: list[int | None]
    all_greedy: bool

    @classmethod
    def from_seqs(cls, seqs: list[Sequence], vocab_size: int, eos_token_ids: set[int], device) -> "SamplingBatch":
        params = [seq.params for seq in seqs]
        greedy = [p.greedy for p in params]
        all_greedy = all(greedy)
        temperature = torch.tensor([0.0 if g else p.temperature for g, p in zip(greedy, params)], dtype=torch.float32)
        top_k = top_p = min_p = None
        if not all_greedy and any(p.top_k > 0 for p in params):
            top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab_size for p in params], dtype=torch.int64)
        if not all_greedy and any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
        if not all_greedy and any(p.min_p > 0.0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32)
        banned = []
        for row, seq in enumerate(seqs):
            if seq.num_output_tokens < seq.params.min_tokens:
                ids = set(seq.params.stop_token_ids) | (set() if seq.params.ignore_eos else eos_token_ids)
                banned.append((row, sorted(i for i in ids if i < vocab_size)))
        penalties = _penalty_tensors(seqs, vocab_size) if any(p.has_penalties for p in params) else None
        to = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return cls(
            temperature=to(temperature), top_k=to(top_k), top_p=to(top_p), min_p=to(min_p),
            penalties=None if penalties is None else tuple(to(t) for t in penalties),
            banned=banned, generators=[seq.generator for seq in seqs],
            num_logprobs=[p.logprobs for p in params], all_greedy=all_greedy,
        )


def _penalty_tensors(seqs: list[Sequence], vocab_size: int):
    rows = len(seqs)
    repetition = torch.tensor([s.params.repetition_penalty for s in seqs], dtype=torch.float32)
    presence = torch.tensor([s.params.presence_penalty for s in seqs], dtype=torch.float32)
    frequency = torch.tensor([s.params.frequency_penalty for s in seqs], dtype=torch.float32)
    prompt_mask = torch.zeros(rows, vocab_size, dtype=torch.bool)
    output_counts = torch.zeros(rows, vocab_size, dtype=torch.float32)
    for row, seq in enumerate(seqs):
        prompt_ids = torch.tensor(seq.token_ids[:seq.num_prompt_tokens], dtype=torch.int64)
        prompt_mask[row, prompt_ids] = True
        output_ids = torch.tensor(seq.output_token_ids, dtype=torch.int64)
        output_counts[row].index_add_(0, output_ids, torch.ones(len(output_ids)))
    return repetition, presence, frequency, prompt_mask, output_counts


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class Sampler:
    """Samples one token per row of logits according to a SamplingBatch."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        logits = logits.to(torch.float32)
        raw_logits = logits if any(k is not None for k in batch.num_logprobs) else None
        logits = self._apply_bans_and_penalties(logits, batch)
        if batch.all_greedy:
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample(logits, batch)
        token_list = tokens.tolist()
        return SamplerOutput(token_list, self._logprobs(raw_logits, token_list, batch.num_logprobs))

    @staticmethod
    def _apply_bans_and_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        if not batch.banned and batch.penalties is None:
            return logits
        logits = logits.clone()
        for row, ids in batch.banned:
            logits[row, ids] = float("-inf")
        if batch.penalties is not None:
            repetition, presence, frequency, prompt_mask, output_counts = batch.penalties
            seen = prompt_mask | (output_counts > 0)
            penalty = repetition.unsqueeze(1)
            logits = torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)
            logits = logits - frequency.unsqueeze(1) * output_counts
            logits = logits - presence.unsqueeze(1) * (output_counts > 0).float()
        return logits

    @staticmethod
    def _sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        greedy_rows = batch.temperature == 0
        greedy_tokens = logits.argmax(dim=-1)
        scaled = logits / torch.where(greedy_rows, 1.0, batch.temperature).unsqueeze(1)
        scaled = _filter_top_k_top_p(scaled, batch.top_k, batch.top_p)
        probs = scaled.softmax(dim=-1)
        if batch.min_p is not None:
            threshold = batch.min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < threshold, 0.0)
        race = torch.empty_like(probs).exponential_()
        for row, generator in enumerate(batch.generators):
            if generator is not None:
                race[row] = torch.empty(probs.shape[1]).exponential_(generator=generator).to(probs.device)
        sampled = (probs / race).argmax(dim=-1)
        return torch.where(greedy_rows, greedy_tokens, sampled)

    @staticmethod
    def _logprobs(raw_logits, tokens: list[int], num_logprobs: list[int | None]) -> list[TokenLogprob | None]:
        if raw_logits is None:
            return [None] * len(tokens)
        logprobs = raw_logits.log_softmax(dim=-1)
        chosen_ids = torch.tensor(tokens, device=logprobs.device).unsqueeze(1)
        chosen = logprobs.gather(1, chosen_ids)
        ranks = (logprobs > chosen).sum(dim=-1).add_(1).tolist()
        max_k = max(k for k in num_logprobs if k is not None)
        top_values, top_ids = logprobs.topk(max(max_k, 1), dim=-1)
        chosen, top_values, top_ids = chosen.squeeze(1).tolist(), top_values.tolist(), top_ids.tolist()
        result: list[TokenLogprob | None] = []
        for row, k in enumerate(num_logprobs):
            if k is None:
                result.append(None)
                continue
            top = list(zip(top_ids[row][:k], top_values[row][:k]))
            result.append(TokenLogprob(tokens[row], chosen[row], ranks[row], top))
        return result


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        ranks = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
        remove |= ranks >= top_k.unsqueeze(1)
    if top_p is not None:
        probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
        remove |= mass_before >= top_p.unsqueeze(1)
    remove[:, 0] = False  # always keep the most likely token
    return logits.scatter(1, order, sorted_logits.masked_fill(remove, float("-inf")))
