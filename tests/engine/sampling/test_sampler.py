"""Sampler math on hand-made logits: each parameter changes the pick the way it should."""

import pytest
import torch

from localchat.engine.core.sequence import Request
from localchat.engine.sampling import sampler as sampler_module
from localchat.engine.sampling.penalties import Penalties
from localchat.engine.sampling.sampler import Sampler, SamplingBatch
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.engine.sampling.topk import topk as fast_topk

VOCAB = 6


def seq_with(params: SamplingParams, prompt=(0,), output=()):
    seq = Request("r", list(prompt), params).seqs[0]
    for token in output:
        seq.append_token(token)
    return seq


def sample(logits_rows, seqs, eos=frozenset({5})):
    batch = SamplingBatch.from_seqs(seqs, VOCAB, set(eos), torch.device("cpu"))
    return Sampler()(torch.tensor(logits_rows, dtype=torch.float32), batch)


def test_greedy_takes_the_argmax():
    out = sample([[0.0, 3.0, 1.0, 0.0, 0.0, 0.0]], [seq_with(SamplingParams(temperature=0))])
    assert out.token_ids == [1]


def test_repetition_penalty_divides_positive_logits_of_seen_tokens():
    # token 1 (seen in the prompt) 3.0 / 2 = 1.5 < token 2's 2.0
    logits = [[0.0, 3.0, 2.0, 0.0, 0.0, 0.0]]
    assert sample(logits, [seq_with(SamplingParams(temperature=0), prompt=(1,))]).token_ids == [1]
    params = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert sample(logits, [seq_with(params, prompt=(1,))]).token_ids == [2]


def test_repetition_penalty_multiplies_negative_logits():
    logits = [[-1.0, -1.5, -3.0, -9.0, -9.0, -9.0]]
    params = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert sample(logits, [seq_with(params, prompt=(0,))]).token_ids == [1]  # -2.0 < -1.5


def test_frequency_penalty_scales_with_the_count_of_output_tokens():
    logits = [[0.0, 3.0, 2.2, 0.0, 0.0, 0.0]]
    once = SamplingParams(temperature=0, frequency_penalty=0.5)
    assert sample(logits, [seq_with(once, output=(1,))]).token_ids == [1]  # 3.0 - 0.5 > 2.2
    assert sample(logits, [seq_with(once, output=(1, 1))]).token_ids == [2]  # 3.0 - 1.0 < 2.2


def test_presence_penalty_is_flat_and_ignores_the_prompt():
    logits = [[0.0, 3.0, 2.2, 0.0, 0.0, 0.0]]
    params = SamplingParams(temperature=0, presence_penalty=1.0)
    assert sample(logits, [seq_with(params, prompt=(1,))]).token_ids == [1]
    assert sample(logits, [seq_with(params, output=(1,))]).token_ids == [2]
    assert sample(logits, [seq_with(params, output=(1, 1, 1))]).token_ids == [2]


def test_min_tokens_bans_eos_and_stop_tokens_until_reached():
    logits = [[0.0, 1.0, 0.0, 0.0, 4.0, 5.0]]
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[4])
    assert sample(logits, [seq_with(params, output=(1,))]).token_ids == [1]
    assert sample(logits, [seq_with(params, output=(1, 1))]).token_ids == [5]


def test_filters_leave_only_the_top_token():
    logits = [[0.0, 2.0, 1.9, 1.8, 0.0, 0.0]] * 4
    seqs = [
        seq_with(SamplingParams(temperature=1.0, top_k=1, seed=1)),
        seq_with(SamplingParams(temperature=1.0, top_p=0.01, seed=2)),
        seq_with(SamplingParams(temperature=1.0, min_p=1.0, seed=3)),
        seq_with(SamplingParams(temperature=1.0, top_k=2, top_p=0.5, seed=4)),
    ]
    for _ in range(20):
        assert sample(logits, seqs).token_ids == [1, 1, 1, 1]


def test_top_k_keeps_exactly_k_candidates():
    logits = [[0.0, 2.0, 1.9, 1.8, 0.0, 0.0]]
    seq = seq_with(SamplingParams(temperature=1.0, top_k=2, seed=7))
    picks = {sample(logits, [seq]).token_ids[0] for _ in range(200)}
    assert picks == {1, 2}


def test_temperature_flattens_and_sharpens():
    logits = [[0.0, 1.0, 0.5, 0.0, 0.0, 0.0]]
    cold = seq_with(SamplingParams(temperature=0.05, seed=3))
    assert {sample(logits, [cold]).token_ids[0] for _ in range(50)} == {1}
    hot = seq_with(SamplingParams(temperature=5.0, seed=3))
    assert len({sample(logits, [hot]).token_ids[0] for _ in range(200)}) == VOCAB


