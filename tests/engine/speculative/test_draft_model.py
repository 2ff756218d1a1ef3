"""The draft_model method: a second model with the same tokenizer drafts greedily, with a paged KV
cache of its own kept in step with each sequence. Verification is the other methods', so greedy and
seeded outputs equal the engine's without speculation; the default model drafting for itself has
almost every draft accepted, which checks that the draft's KV follows each sequence (prefill,
rollback to what was accepted, continuous batching)."""

from __future__ import annotations

import json
import shutil

import pytest

from localchat import LLM, SamplingParams
from tests.engine.speculative.test_speculative import prompts, tokens


def draft_spec(model, **more) -> dict:
    return {"method": "draft_model", "model": str(model), "num_speculative_tokens": 4, **more}


@pytest.fixture(scope="module")
def draft_llm(default_gguf):
    """The default model drafting for itself; two sequence slots, so sequences join and leave
    while others decode."""
    return LLM(speculative_config=draft_spec(default_gguf), max_num_seqs=2)


def counts(llm) -> tuple[int, int]:
    stats = llm.engine.stats()
    return stats.spec_draft_tokens_total, stats.spec_accepted_tokens_total


def assert_released(llm) -> None:
    """Every shadow's blocks are back in the draft's pool once its sequence ended."""
    draft = llm.engine.speculator.draft_model
    assert not draft.shadows
    assert draft.block_manager.num_free_blocks == draft.block_manager.num_blocks


def test_the_model_drafting_for_itself_keeps_the_tokens_and_nearly_every_draft(llm, draft_llm):
    batch = prompts(llm)
    params = SamplingParams(temperature=0, max_tokens=32)
    before = counts(draft_llm)
    spec = draft_llm.generate(batch, params)
    drafted, accepted = (b - a for a, b in zip(before, counts(draft_llm), strict=True))
    assert tokens(spec) == tokens(llm.generate(batch, params))
    assert drafted > 60 and accepted / drafted > 0.9, (drafted, accepted)
    assert_released(draft_llm)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=24, min_tokens=16, n=2),
        # the model's penalties, which the draft does not apply, reject drafts inside their runs
        SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.5),
        SamplingParams(temperature=0, max_tokens=40, stop=["result.extend", "7"]),
        SamplingParams(temperature=0, max_tokens=6),  # drafts cut to the tokens left
        SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=16, n=2),
    ],
    ids=["n2", "penalty", "stop", "max_tokens", "seeded"],
)
def test_sampling_options_keep_the_tokens(llm, draft_llm, params):
    batch = prompts(llm)[:2]
    spec = draft_llm.generate(batch, params)
    plain = llm.generate(batch, params)
    assert tokens(spec) == tokens(plain)
    assert [[o.finish_reason for o in r.outputs] for r in spec] == [
        [o.finish_reason for o in r.outputs] for r in plain
    ]
    assert_released(draft_llm)


def test_an_abort_frees_the_drafts_blocks(draft_llm):
    engine = draft_llm.engine
    engine.add_request("aborted", "Count from 1 to 100:", SamplingParams(temperature=0))
    for _ in range(4):
        engine.step()
    assert engine.speculator.draft_model.shadows
    engine.abort("aborted")
    engine.step()  # the next step's drafting sweeps the shadows of sequences that ended
    assert_released(draft_llm)


def test_a_draft_model_with_another_vocabulary_is_refused(default_gguf, tiny_qwen3):
    with pytest.raises(Exception, match=r"speculative_config\.model: .*vocabulary of 512 tokens"):
        LLM(speculative_config=draft_spec(tiny_qwen3))


@pytest.fixture(scope="module")
def random_draft(llm, tmp_path_factory):
    """A two-layer model of random weights with the default model's config and tokenizer: its
    drafts are nearly all rejected."""
    source = llm.engine.runtime.files.directory
    path = tmp_path_factory.mktemp("random-draft")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, path / name)
    config = json.loads((source / "config.json").read_text())
    config["num_hidden_layers"] = 2
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_a_draft_that_is_mostly_wrong_keeps_the_tokens(llm, random_draft):
    """Rejections roll the draft's KV back; a small token budget prefills the draft's prompts in
    chunks."""
    spec_llm = LLM(
        speculative_config=draft_spec(random_draft, load_format="dummy", adaptive=False),
        max_num_batched_tokens=32,
        max_num_seqs=2,
    )
    batch = prompts(llm)[:3]
    params = SamplingParams(temperature=0, max_tokens=20)
    assert tokens(spec_llm.generate(batch, params)) == tokens(llm.generate(batch, params))
    drafted, accepted = counts(spec_llm)
    assert drafted > 60 and accepted < drafted / 2, (drafted, accepted)
    assert_released(spec_llm)
