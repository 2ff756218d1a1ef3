"""End to end on the default model: every sampling parameter, n > 1, seeds, stops and aborts."""

from __future__ import annotations

import pytest

from localchat import SamplingParams
from localchat.errors import (
    EmptyPromptError,
    InvalidParameterError,
    ModelNotFoundError,
    PromptTooLongError,
)

pytestmark = pytest.mark.slow

PROMPT = "Write a short poem about the moon."


def chat_ids(llm, text=PROMPT):
    return llm.render_chat([{"role": "user", "content": text}])


def gen(llm, prompt, **params):
    return llm.generate([prompt], SamplingParams(**params))[0]


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm):
    prompt = chat_ids(llm)
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=24)
    alone = llm.generate([prompt], params)[0].token_ids
    companions = [chat_ids(llm, "Count to ten."), prompt, chat_ids(llm, "Name a fruit.")]
    crowd = llm.generate(
        companions,
        [
            SamplingParams(temperature=1.0, max_tokens=30),
            params,
            SamplingParams(temperature=0.8, seed=5, max_tokens=10),
        ],
    )
    assert crowd[1].token_ids == alone
    other_seed = llm.generate([prompt], SamplingParams(temperature=1.0, seed=99, max_tokens=24))[0]
    assert other_seed.token_ids != alone


def test_temperature_zero_is_greedy_and_sampling_differs(llm):
    prompt = chat_ids(llm)
    greedy = gen(llm, prompt, temperature=0, max_tokens=32).token_ids
    assert gen(llm, prompt, temperature=0, max_tokens=32).token_ids == greedy
    sampled = [gen(llm, prompt, temperature=1.5, seed=s, max_tokens=32).token_ids for s in range(3)]
    assert any(s != greedy for s in sampled)


@pytest.mark.parametrize("filters", [{"top_k": 1}, {"top_p": 0.001}, {"min_p": 1.0}])
def test_filters_that_keep_one_token_equal_greedy(llm, filters):
    prompt = chat_ids(llm)
    greedy = gen(llm, prompt, temperature=0, max_tokens=32).token_ids
    assert gen(llm, prompt, temperature=1.5, seed=3, max_tokens=32, **filters).token_ids == greedy


def test_penalties_change_a_repetitive_greedy_output(llm):
    prompt = llm.engine.tokenize("1, 2, 3, 4, 5, 6, 7, 8,")
    plain = gen(llm, prompt, temperature=0, max_tokens=24, ignore_eos=True).token_ids
    # (presence_penalty's exact effect is checked in test_sampler.py; on digits it is too weak to
    # show here)
    for penalty in ({"repetition_penalty": 1.8}, {"frequency_penalty": 1.5}):
        penalized = gen(
            llm, prompt, temperature=0, max_tokens=24, ignore_eos=True, **penalty
        ).token_ids
        assert penalized != plain, penalty
        assert len(set(penalized)) > len(set(plain)), penalty


def test_max_tokens_min_tokens_and_ignore_eos(llm):
    prompt = chat_ids(llm, "What is 2+2? Answer with a number only.")
    short = gen(llm, prompt, temperature=0, max_tokens=64)
    assert short.outputs[0].finish_reason == "stop" and len(short.token_ids) < 64
    assert short.token_ids[-1] in llm.engine.eos_token_ids
    capped = gen(llm, prompt, temperature=0, max_tokens=3)
    assert len(capped.token_ids) == 3 and capped.outputs[0].finish_reason == "length"
    at_least = gen(llm, prompt, temperature=0, max_tokens=64, min_tokens=len(short.token_ids) + 5)
    assert len(at_least.token_ids) >= len(short.token_ids) + 5
    through = gen(
        llm,
        prompt,
        temperature=0,
        max_tokens=len(short.token_ids) + 8,
        ignore_eos=True,
        skip_special_tokens=False,
    )
    assert len(through.token_ids) == len(short.token_ids) + 8
    assert through.token_ids[len(short.token_ids) - 1] in llm.engine.eos_token_ids
    assert "<|im_end|>" in through.text


