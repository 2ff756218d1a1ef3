"""Sampler: turn a batch of last-position logits into tokens, vectorized over the batch.

Per row: min_tokens bans, repetition/presence/frequency penalties, then greedy argmax, or
temperature, top-k, top-p and min-p followed by an exponential race among what is left (argmax of
p / q, q ~ Exp(1)), which draws from p. A seeded request draws its q from its own generator, so its
samples do not depend on its batch companions.

On the CPU a C++ kernel (kernels/csrc/sampling.h) does the filtering and the race in two passes
over each row and picks what `sample_reference`, the torch code below, picks for the same noise.
The GPU runs the torch code, whose cost at batch 1 is a few passes over the vocabulary, never a
sort of it in the common case: top-k and top-p work on a candidate set (an exact top-k,
engine/sampling/topk.py), which top-p widens (at last to a full sort) only when the candidates hold
less than top_p of the probability mass. Min-p and the penalties need no sort, and parameters at
their neutral values cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localchat.engine.core.sequence import Sequence, TokenLogprob
from localchat.engine.sampling.penalties import Penalties
from localchat.engine.sampling.topk import topk
from localchat.kernels.cpu_extension import cpu_kernels

RACE_GROUP = 256  # token ids per group of the sampling race (see _race)

# Candidate counts top-p tries in turn before sorting the whole vocabulary. With the chat's defaults
# (temperature 0.7, top_p 0.95) on the default model, 32 were enough at 95% of 370 reply steps, 256
# at all.
TOP_P_CANDIDATES = (32, 256, 4096)


@dataclass
class SamplingBatch:
    """Per-row sampling parameters as tensors on the logits' device, plus host-side facts about
    them."""

    temperature: torch.Tensor  # [B] float32; 0 = greedy
    # [B] int64 in [1, vocab], vocab = off, greedy rows 1; None if no row filters
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None  # [B] float32, 1 = off; None if no row uses it
    min_p: torch.Tensor | None  # [B] float32
    penalties: Penalties | None
    banned: list[tuple[int, list[int]]]  # (row, token ids) masked until min_tokens
    generators: list[torch.Generator | None]
    num_logprobs: list[int | None]
    all_greedy: bool
    any_greedy: bool = False
    max_top_k: int = 0  # largest top_k below the vocabulary size (candidates top-k needs)
    top_p_alone: bool = False  # a row has top_p and no top_k: its candidates may not be enough
    unfiltered: bool = False  # a sampled row has neither top_k nor top_p, among rows that do

    @classmethod
    def from_seqs(
        cls, seqs: list[Sequence], vocab_size: int, eos_token_ids: set[int], device
    ) -> SamplingBatch:
        params = [seq.params for seq in seqs]
        greedy = [p.greedy for p in params]
        all_greedy = all(greedy)
        temperature = torch.tensor(
            [0.0 if g else p.temperature for g, p in zip(greedy, params, strict=True)],
            dtype=torch.float32,
        )
        top_k: torch.Tensor | None = None
        top_p: torch.Tensor | None = None
        min_p: torch.Tensor | None = None
        max_top_k, top_p_alone, unfiltered = 0, False, False
        if not all_greedy:
            ks = [
                1 if g else min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size
                for g, p in zip(greedy, params, strict=True)
            ]
            ps = [1.0 if g else p.top_p for g, p in zip(greedy, params, strict=True)]
            sampled_top_k = any(k < vocab_size for k, g in zip(ks, greedy, strict=True) if not g)
            if sampled_top_k or any(p < 1.0 for p in ps):
                top_k = torch.tensor(ks, dtype=torch.int64)
                if any(p < 1.0 for p in ps):
                    top_p = torch.tensor(ps, dtype=torch.float32)
                max_top_k = max((k for k in ks if k < vocab_size), default=0)
                top_p_alone = any(p < 1.0 and k == vocab_size for k, p in zip(ks, ps, strict=True))
                unfiltered = any(p == 1.0 and k == vocab_size for k, p in zip(ks, ps, strict=True))
            if any(p.min_p > 0.0 for g, p in zip(greedy, params, strict=True) if not g):
                min_p = torch.tensor(
                    [0.0 if g else p.min_p for g, p in zip(greedy, params, strict=True)],
                    dtype=torch.float32,
                )
        banned = []
        for row, seq in enumerate(seqs):
            if seq.num_output_tokens < seq.params.min_tokens:
                ids = set(seq.params.stop_token_ids or ()) | (
                    set() if seq.params.ignore_eos else eos_token_ids
                )
                banned.append((row, sorted(i for i in ids if i < vocab_size)))
        penalties = (
            Penalties.from_seqs(seqs, vocab_size) if any(p.has_penalties for p in params) else None
        )

        def to(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return cls(
            temperature=temperature.to(device, non_blocking=True),
            top_k=to(top_k),
            top_p=to(top_p),
            min_p=to(min_p),
            penalties=None if penalties is None else penalties.to(device),
            banned=banned,
            generators=[seq.generator for seq in seqs],
            num_logprobs=[p.logprobs for p in params],
            all_greedy=all_greedy,
            any_greedy=any(greedy),
            max_top_k=max_top_k,
            top_p_alone=top_p_alone,
            unfiltered=unfiltered,
        )


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
        tokens = logits.argmax(dim=-1) if batch.all_greedy else self._sample(logits, batch)
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
            batch.penalties.apply_(logits)
        return logits

    @staticmethod
    def _sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        noise = race_noise(logits.shape, batch.generators)
        ext = cpu_kernels() if logits.device.type == "cpu" else None
        if ext is not None:  # one C++ pass per row (kernels/csrc/sampling.h), the same picks
            return ext.sample_tokens(
                logits.contiguous(), batch.temperature, batch.top_k, batch.top_p, batch.min_p, noise
            )
        return sample_reference(logits, batch, noise.to(logits.device))

    @staticmethod
    def _logprobs(
        raw_logits, tokens: list[int], num_logprobs: list[int | None]
    ) -> list[TokenLogprob | None]:
        if raw_logits is None:
            return [None] * len(tokens)
        logprobs = raw_logits.log_softmax(dim=-1)
        chosen_ids = torch.tensor(tokens, device=logprobs.device).unsqueeze(1)
        chosen = logprobs.gather(1, chosen_ids)
        ranks = (logprobs > chosen).sum(dim=-1).add_(1).tolist()
        max_k = max(k for k in num_logprobs if k is not None)
        top_values, top_ids = (
            topk(logprobs, max_k) if max_k else (logprobs[:, :0], chosen_ids[:, :0])
        )
        chosen_list, top_value_rows, top_id_rows = (
            chosen.squeeze(1).tolist(),
            top_values.tolist(),
            top_ids.tolist(),
        )
        result: list[TokenLogprob | None] = []
        for row, k in enumerate(num_logprobs):
            if k is None:
                result.append(None)
                continue
            top = list(zip(top_id_rows[row][:k], top_value_rows[row][:k], strict=True))
            result.append(TokenLogprob(tokens[row], chosen_list[row], ranks[row], top))
        return result


def sample_reference(
    logits: torch.Tensor, batch: SamplingBatch, noise: torch.Tensor
) -> torch.Tensor:
    """The tokens of a batch with sampled rows, in torch ops (the GPU's path, and the reference
    the C++ kernel is tested against): temperature, top-k, top-p, min-p, then the race with
    `noise`."""
    greedy_rows = batch.temperature == 0
    scaled = logits / torch.where(greedy_rows, 1.0, batch.temperature).unsqueeze(1)
    if batch.top_k is None:
        weights = scaled.softmax(dim=-1)
    else:
        candidate_weights, ids = _top_k_top_p(scaled, batch)
        weights = torch.zeros_like(scaled).scatter_(1, ids, candidate_weights)
        # rows without filters among rows with them keep the whole vocabulary
        if batch.unfiltered:
            unfiltered_rows = batch.top_k == scaled.shape[1]
            if batch.top_p is not None:
                unfiltered_rows &= batch.top_p == 1.0
            weights = torch.where(unfiltered_rows.unsqueeze(1), scaled.softmax(dim=-1), weights)
    # weights are each row's probabilities up to a factor, which min-p ignores
    if batch.min_p is not None:
        threshold = batch.min_p.unsqueeze(1) * weights.amax(dim=-1, keepdim=True)
        weights = weights.masked_fill(weights < threshold, 0.0)
    tokens = _race(weights, noise)
    if batch.any_greedy:
        tokens = torch.where(greedy_rows, logits.argmax(dim=-1), tokens)
    return tokens


def _top_k_top_p(scaled: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's most likely tokens, in order ([rows, M] ids), with weights proportional to their
    probability after top-k and top-p, 0 for the tokens these filters remove. Every token left out
    of the M has weight 0.

    The same kept set as sorting the whole vocabulary: a token is kept when its rank is below top_k
    and the mass of the tokens ranked before it is below top_p. Ranks past the candidates are all
    removed once the candidates' mass reaches top_p, so only rows with top_p and no top_k may need
    more candidates.
    """
    vocab = scaled.shape[1]
    if not batch.top_p_alone:
        values, ids = topk(scaled, batch.max_top_k)
        return _keep(values, batch, vocab, None)[0], ids
    full_lse = scaled.logsumexp(dim=-1, keepdim=True)
    needed = 0.0
    for count in sorted({max(count, batch.max_top_k) for count in TOP_P_CANDIDATES}):
        if count >= vocab:
            break
        if count < needed:
            continue  # the last try showed that this many candidates cannot hold top_p of the mass
        values, ids = topk(scaled, count)
        weights, needed = _keep(values, batch, vocab, full_lse)
        if needed == 0.0:
            return weights, ids
    values, ids = scaled.sort(dim=-1, descending=True)
    return _keep(values, batch, vocab, full_lse)[0], ids


