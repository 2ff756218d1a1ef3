"""Chat templates render exactly as transformers does; a second turn reuses the first turn's KV."""

from __future__ import annotations

import pytest

from localchat import LLM, SamplingParams
from localchat.engine.core.chat_template import ChatTemplate
from localchat.errors import InvalidParameterError

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about ünïcödé 😀."},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendering_equals_apply_chat_template(llm, messages, add_generation_prompt):
    tokenizer = llm.tokenizer
    expected = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    template = llm.engine.runtime.chat_template
    assert template.render(messages, add_generation_prompt=add_generation_prompt) == expected
    ids = llm.render_chat(messages, add_generation_prompt=add_generation_prompt)
    assert ids == tokenizer.encode(expected, add_special_tokens=False)


def test_override_template_file_and_kwargs(llm, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(
        "{% for m in messages %}[{{ m['role'] }}|{{ m['content'] | tojson }}]{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
        "{{ eos_token }}"
    )
    template = ChatTemplate.for_tokenizer(llm.tokenizer, str(path))
    text = template.render(
        [{"role": "user", "content": [{"type": "text", "text": "é"}]}], enable_thinking=False
    )
    assert text == '[user|"é"]<nothink><|im_end|>'


def test_continue_final_message(llm):
    template = llm.engine.runtime.chat_template
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well, I"}]
    text = template.render(messages, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nWell, I")


def test_bad_messages_are_rejected(llm):
    template = llm.engine.runtime.chat_template
    with pytest.raises(InvalidParameterError, match="role"):
        template.render([{"role": "wizard", "content": "x"}])
    with pytest.raises(InvalidParameterError, match="content"):
        template.render([{"role": "user", "content": [{"type": "image_url"}]}])


@pytest.mark.slow
def test_second_turn_reuses_the_first_turns_blocks(llm):
    params = SamplingParams(temperature=0, max_tokens=48)
    turn1 = [{"role": "user", "content": "Describe a cat in three sentences."}]
    first = llm.chat(turn1, params)[0]
    history_ids = first.prompt_token_ids + first.token_ids
    turn2 = [
        *turn1,
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "Now describe a dog the same way."},
    ]
    second = llm.chat(turn2, params)[0]
    prompt2 = second.prompt_token_ids
    common = next(
        (i for i, (a, b) in enumerate(zip(history_ids, prompt2, strict=False)) if a != b),
        len(history_ids),
    )
    assert common >= len(first.prompt_token_ids)  # turn 2 starts with all of turn 1's prompt
    block = llm.engine.config.block_size
    assert second.num_cached_tokens == min(common, len(prompt2) - 1) // block * block
    assert second.num_cached_tokens >= len(first.prompt_token_ids) // block * block

    uncached = LLM(enable_prefix_caching=False)
    assert uncached.chat(turn2, params)[0].token_ids == second.token_ids


def test_chat_renders_the_tools_it_is_given(llm, tmp_path, monkeypatch):
    """LLM.chat(tools=...) as vLLM's: the functions reach the chat template (one listing them)."""
    path = tmp_path / "tools.jinja"
    path.write_text(
        "{% for t in tools or [] %}<tool:{{ t['function']['name'] }}>{% endfor %}"
        "{% for m in messages %}[{{ m['role'] }}|{{ m['content'] }}]{% endfor %}"
    )
    monkeypatch.setattr(
        llm.engine.codec, "chat_template", ChatTemplate.for_tokenizer(llm.tokenizer, str(path))
    )
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    params = SamplingParams(temperature=0, max_tokens=2)
    out = llm.chat(messages, params, tools=tools)[0]
    assert llm.tokenizer.decode(out.prompt_token_ids).startswith("<tool:get_weather>[user|")
    plain = llm.chat(messages, params)[0]
    assert llm.tokenizer.decode(plain.prompt_token_ids).startswith("[user|")