def test_stop_strings_and_stop_token_ids(llm):
    prompt = llm.engine.tokenize("1, 2, 3, 4,")
    full = gen(llm, prompt, temperature=0, max_tokens=20)
    assert " 7," in full.text
    stopped = gen(llm, prompt, temperature=0, max_tokens=20, stop=[" 7"])
    assert stopped.text == full.text[: full.text.index(" 7")]
    assert stopped.outputs[0].finish_reason == "stop" and stopped.outputs[0].stop_reason == " 7"
    kept = gen(
        llm, prompt, temperature=0, max_tokens=20, stop=[" 7"], include_stop_str_in_output=True
    )
    assert kept.text == full.text[: full.text.index(" 7") + 2]
    stop_id = full.token_ids[1]
    first = full.token_ids.index(stop_id)
    by_token = gen(llm, prompt, temperature=0, max_tokens=20, stop_token_ids=[stop_id])
    assert (
        by_token.token_ids == full.token_ids[: first + 1]
        and by_token.outputs[0].stop_reason == stop_id
    )


def test_logprobs_with_alternatives(llm):
    out = gen(llm, chat_ids(llm), temperature=0, max_tokens=8, logprobs=5)
    logprobs = out.outputs[0].logprobs
    assert len(logprobs) == len(out.token_ids) == 8
    for token, lp in zip(out.token_ids, logprobs, strict=True):
        assert lp.token_id == token and lp.rank == 1 and len(lp.top) == 5
        assert lp.top[0][0] == token and abs(lp.top[0][1] - lp.logprob) < 1e-5 and lp.logprob <= 0
    assert out.outputs[0].cumulative_logprob == pytest.approx(sum(lp.logprob for lp in logprobs))
    assert gen(llm, chat_ids(llm), max_tokens=2).outputs[0].cumulative_logprob is None


def test_n_samples_share_the_prompt(llm):
    prompt = chat_ids(llm, "Give me a random animal name. " * 4)
    bm = llm.engine.block_manager
    hits_before = bm.prefix_cache_hits
    out = gen(llm, prompt, n=3, temperature=1.2, seed=11, max_tokens=16)
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    full_blocks = (len(prompt) - 1) // 16 * 16
    # samples 2 and 3 took all of sample 1's full prompt blocks (sample 1 may have found a cached
    # prefix)
    assert bm.prefix_cache_hits - hits_before == out.num_cached_tokens + 2 * full_blocks
    assert bm.num_free_blocks == bm.num_blocks


def test_abort_frees_every_block(llm):
    engine = llm.engine
    engine.add_request("to-abort", chat_ids(llm), SamplingParams(max_tokens=200, n=2))
    engine.add_request("to-finish", chat_ids(llm, "Hi"), SamplingParams(max_tokens=4))
    for _ in range(3):
        engine.step()
    final = engine.abort("to-abort")
    assert final.finished and {o.finish_reason for o in final.outputs} == {"abort"}
    while engine.has_unfinished():
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert engine.abort("to-abort") is None


