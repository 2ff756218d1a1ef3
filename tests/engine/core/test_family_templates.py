"""Each family's chat format (tests/chat_families.py): a conversation rendered by localchat's
ChatTemplate equals transformers' apply_chat_template on the same tokenizer; a template without a
system role gets Gemma's documented fallback (the system text opens the first user message), other
rejections stay a 400 naming the problem; and generation stops at each of the family's end-of-turn
tokens, in the family's own architecture (a bigram model that writes "Hi", the end token, then
"LEAK" if it is not stopped)."""

from __future__ import annotations

import pytest

from localchat import LLM, SamplingParams
from localchat.engine.core.chat_template import ChatTemplate
from localchat.errors import InvalidParameterError
from tests.chat_families import FORMATS, STEER, pairs, save_bigram, token, tokenizer

SYSTEM = {"role": "system", "content": "You are terse."}
TURNS = [
    {"role": "user", "content": "Why is the sky blue?"},
    {"role": "assistant", "content": "Rayleigh scattering."},
    {"role": "user", "content": "And at sunset? ünïcödé 😀"},
]
# templates that have no system role: the conversation they render is the fallback's
NO_SYSTEM_ROLE = {"gemma2", "mixtral"}


def _merged(messages: list[dict]) -> list[dict]:
    """Gemma's documented fallback, written out: the system text, a blank line, the first user
    message."""
    first = {**messages[1], "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"}
    return [first, *messages[2:]]


@pytest.mark.parametrize("family", list(FORMATS))
@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["prompt", "no-prompt"])
def test_rendering_equals_apply_chat_template(family, add_generation_prompt):
    tok = tokenizer(family)
    template = ChatTemplate.for_tokenizer(tok)
    assert template is not None
    messages = [SYSTEM, *TURNS]
    if family in NO_SYSTEM_ROLE:  # transformers refuses the system message; localchat merges it
        with pytest.raises(Exception, match=r"System role|alternate"):
            tok.apply_chat_template(messages, tokenize=False)
        reference = _merged(messages)
    else:
        reference = messages
    expected = tok.apply_chat_template(
        reference, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    text = template.render(messages, add_generation_prompt=add_generation_prompt)
    assert text == expected
    assert "You are terse." in text and "ünïcödé 😀" in text
    for special in FORMATS[family].specials:  # the special tokens stay single tokens
        if special in text:
            assert token(tok, special) in tok.encode(text, add_special_tokens=False)


def test_thinking_switch_reaches_the_template():
    template = ChatTemplate.for_tokenizer(tokenizer("smollm3"))
    assert template is not None
    off = template.render(TURNS, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert template.render(TURNS).endswith("<|im_start|>assistant\n")


def test_system_fallback_and_what_stays_an_error():
    template = ChatTemplate.for_tokenizer(tokenizer("gemma2"))
    assert template is not None
    # system and developer messages both open the first user message, in order
    text = template.render([SYSTEM, {"role": "developer", "content": "Use metric units."}, *TURNS])
    assert (
        "<start_of_turn>user\nYou are terse.\n\nUse metric units.\n\nWhy is the sky blue?" in text
    )
    # a system message alone becomes the user's message
    assert "<start_of_turn>user\nYou are terse.<end_of_turn>" in template.render([SYSTEM])
    # a conversation the template refuses for another reason keeps the template's own error
    with pytest.raises(InvalidParameterError) as error:
        template.render([SYSTEM, TURNS[0], TURNS[0]])
    assert "alternate" in error.value.message and error.value.param == "messages"
    # a template with a system role is never given the fallback
    chatml = ChatTemplate.for_tokenizer(tokenizer("qwen3-moe"))
    assert chatml is not None
    assert chatml.render([SYSTEM, *TURNS]).startswith("<|im_start|>system\nYou are terse.")


@pytest.fixture(scope="module", params=list(FORMATS))
def bigram(request, tmp_path_factory):
    """The family's bigram model: after the generation prompt "Hi", then the family's first
    end-of-turn token (another one when a request steers to it), then "LEAK" forever."""
    family = request.param
    tok = tokenizer(family, words=("Hi", "LEAK"))
    messages = [SYSTEM, TURNS[0]]
    prompt = ChatTemplate.for_tokenizer(tok).render(messages)  # type: ignore[union-attr]
    last = tok.encode(prompt, add_special_tokens=False)[-1]
    hi, leak = token(tok, "Hi"), token(tok, "LEAK")
    ends = [token(tok, t) for t in FORMATS[family].end_of_turn]
    chain = [*pairs([last, hi, ends[0], leak, leak]), *((end, leak) for end in ends[1:])]
    directory = save_bigram(
        family, tok, tmp_path_factory.mktemp(family), chain, [(hi, end) for end in ends[1:]]
    )
    llm = LLM(str(directory), max_model_len=512, kv_cache_memory="16MiB")
    return family, llm, messages, ends


def test_generation_stops_at_each_end_of_turn_token(bigram):
    family, llm, messages, ends = bigram
    assert set(llm.engine.model_info.eos_token_ids) == set(ends)
    for position, end in enumerate(ends):
        bias = {end: STEER} if position else None
        params = SamplingParams(temperature=0, max_tokens=6, logit_bias=bias)
        out = llm.chat(messages, params)[0].outputs[0]  # the system message too (the fallback)
        assert (out.text, out.finish_reason) == ("Hi", "stop"), (family, end)
        assert out.token_ids[-1] == end
    # not stopped, the model goes on past the end token: the stop above was the end token's
    go_on = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    out = llm.chat(messages, go_on)[0].outputs[0]
    assert (out.text, out.finish_reason) == ("HiLEAKLEAK", "length")


def test_a_template_kept_only_in_the_processors_file_is_read(tmp_path):
    """SmolVLM's and Idefics3's repositories may keep their template only in chat_template.json
    (the processor's), which transformers' tokenizers do not load: the engine reads it there."""
    import json

    from transformers import AutoTokenizer

    source = tokenizer("smollm3")
    source.chat_template = None
    source.save_pretrained(tmp_path)
    template = FORMATS["smollm3"]
    (tmp_path / "chat_template.json").write_text(
        json.dumps({"chat_template": tokenizer("smollm3").chat_template})
    )
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert not loaded.chat_template  # transformers' tokenizer leaves it out
    found = ChatTemplate.for_tokenizer(loaded)
    assert found is not None and found.source == tokenizer("smollm3").chat_template
    assert template.eos in found.render(TURNS[:1], add_generation_prompt=False)