def _keep(
    values: torch.Tensor, batch: SamplingBatch, vocab: int, full_lse: torch.Tensor | None
) -> tuple[torch.Tensor, float]:
    """(weights, needed) for the sorted candidate logits `values` (see _top_k_top_p). `needed` is 0
    when no token past the candidates can be kept, else a lower bound on the candidates that could
    be enough. A row's weights do not depend on how many candidates there are."""
    top_k = batch.top_k
    assert top_k is not None  # _top_k_top_p runs only for batches with top_k
    has_top_k = top_k < vocab
    if batch.max_top_k:  # rows with top_k drop the ranks past it and normalize over what is left
        ranks = torch.arange(values.shape[1], device=values.device)
        values = values.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
        norm = values.logsumexp(dim=-1, keepdim=True)
        if full_lse is not None:  # rows without top_k: probabilities over the whole vocabulary
            norm = torch.where(has_top_k.unsqueeze(1), norm, full_lse)
    else:
        # no row has a top_k below the vocabulary, so a row has top_p alone: full_lse is given
        assert full_lse is not None
        norm = full_lse
    probs = (values - norm).exp()
    if batch.top_p is None:
        return probs, 0.0
    top_p = batch.top_p.unsqueeze(1)
    cumulative = probs.cumsum(dim=-1)
    # the mass of strictly more likely tokens
    remove = (cumulative - probs >= top_p) & (top_p < 1.0)
    remove[:, 0] = False  # always keep the most likely token
    weights = probs.masked_fill(remove, 0.0)
    if full_lse is None:
        return weights, 0.0
    # top-p mass the candidates lack
    missing = (top_p - cumulative[:, -1:]).squeeze(1).clamp_min(0.0)
    missing = missing.masked_fill(has_top_k | (batch.top_p >= 1.0), 0.0)
    if not bool(missing.any()):
        return weights, 0.0
    # tokens past the candidates are no likelier than the last one, so at least missing / p_last
    # more are needed
    more = torch.where(missing > 0, missing / probs[:, -1], 0.0)
    return weights, values.shape[1] + float(more.max())