def test_bad_input_names_the_problem(llm):
    with pytest.raises(PromptTooLongError, match=r"8000.*500.*8192"):
        llm.generate([[1] * 8000], SamplingParams(max_tokens=500))
    with pytest.raises(PromptTooLongError, match="8192"):
        llm.generate([[1] * 8192])
    with pytest.raises(EmptyPromptError):
        llm.generate([""])
    with pytest.raises(InvalidParameterError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(InvalidParameterError, match="token ids"):
        llm.generate([[10**9]])
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_unknown_model_path_is_named():
    from localchat import LLM

    with pytest.raises(ModelNotFoundError, match="no/such/model"):
        LLM("./no/such/model")
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        LLM("nobody/no-such-model")


def test_prompt_logprobs_cover_every_prompt_token_across_chunks_and_cached_prefixes(llm):
    # ~700 tokens: longer than one prefill chunk (512), so two chunks fill the list
    ids = llm.engine.tokenize("The quick brown fox jumps over the lazy dog. " * 70)
    assert len(ids) > llm.engine.scheduler.max_num_batched_tokens
    gen(llm, ids, temperature=0, max_tokens=1)  # the prompt's blocks are now in the prefix cache
    out = gen(llm, ids, temperature=0, max_tokens=2, prompt_logprobs=3)
    # every position's logits were computed, none taken from the cache
    assert out.num_cached_tokens == 0
    reference = llm.engine.prompt_logits(ids).log_softmax(dim=-1)
    entries = out.prompt_logprobs
    assert len(entries) == len(ids) and entries[0] is None
    for position, entry in enumerate(entries[1:], start=1):
        row = reference[position - 1]
        assert entry.token_id == ids[position]
        assert entry.logprob == pytest.approx(row[ids[position]].item(), abs=1e-3)
        assert (entry.rank == 1) == (entry.token_id == entry.top[0][0])
        assert [t for t, _ in entry.top] == row.topk(3).indices.tolist()
    assert gen(llm, ids, temperature=0, max_tokens=2).prompt_logprobs is None
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


@pytest.mark.parametrize("max_tokens", [1, 2])
def test_prompt_logprobs_come_with_a_single_new_token(llm, max_tokens):
    """lm-evaluation-harness scores a prompt with max_tokens=1: the step that computes the prompt
    also samples and finishes the sequence, and the prompt's logprobs still come with it."""
    ids = llm.engine.tokenize("The quick brown fox")
    out = gen(llm, ids, temperature=0, max_tokens=max_tokens, prompt_logprobs=1)
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(ids)
    assert out.prompt_logprobs[0] is None and all(e is not None for e in out.prompt_logprobs[1:])


def test_vllm_prompt_dicts_are_prompts(llm):
    """vLLM's TextPrompt and TokensPrompt dicts, alone or in a list, give the same text as the
    string or the token ids; a dict with other keys is refused, naming them."""
    ids = chat_ids(llm)
    greedy = SamplingParams(temperature=0, max_tokens=8)
    want = llm.generate([ids, PROMPT], greedy)
    got = llm.generate([{"prompt_token_ids": ids}, {"prompt": PROMPT}], greedy)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert llm.generate({"prompt_token_ids": ids}, greedy)[0].token_ids == want[0].token_ids
    with pytest.raises(InvalidParameterError, match="multi_modal_data"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {}}, greedy)
    with pytest.raises(InvalidParameterError, match="prompt_token_ids"):
        llm.generate([{"prompt_token_ids": "not ids"}], greedy)
    with pytest.raises(InvalidParameterError, match="token ids"):
        llm.generate([{"prompt_token_ids": [10**9]}], greedy)
    with pytest.raises(InvalidParameterError, match="got int"):
        llm.generate([PROMPT, 7], greedy)
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_vllm_idioms_get_tokenizer_and_a_progress_bar(llm, capsys):
    """vLLM's llm.get_tokenizer() and generate(..., use_tqdm=True): the bar counts the prompts done,
    on stderr, and the outputs are those without it."""
    assert llm.get_tokenizer() is llm.tokenizer
    greedy = SamplingParams(temperature=0, max_tokens=4)
    prompts = [PROMPT, "Name three colours."]
    quiet = llm.generate(prompts, greedy)
    assert capsys.readouterr().err == ""
    shown = llm.generate(prompts, greedy, use_tqdm=True)
    assert "Processed prompts" in capsys.readouterr().err
    assert [o.token_ids for o in shown] == [o.token_ids for o in quiet]
    chat = llm.chat([{"role": "user", "content": PROMPT}], greedy, use_tqdm=True)
    assert "1/1" in capsys.readouterr().err and chat[0].token_ids


@pytest.mark.parametrize(
    "conversations", [None, "hello", [], [[]], [[{"role": "user", "content": "x"}], []]]
)
def test_chat_names_conversations_it_cannot_take(llm, conversations):
    with pytest.raises(InvalidParameterError, match="conversation") as raised:
        llm.chat(conversations, SamplingParams(max_tokens=2))
    assert raised.value.param == "conversations"
