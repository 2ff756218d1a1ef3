"""Grammars, logit_bias, allowed_token_ids and bad_words on the default model, via the engine."""

from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import pytest

from localchat import SamplingParams
from localchat.engine.sampling.guided_decoding import bitmask_to_bool
from localchat.errors import InvalidParameterError

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def chat(llm, text):
    return llm.render_chat([{"role": "user", "content": text}])


def test_bitmask_to_bool_reads_bits_low_first():
    import torch

    mask = torch.tensor([[0b101, 0], [-1, 1]], dtype=torch.int32)
    allowed = bitmask_to_bool(mask, 40)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2]
    assert allowed[1].nonzero().flatten().tolist() == [*range(32), 32]


def test_grammars_constrain_a_mixed_batch(llm):
    regex = llguidance.LLMatcher.grammar_from_regex(r"(yes|no), because [a-z ]{3,30}\.")
    schema = llguidance.LLMatcher.grammar_from_json_schema(PERSON)
    free = SamplingParams(temperature=0, max_tokens=12)
    outs = llm.generate(
        [chat(llm, "Is the sky blue?"), chat(llm, "Describe a person."), chat(llm, "Hi")],
        [
            SamplingParams(temperature=0, max_tokens=40, grammar=regex),
            SamplingParams(temperature=0.8, seed=3, max_tokens=60, grammar=schema, n=2),
            free,
        ],
    )
    assert re.fullmatch(r"(yes|no), because [a-z ]{3,30}\.", outs[0].outputs[0].text)
    assert outs[0].outputs[0].finish_reason == "stop"
    for sample in outs[1].outputs:  # each sample has its own matcher
        jsonschema.validate(json.loads(sample.text), PERSON)
    # the unconstrained row is what it is alone
    assert outs[2].outputs[0].token_ids == llm.generate([chat(llm, "Hi")], free)[0].token_ids


def test_allowed_token_ids_and_logit_bias(llm):
    prompt = chat(llm, "Say something.")
    allowed = [28, 29, 30]
    out = llm.generate(
        [prompt],
        SamplingParams(
            temperature=1, seed=1, max_tokens=8, ignore_eos=True, allowed_token_ids=allowed
        ),
    )
    assert set(out[0].outputs[0].token_ids) <= set(allowed)
    forced = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=4, logit_bias={42: 100})
    )
    assert forced[0].outputs[0].token_ids == [42] * 4


def test_bad_words_are_never_generated(llm):
    prompt = chat(llm, "What is the capital of France?")
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16))[0].outputs[0].text
    assert "Paris" in free
    banned = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=16, bad_words=["Paris"])
    )
    assert "Paris" not in banned[0].outputs[0].text


def test_token_ids_beyond_the_vocabulary_are_named(llm):
    with pytest.raises(InvalidParameterError) as error:
        llm.generate(["x"], SamplingParams(logit_bias={10**8: 1.0}))
    assert error.value.param == "logit_bias"


def test_a_grammar_that_fails_for_the_tokenizer_raises_offline(llm):
    """llguidance accepts it without a tokenizer but not with this one: generate raises its error
    (was an empty "abort" output) and leaves nothing in the engine."""
    grammar = llguidance.LLMatcher.grammar_from_lark("start: <|nonexistent|>")
    with pytest.raises(InvalidParameterError, match="unknown special token") as error:
        llm.generate(["x", "y"], [SamplingParams(max_tokens=4), SamplingParams(grammar=grammar)])
    assert error.value.param == "grammar"
    assert not llm.engine.requests


def test_a_request_waits_for_its_grammar_while_the_batch_runs(llm, monkeypatch):
    """A grammar compiles off the engine thread: while it compiles, its request waits in the
    scheduler (no token computed) and the other requests keep decoding; then it runs under it."""
    import threading

    engine = llm.engine
    compiler = engine.grammar_compiler
    release = threading.Event()
    build = compiler._build

    def slow_build(grammar):
        assert release.wait(60)
        return build(grammar)

    monkeypatch.setattr(compiler, "_build", slow_build)
    schema = llguidance.LLMatcher.grammar_from_json_schema(PERSON)
    engine.add_request(
        "slow",
        chat(llm, "Describe a person."),
        SamplingParams(temperature=0, max_tokens=60, grammar=schema),
    )
    engine.add_request(
        "free", chat(llm, "Hi"), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    )
    texts: dict[str, str] = {"slow": "", "free": ""}
    finished: set[str] = set()
    while "free" not in finished:
        for output in engine.step():
            texts[output.request_id] += output.outputs[0].text if output.outputs else ""
            if output.finished:
                finished.add(output.request_id)
    slow = engine.requests["slow"].seqs[0]
    assert slow.num_computed_tokens == 0 and texts["slow"] == ""
    release.set()
    while "slow" not in finished:
        for output in engine.step():
            texts[output.request_id] += output.outputs[0].text if output.outputs else ""
            if output.finished:
                finished.add(output.request_id)
    jsonschema.validate(json.loads(texts["slow"]), PERSON)