def test_seeded_rows_do_not_depend_on_their_companions():
    flat = [[0.0] * VOCAB] * 3  # every token equally likely: only the draws decide
    picks = []
    for seed in range(20):
        alone = sample(flat[:1], [seq_with(SamplingParams(seed=seed))]).token_ids[0]
        crowd = sample(
            flat,
            [
                seq_with(SamplingParams()),
                seq_with(SamplingParams(seed=seed)),
                seq_with(SamplingParams(seed=seed + 100)),
            ],
        ).token_ids
        picks.append((alone, crowd[1]))
    assert all(alone == in_crowd for alone, in_crowd in picks)
    assert len({alone for alone, _ in picks}) > 1  # and the seed matters


def test_unseeded_rows_draw_independently():
    flat = [[0.0] * VOCAB] * 2
    pairs = [
        tuple(sample(flat, [seq_with(SamplingParams()), seq_with(SamplingParams())]).token_ids)
        for _ in range(120)
    ]
    # independent rows agree 1 time in VOCAB (about 20 of 120); rows sharing a draw would always
    # agree
    assert sum(a == b for a, b in pairs) < 45
    assert len(set(pairs)) > 15


def test_logprobs_report_the_chosen_token_and_sorted_alternatives():
    logits = [[0.0, 3.0, 2.0, 1.0, 0.0, 0.0]]
    out = sample(logits, [seq_with(SamplingParams(temperature=0, logprobs=3))])
    lp = out.logprobs[0]
    expected = torch.tensor(logits[0]).log_softmax(-1)
    assert lp.token_id == 1 and lp.rank == 1
    assert abs(lp.logprob - expected[1].item()) < 1e-6
    assert [t for t, _ in lp.top] == [1, 2, 3]
    assert all(a >= b for (_, a), (_, b) in zip(lp.top, lp.top[1:], strict=False))
    assert sample(logits, [seq_with(SamplingParams(temperature=0))]).logprobs == [None]


# --- the fast paths against the full-sort definition ----------------------------------------------


def expected_probs(
    row: torch.Tensor, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0
) -> torch.Tensor:
    """The definition, by sorting the whole row: top-k, then top-p on what is left, then min-p."""
    scaled = row / temperature
    sorted_logits, order = scaled.sort(descending=True)
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k > 0:
        remove[top_k:] = True
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(-1)
    remove |= (probs.cumsum(-1) - probs) >= top_p
    remove[0] = False
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(-1)
    probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
    return torch.zeros_like(row).scatter(0, order, probs / probs.sum())


def kept_sets(logits: torch.Tensor, params: list[SamplingParams]):
    seqs = [seq_with(p) for p in params]
    batch = SamplingBatch.from_seqs(seqs, logits.shape[1], set(), torch.device("cpu"))
    scaled = logits / torch.where(batch.temperature == 0, 1.0, batch.temperature).unsqueeze(1)
    weights, ids = sampler_module._top_k_top_p(scaled, batch)
    return [set(ids[row][weights[row] > 0].tolist()) for row in range(len(params))], ids.shape[1]


def test_top_p_candidates_keep_the_full_sort_set_when_enough_and_when_not(monkeypatch):
    monkeypatch.setattr(sampler_module, "TOP_P_CANDIDATES", (16, 64))
    vocab = 1000
    # top-p set of a few tokens
    peaked = torch.randn(vocab, generator=torch.Generator().manual_seed(0)) * 6
    # needs the 64 candidates
    medium = torch.randn(vocab, generator=torch.Generator().manual_seed(1)) * 2.2
    # needs the full sort
    flat = torch.randn(vocab, generator=torch.Generator().manual_seed(2)) * 0.1
    cases = [(peaked, 16), (medium, 64), (flat, vocab)]
    for row, width in cases:
        expected = set(expected_probs(row, 0.7, top_p=0.9).nonzero().squeeze(1).tolist())
        kept, used = kept_sets(row.unsqueeze(0), [SamplingParams(temperature=0.7, top_p=0.9)])
        assert used == width
        assert kept[0] == expected
    # in one batch every row gets its own set, from the widest candidates any row needed
    logits = torch.stack([row for row, _ in cases])
    kept, used = kept_sets(logits, [SamplingParams(temperature=0.7, top_p=0.9)] * 3)
    assert used == vocab
    assert kept == [
        set(expected_probs(row, 0.7, top_p=0.9).nonzero().squeeze(1).tolist()) for row, _ in cases
    ]


