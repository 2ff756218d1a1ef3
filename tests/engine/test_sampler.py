"""Sampler math on hand-made logits: each parameter changes the pick the way it should."""

import torch

from localchat.engine.sampler import Sampler, SamplingBatch
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.sequence import Request

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
    assert sample(logits, [seq_with(once, output=(1,))]).token_ids == [1]       # 3.0 - 0.5 > 2.2
    assert sample(logits, [seq_with(once, output=(1, 1))]).token_ids == [2]     # 3.0 - 1.0 < 2.2


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
    seqs = [seq_with(SamplingParams(temperature=1.0, top_k=1, seed=1)),
            seq_with(SamplingParams(temperature=1.0, top_p=0.01, seed=2)),
            seq_with(SamplingParams(temperature=1.0, min_p=1.0, seed=3)),
            seq_with(SamplingParams(temperature=1.0, top_k=2, top_p=0.5, seed=4))]
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
    logits = torch.randn(3, VOCAB).tolist()
    alone = sample(logits[:1], [seq_with(SamplingParams(seed=42))]).token_ids
    crowd = sample(logits, [seq_with(SamplingParams(seed=42)), seq_with(SamplingParams()),
                            seq_with(SamplingParams(seed=9))]).token_ids
    assert crowd[0] == alone[0]


def test_logprobs_report_the_chosen_token_and_sorted_alternatives():
    logits = [[0.0, 3.0, 2.0, 1.0, 0.0, 0.0]]
    out = sample(logits, [seq_with(SamplingParams(temperature=0, logprobs=3))])
    lp = out.logprobs[0]
    expected = torch.tensor(logits[0]).log_softmax(-1)
    assert lp.token_id == 1 and lp.rank == 1
    assert abs(lp.logprob - expected[1].item()) < 1e-6
    assert [t for t, _ in lp.top] == [1, 2, 3]
    assert all(a >= b for (_, a), (_, b) in zip(lp.top, lp.top[1:]))
    assert sample(logits, [seq_with(SamplingParams(temperature=0))]).logprobs == [None]
