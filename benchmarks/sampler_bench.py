"""Per-call cost of the sampler (SamplingBatch.from_seqs + Sampler) at batch 1 and 32, over
SmolLM2's vocabulary.

    # the sampler as it is
    python benchmarks/sampler_bench.py
    # before/after table against the pre-issue-9 sampler
    python benchmarks/sampler_bench.py --compare-ref

Logits are random but shaped like the default model's: sorted, they fall off as about
-c*ln(1 + rank) with c drawn in [1.2, 2.5] per row, as SmolLM2's do on chat replies (their top-p
0.95 set at temperature 0.7: median 3 tokens, 90th percentile 22, never above 256 in 370 steps). The
`flat` line is the worst case, logits with no peak, where top-p needs the full sort. Each call
appends a token to its sequences, as the engine does, so the penalties see growing outputs over a
1,000-token prompt. Times are medians over --calls calls, in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localchat.engine.core.sequence import Request, Sequence, TokenLogprob
from localchat.engine.sampling.sampler import Sampler, SamplingBatch
from localchat.engine.sampling.sampling_params import SamplingParams

VOCAB = 49152  # SmolLM2
PROMPT_TOKENS = 1000
EOS = {0, 2}
PENALTIES = {"repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5}

SETTINGS: dict[str, dict] = {
    "greedy": {"temperature": 0.0},
    "temp 0.7": {"temperature": 0.7},
    "temp 0.7 top_p 0.95": {"temperature": 0.7, "top_p": 0.95},
    "temp 0.7 top_k 40": {"temperature": 0.7, "top_k": 40},
    "temp 0.7 min_p 0.05": {"temperature": 0.7, "min_p": 0.05},
    "top_p 0.95 + penalties": dict(temperature=0.7, top_p=0.95, **PENALTIES),
    "top_k 40 + penalties": dict(temperature=0.7, top_k=40, **PENALTIES),
    "min_p 0.05 + penalties": dict(temperature=0.7, min_p=0.05, **PENALTIES),
    "top_p 0.95 + min_tokens": {
        "temperature": 0.7,
        "top_p": 0.95,
        "min_tokens": 10_000,
        "max_tokens": 20_000,
    },
    "top_p 0.95 + seed": {"temperature": 0.7, "top_p": 0.95, "seed": 1},
    "top_p 0.95 + logprobs 5": {"temperature": 0.7, "top_p": 0.95, "logprobs": 5},
    "flat: top_p 0.95 (full sort)": {"temperature": 0.7, "top_p": 0.95},
}


def lm_like_logits(rows: int, gen: torch.Generator, flat: bool = False) -> torch.Tensor:
    """Rows whose sorted values fall off like a language model's: -c*ln(1 + rank) + noise, ids
    shuffled."""
    if flat:
        return torch.randn(rows, VOCAB, generator=gen)
    ranks = torch.arange(VOCAB, dtype=torch.float32)
    scale = 1.2 + 1.3 * torch.rand(rows, 1, generator=gen)
    profile = -scale * torch.log1p(ranks) + 0.3 * torch.randn(rows, VOCAB, generator=gen)
    order = torch.argsort(torch.rand(rows, VOCAB, generator=gen), dim=-1)
    return torch.empty(rows, VOCAB).scatter_(1, order, profile.sort(dim=-1, descending=True).values)


def make_seqs(batch: int, params: SamplingParams, gen: torch.Generator) -> list[Sequence]:
    seqs = []
    for i in range(batch):
        prompt = torch.randint(3, VOCAB, (PROMPT_TOKENS,), generator=gen).tolist()
        seqs.extend(Request(f"r{i}", prompt, params).seqs)
    return seqs


def time_calls(
    variants: dict,
    logits_pool: list[torch.Tensor],
    batch: int,
    params: SamplingParams,
    gen: torch.Generator,
    calls: int,
    rounds: int = 4,
) -> dict[str, float]:
    """Median microseconds per call of each variant's sample(logits, seqs). The variants take turns
    in blocks of calls / rounds (so that they share whatever else the machine is doing, and neither
    runs on the caches the other left). Each appends its sampled tokens to its own sequences, as the
    engine does."""
    seqs = {label: make_seqs(batch, params, gen) for label in variants}
    times: dict[str, list[float]] = {label: [] for label in variants}
    for (
        label,
        sample_fn,
    ) in variants.items():  # warm up; the first steps of a sequence are not typical either
        for seq, token in zip(seqs[label], sample_fn(logits_pool[0], seqs[label]), strict=True):
            seq.append_token(token)
    for round_ in range(rounds):
        for label, sample_fn in variants.items():
            for i in range(round_ * calls // rounds, (round_ + 1) * calls // rounds):
                logits = logits_pool[i % len(logits_pool)]
                start = time.perf_counter()
                tokens = sample_fn(logits, seqs[label])
                times[label].append((time.perf_counter() - start) * 1e6)
                for seq, token in zip(seqs[label], tokens, strict=True):
                    seq.append_token(token)
    return {label: statistics.median(t) for label, t in times.items()}


def new_sampler():
    sampler = Sampler()

    def run(logits, seqs):
        return sampler(logits, SamplingBatch.from_seqs(seqs, VOCAB, EOS, logits.device)).token_ids

    return run


def ref_sampler():
    sampler = _RefSampler()

    def run(logits, seqs):
        return sampler(
            logits, _RefSamplingBatch.from_seqs(seqs, VOCAB, EOS, logits.device)
        ).token_ids

    return run


def top_p_set_sizes(logits: torch.Tensor, temperature=0.7, top_p=0.95) -> list[int]:
    probs = (logits / temperature).softmax(-1).sort(dim=-1, descending=True).values
    return ((probs.cumsum(-1) - probs) < top_p).sum(-1).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--compare-ref", action="store_true", help="also time the pre-issue-9 sampler"
    )
    parser.add_argument(
        "--calls", type=int, default=200, help="timed calls per setting and batch size"
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="settings to run (substring match)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    sizes = sorted(top_p_set_sizes(lm_like_logits(64, gen)))
    print(
        f"vocab {VOCAB}, {args.threads} threads; median of {args.calls} calls at batch 1, "
        f"{max(args.calls // 8, 10)} above; microseconds per call"
    )
    print(
        f"top-p 0.95 set at temperature 0.7 on these logits: median {sizes[32]}, "
        f"max {sizes[-1]} tokens"
    )
    header = f"{'setting':32s} {'batch':>5s} {'new':>9s}"
    if args.compare_ref:
        header += f" {'before':>9s} {'speedup':>8s}"
    print(header)
    for name, setting in SETTINGS.items():
        if args.only and not any(s in name for s in args.only):
            continue
        params = SamplingParams(**setting)
        for batch in args.batch:
            # fresh rows for most calls: outputs, and so penalties, spread over the vocabulary as in
            # a reply
            pool = [
                lm_like_logits(batch, gen, flat=name.startswith("flat"))
                for _ in range(64 if batch == 1 else 8)
            ]
            calls = args.calls if batch == 1 else max(args.calls // 8, 10)
            variants = {"new": new_sampler()}
            if args.compare_ref:
                variants["before"] = ref_sampler()
            medians = time_calls(variants, pool, batch, params, gen, calls)
            line = f"{name:32s} {batch:5d} {medians['new']:9.0f}"
            if args.compare_ref:
                line += f" {medians['before']:9.0f} {medians['before'] / medians['new']:7.1f}x"
            print(line, flush=True)


# --- the sampler before issue 9, kept as the reference for --compare-ref --------------------------


@dataclass
class _RefSamplingBatch:
    temperature: torch.Tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    penalties: tuple | None
    banned: list[tuple[int, list[int]]]
    generators: list[torch.Generator | None]
    num_logprobs: list[int | None]
    all_greedy: bool

    @classmethod
    def from_seqs(cls, seqs, vocab_size, eos_token_ids, device):
        params = [seq.params for seq in seqs]
        greedy = [p.greedy for p in params]
        all_greedy = all(greedy)
        temperature = torch.tensor(
            [0.0 if g else p.temperature for g, p in zip(greedy, params, strict=True)],
            dtype=torch.float32,
        )
        top_k = top_p = min_p = None
        if not all_greedy and any(p.top_k > 0 for p in params):
            top_k = torch.tensor(
                [p.top_k if p.top_k > 0 else vocab_size for p in params], dtype=torch.int64
            )
        if not all_greedy and any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
        if not all_greedy and any(p.min_p > 0.0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32)
        banned = []
        for row, seq in enumerate(seqs):
            if seq.num_output_tokens < seq.params.min_tokens:
                ids = set(seq.params.stop_token_ids) | (
                    set() if seq.params.ignore_eos else eos_token_ids
                )
                banned.append((row, sorted(i for i in ids if i < vocab_size)))
        penalties = (
            _ref_penalty_tensors(seqs, vocab_size) if any(p.has_penalties for p in params) else None
        )

        def to(t):
            return None if t is None else t.to(device, non_blocking=True)

        return cls(
            temperature=to(temperature),
            top_k=to(top_k),
            top_p=to(top_p),
            min_p=to(min_p),
            penalties=None if penalties is None else tuple(to(t) for t in penalties),
            banned=banned,
            generators=[seq.generator for seq in seqs],
            num_logprobs=[p.logprobs for p in params],
            all_greedy=all_greedy,
        )


def _ref_penalty_tensors(seqs, vocab_size):
    rows = len(seqs)
    repetition = torch.tensor([s.params.repetition_penalty for s in seqs], dtype=torch.float32)
    presence = torch.tensor([s.params.presence_penalty for s in seqs], dtype=torch.float32)
    frequency = torch.tensor([s.params.frequency_penalty for s in seqs], dtype=torch.float32)
    prompt_mask = torch.zeros(rows, vocab_size, dtype=torch.bool)
    output_counts = torch.zeros(rows, vocab_size, dtype=torch.float32)
    for row, seq in enumerate(seqs):
        prompt_ids = torch.tensor(seq.token_ids[: seq.num_prompt_tokens], dtype=torch.int64)
        prompt_mask[row, prompt_ids] = True
        output_ids = torch.tensor(seq.output_token_ids, dtype=torch.int64)
        output_counts[row].index_add_(0, output_ids, torch.ones(len(output_ids)))
    return repetition, presence, frequency, prompt_mask, output_counts


@dataclass
class _RefOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class _RefSampler:
    def __call__(self, logits, batch):
        logits = logits.to(torch.float32)
        raw_logits = logits if any(k is not None for k in batch.num_logprobs) else None
        logits = self._apply_bans_and_penalties(logits, batch)
        tokens = logits.argmax(dim=-1) if batch.all_greedy else self._sample(logits, batch)
        token_list = tokens.tolist()
        return _RefOutput(token_list, self._logprobs(raw_logits, token_list, batch.num_logprobs))

    @staticmethod
    def _apply_bans_and_penalties(logits, batch):
        if not batch.banned and batch.penalties is None:
            return logits
        logits = logits.clone()
        for row, ids in batch.banned:
            logits[row, ids] = float("-inf")
        if batch.penalties is not None:
            repetition, presence, frequency, prompt_mask, output_counts = batch.penalties
            seen = prompt_mask | (output_counts > 0)
            penalty = repetition.unsqueeze(1)
            logits = torch.where(
                seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits
            )
            logits = logits - frequency.unsqueeze(1) * output_counts
            logits = logits - presence.unsqueeze(1) * (output_counts > 0).float()
        return logits

    @staticmethod
    def _sample(logits, batch):
        greedy_rows = batch.temperature == 0
        greedy_tokens = logits.argmax(dim=-1)
        scaled = logits / torch.where(greedy_rows, 1.0, batch.temperature).unsqueeze(1)
        scaled = _ref_filter_top_k_top_p(scaled, batch.top_k, batch.top_p)
        probs = scaled.softmax(dim=-1)
        if batch.min_p is not None:
            threshold = batch.min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < threshold, 0.0)
        race = torch.empty_like(probs).exponential_()
        for row, generator in enumerate(batch.generators):
            if generator is not None:
                race[row] = (
                    torch.empty(probs.shape[1]).exponential_(generator=generator).to(probs.device)
                )
        sampled = (probs / race).argmax(dim=-1)
        return torch.where(greedy_rows, greedy_tokens, sampled)

    @staticmethod
    def _logprobs(raw_logits, tokens, num_logprobs):
        if raw_logits is None:
            return [None] * len(tokens)
        logprobs = raw_logits.log_softmax(dim=-1)
        chosen_ids = torch.tensor(tokens, device=logprobs.device).unsqueeze(1)
        chosen = logprobs.gather(1, chosen_ids)
        ranks = (logprobs > chosen).sum(dim=-1).add_(1).tolist()
        max_k = max(k for k in num_logprobs if k is not None)
        top_values, top_ids = logprobs.topk(max(max_k, 1), dim=-1)
        chosen, top_values, top_ids = (
            chosen.squeeze(1).tolist(),
            top_values.tolist(),
            top_ids.tolist(),
        )
        result = []
        for row, k in enumerate(num_logprobs):
            if k is None:
                result.append(None)
                continue
            result.append(
                TokenLogprob(
                    tokens[row],
                    chosen[row],
                    ranks[row],
                    list(zip(top_ids[row][:k], top_values[row][:k], strict=True)),
                )
            )
        return result


def _ref_filter_top_k_top_p(logits, top_k, top_p):
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        ranks = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
        remove |= ranks >= top_k.unsqueeze(1)
    if top_p is not None:
        probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        remove |= mass_before >= top_p.unsqueeze(1)
    remove[:, 0] = False
    return logits.scatter(1, order, sorted_logits.masked_fill(remove, float("-inf")))


if __name__ == "__main__":
    main()