def _race(weights: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Per row, index i with probability weights[i] / sum(weights), by exponential races (argmax of
    w / q, q ~ Exp(1) from `noise`, see race_noise): first among groups of RACE_GROUP ids by their
    total weight, then within the winning group.

    Two small races draw a fixed count of exponentials per row (about 2 * sqrt(vocab)), not one per
    token, and keep what a race is good at: a token's q belongs to its id, so logits that differ in
    the last digits (another batch size, another kernel) change the pick only near a tie of w / q,
    and a seeded request's generator advances by the same count at every step.
    """
    rows, size = weights.shape
    if size % RACE_GROUP:
        weights = torch.nn.functional.pad(weights, (0, RACE_GROUP - size % RACE_GROUP))
    groups = weights.view(rows, -1, RACE_GROUP)
    num_groups = groups.shape[1]
    group = (groups.sum(dim=-1) / noise[:, :num_groups]).argmax(dim=-1)
    members = groups.gather(1, group.view(rows, 1, 1).expand(rows, 1, RACE_GROUP)).squeeze(1)
    member = (members / noise[:, num_groups:]).argmax(dim=-1)
    return group * RACE_GROUP + member


def race_noise(shape: torch.Size, generators: list[torch.Generator | None]) -> torch.Tensor:
    """The race's Exp(1) draws for logits of `shape` ([rows, vocab]), on the CPU: [rows, groups +
    RACE_GROUP], a seeded row's from its own generator."""
    rows, vocab = shape
    return _exponentials(rows, -(-vocab // RACE_GROUP) + RACE_GROUP, generators)


def _exponentials(rows: int, count: int, generators: list[torch.Generator | None]) -> torch.Tensor:
    """[rows, count] Exp(1) draws on the CPU, a seeded row's from its own generator."""
    noise = torch.empty(rows, count)
    if any(generator is None for generator in generators):
        noise.exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row].exponential_(generator=generator)
    # a 0 would make 0 / 0; tiny keeps w / q ordered
    return noise.clamp_min_(torch.finfo(torch.float32).tiny)