def test_top_k_and_top_p_together_match_the_full_sort():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 5000, generator=gen) * 3
    params = [
        SamplingParams(temperature=0.8, top_k=40),
        SamplingParams(temperature=1.2, top_k=300, top_p=0.5),
        SamplingParams(temperature=0.7, top_p=0.95),
        SamplingParams(temperature=0.0),
    ]
    kept, _ = kept_sets(logits, params)
    for row, p, got in zip(logits, params[:3], kept, strict=False):
        assert got == set(
            expected_probs(row, p.temperature, p.top_k, p.top_p).nonzero().squeeze(1).tolist()
        )
    assert kept[3] == {int(logits[3].argmax())}


def draw_frequencies(row: list[float], params: SamplingParams, draws: int = 4000) -> torch.Tensor:
    """Empirical distribution of one row's pick, drawn once per row of a batch of identical rows."""
    seqs = [seq_with(params) for _ in range(draws)]
    tokens = sample([row] * draws, seqs).token_ids
    return torch.bincount(torch.tensor(tokens), minlength=VOCAB).float() / draws


SETTINGS = [
    {"temperature": 0.7},
    {"temperature": 0.7, "top_p": 0.8},
    {"temperature": 1.3, "top_k": 3},
    {"temperature": 1.0, "min_p": 0.2},
    {"temperature": 0.9, "top_k": 4, "top_p": 0.9, "min_p": 0.1},
]


def test_sampled_frequencies_follow_the_definition():
    row = [1.0, 2.0, 1.5, 0.2, -1.0, 0.7]
    for setting in SETTINGS:
        expected = expected_probs(torch.tensor(row), **setting)
        got = draw_frequencies(row, SamplingParams(**setting))
        assert (got - expected).abs().max() < 0.035, (setting, got, expected)
        assert (got[expected == 0] == 0).all()


def test_a_mixed_batch_gives_each_row_its_own_distribution():
    row = [1.0, 2.0, 1.5, 0.2, -1.0, 0.7]
    settings = [*SETTINGS, {"temperature": 0.0}]
    seqs = [
        seq_with(SamplingParams(**settings[i % len(settings)])) for i in range(600 * len(settings))
    ]
    tokens = torch.tensor(sample([row] * len(seqs), seqs).token_ids).view(-1, len(settings))
    for column, setting in enumerate(settings):
        got = torch.bincount(tokens[:, column], minlength=VOCAB).float() / tokens.shape[0]
        if setting["temperature"] == 0:
            assert got[1] == 1.0
            continue
        expected = expected_probs(torch.tensor(row), **setting)
        assert (got - expected).abs().max() < 0.07, (setting, got, expected)
        assert (got[expected == 0] == 0).all()


def test_seeded_sequences_of_draws_do_not_depend_on_the_batch_or_its_filters():
    rows = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(5)).tolist()

    def run(companions):
        seq = seq_with(SamplingParams(temperature=1.0, top_p=0.9, seed=42))
        others = [seq_with(p) for p in companions]
        picks = []
        for step in range(6):
            picks.append(sample([rows[step]] * (1 + len(others)), [seq, *others]).token_ids[0])
            seq.append_token(picks[-1])
        return picks

    alone = run([])
    assert run([SamplingParams(temperature=1.0), SamplingParams(top_k=2, seed=3)]) == alone
    assert run([SamplingParams(temperature=0.0), SamplingParams(min_p=0.3)]) == alone


def test_greedy_takes_the_first_of_tied_maxima_in_any_batch():
    logits = [[0.0, 3.0, 1.0, 3.0, 0.0, 0.0]] * 3
    seqs = [
        seq_with(SamplingParams(temperature=0)),
        seq_with(SamplingParams(temperature=1.0, top_p=0.5, seed=1)),
        seq_with(SamplingParams(temperature=0, repetition_penalty=2.0), prompt=(1,)),
    ]
    assert sample(logits[:1], seqs[:1]).token_ids == [1]
    out = sample(logits, seqs).token_ids
    assert out[0] == 1 and out[2] == 3


def test_top_k_above_the_vocabulary_filters_nothing():
    row = [1.0, 2.0, 1.5, 0.2, -1.0, 0.7]
    got = draw_frequencies(row, SamplingParams(temperature=1.0, top_k=1000))
    assert (got - expected_probs(torch.tensor(row))).abs().max() < 0.035


