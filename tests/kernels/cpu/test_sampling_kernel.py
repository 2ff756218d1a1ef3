"""The C++ sampler (kernels/csrc/sampling.h) against its torch reference (sampler.sample_reference):
given the same race noise, every row picks the same token, on language-model-shaped rows, flat rows
(where the candidates are not enough and every token is one), rows with banned tokens, and mixed
batches."""

from __future__ import annotations

import pytest
import torch

from localchat.engine.core.sequence import Request
from localchat.engine.sampling.sampler import SamplingBatch, race_noise, sample_reference
from localchat.engine.sampling.sampling_params import SamplingParams
from tests.cpu_kernels import kernels_or_skip

pytestmark = pytest.mark.usefixtures("each_isa")  # each build of the kernels (conftest.py)
GENERIC_KERNELS = True  # the generic build too (conftest.py)

SETTINGS = [
    {"temperature": 0.7, "top_p": 0.95},  # the chat's defaults
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 40},
    {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.05},
    {"temperature": 1.3, "top_p": 0.5},
    {"temperature": 0.7, "min_p": 0.1},
    {"temperature": 2.0, "top_p": 0.999},
    {"temperature": 0.5, "top_k": 3000},
    {"temperature": 0.9, "top_k": 3000, "top_p": 0.8},
    {"temperature": 0.0},
]


def lm_shaped(rows: int, vocab: int, gen: torch.Generator, scale: float) -> torch.Tensor:
    """Sorted, logits fall off as about -scale * ln(1 + rank); ids shuffled."""
    ranks = torch.arange(vocab, dtype=torch.float32)
    profile = -scale * torch.log1p(ranks) + 0.3 * torch.randn(rows, vocab, generator=gen)
    order = torch.argsort(torch.rand(rows, vocab, generator=gen), dim=-1)
    return torch.empty(rows, vocab).scatter_(1, order, profile.sort(dim=-1, descending=True).values)


def batch_of(settings: list[dict], vocab: int) -> SamplingBatch:
    seqs = [Request("r", [0], SamplingParams(**s)).seqs[0] for s in settings]
    return SamplingBatch.from_seqs(seqs, vocab, set(), torch.device("cpu"))


def kernel_and_reference(logits: torch.Tensor, batch: SamplingBatch):
    ext = kernels_or_skip()
    noise = race_noise(logits.shape, [None] * logits.shape[0])
    got = ext.sample_tokens(logits, batch.temperature, batch.top_k, batch.top_p, batch.min_p, noise)
    return got.tolist(), sample_reference(logits, batch, noise).tolist()


@pytest.mark.parametrize("vocab", [49152, 1000])
@pytest.mark.parametrize(
    "setting", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
def test_each_setting_picks_what_the_reference_picks(vocab, setting):
    gen = torch.Generator().manual_seed(vocab)
    # peaked rows (a few candidates), LM-like ones, and flat ones (every token a candidate)
    logits = torch.cat([lm_shaped(8, vocab, gen, scale) for scale in (4.0, 2.0, 0.3)])
    got, expected = kernel_and_reference(logits, batch_of([setting] * logits.shape[0], vocab))
    assert got == expected
    if setting["temperature"] > 0 and setting.get("top_k", 0) != 1:
        assert len(set(got)) > 1  # real draws


def test_a_mixed_batch_with_banned_tokens_picks_what_the_reference_picks():
    vocab, gen = 49152, torch.Generator().manual_seed(9)
    settings = SETTINGS * 3
    logits = torch.cat([lm_shaped(len(SETTINGS), vocab, gen, scale) for scale in (3.0, 2.0, 1.0)])
    # bans (min_tokens, bad words) are -inf; ban each row's argmax and a few more
    logits[torch.arange(logits.shape[0]), logits.argmax(dim=-1)] = float("-inf")
    logits[:, :100] = float("-inf")
    for _ in range(5):
        got, expected = kernel_and_reference(logits, batch_of(settings, vocab))
        assert got == expected
        assert all(token >= 100 for token in got)


def test_tied_top_tokens_resolve_to_the_lowest_id_as_greedy_does():
    # (the reference's order among ties is torch.topk's, which is unspecified)
    ext = kernels_or_skip()
    logits = torch.zeros(3, 512)
    logits[:, [7, 300, 301]] = 5.0
    settings = [
        {"temperature": 0.0},
        {"temperature": 1.0, "top_k": 1},
        {"temperature": 1.0, "top_p": 0.01},
    ]
    batch = batch_of(settings, 512)
    noise = race_noise(logits.shape, [None] * 3)
    got = ext.sample_tokens(logits, batch.temperature, batch.top_k, batch.top_p, batch.min_p, noise)
    assert got.tolist() == [7, 7, 7]