# --- penalties against the dense definition -------------------------------------------------------


def dense_penalties(logits: torch.Tensor, seqs) -> torch.Tensor:
    """The definition with dense [rows, vocab] masks, as the sampler computed it before."""
    rows, vocab = logits.shape
    prompt_mask = torch.zeros(rows, vocab, dtype=torch.bool)
    counts = torch.zeros(rows, vocab)
    for row, seq in enumerate(seqs):
        prompt_mask[row, torch.tensor(seq.token_ids[: seq.num_prompt_tokens])] = True
        for token in seq.output_token_ids:
            counts[row, token] += 1
    rep = torch.tensor([s.params.repetition_penalty for s in seqs]).unsqueeze(1)
    seen = prompt_mask | (counts > 0)
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    logits = logits - torch.tensor([s.params.frequency_penalty for s in seqs]).unsqueeze(1) * counts
    return (
        logits
        - torch.tensor([s.params.presence_penalty for s in seqs]).unsqueeze(1)
        * (counts > 0).float()
    )


MIXED_PENALTIES = [
    SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=-0.5),
    SamplingParams(),
    SamplingParams(repetition_penalty=0.8),
    SamplingParams(frequency_penalty=-1.0, presence_penalty=2.0),
]
SHARED_PENALTIES = [
    SamplingParams(repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.7)
] * 2 + [SamplingParams()]


@pytest.mark.parametrize("params", [MIXED_PENALTIES, SHARED_PENALTIES], ids=["per-row", "shared"])
def test_sparse_penalties_equal_the_dense_definition_as_sequences_grow(params):
    vocab, gen = 300, torch.Generator().manual_seed(11)
    seqs = [
        seq_with(p, prompt=torch.randint(0, vocab, (50,), generator=gen).tolist()) for p in params
    ]
    for step in range(40):
        logits = torch.randn(len(seqs), vocab, generator=gen) * 3
        penalties = Penalties.from_seqs(seqs, vocab)
        got = logits.clone()
        penalties.apply_(got)
        assert torch.equal(got, dense_penalties(logits, seqs)), step
        for seq in seqs:  # repeats of recent tokens, so counts above 1 happen
            seq.append_token(int(torch.randint(0, 20 if step % 2 else vocab, (1,), generator=gen)))


def test_grouped_topk_equals_torch_topk_even_with_ties():
    gen = torch.Generator().manual_seed(4)
    for rows, vocab, k in [
        (1, 49152, 32),
        (3, 49152, 256),
        (2, 4096, 40),
        (2, 1000, 8),
        (1, 8192, 64),
    ]:
        # many ties
        for logits in (
            torch.randn(rows, vocab, generator=gen),
            torch.randint(0, 50, (rows, vocab), generator=gen).float(),
        ):
            values, ids = fast_topk(logits, k)
            assert torch.equal(values, logits.topk(k, dim=-1).values)
            assert torch.equal(logits.gather(1, ids), values)
            assert all(len(set(row)) == k for row in ids.tolist())


def lm_shaped_logits(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Sorted, a language model's logits fall off as about -2 * ln(1 + rank); ids shuffled."""
    ranks = torch.arange(vocab, dtype=torch.float32)
    profile = -2.0 * torch.log1p(ranks) + 0.3 * torch.randn(rows, vocab, generator=gen)
    order = torch.argsort(torch.rand(rows, vocab, generator=gen), dim=-1)
    return torch.empty(rows, vocab).scatter_(1, order, profile.sort(dim=-1, descending=True).values)


def test_seeded_picks_survive_last_digit_changes_of_the_logits():
    # kernels may give another batch size logits that differ by ~1e-3. A seeded pick should move
    # only near a tie of p / q: here in 0 to 1 of 300 rows, where an inverse-CDF draw over the
    # vocabulary moved in 34
    rows, vocab, gen = 300, 8192, torch.Generator().manual_seed(6)
    logits = lm_shaped_logits(rows, vocab, gen) * 0.7
    nudged = logits + (torch.rand(rows, vocab, generator=gen) - 0.5) * 0.02
    picks = []
    for row_logits in (logits, nudged):
        seqs = [seq_with(SamplingParams(temperature=1.0, seed=i)) for i in range(rows)]
        batch = SamplingBatch.from_seqs(seqs, vocab, set(), torch.device("cpu"))
        picks.append(torch.tensor(Sampler()(row_logits, batch).token_ids))
    assert (picks[0] != picks[1]).sum() <= 6
    assert len(set(picks[0].tolist())) > 20  # real draws, not all the argmax
