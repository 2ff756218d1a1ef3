"""gpt-oss's harmony format on fixed texts: the splitter and the chat's reply parser, whole and fed
a character at a time; the forced-call and final-answer grammars on a tokenizer with harmony's
special tokens; the parsers a harmony template picks; assistant messages rendered back."""

from __future__ import annotations

import llguidance
import pytest

from localchat.engine.core.chat_template import ChatTemplate
from localchat.errors import InvalidParameterError
from localchat.harmony import HarmonySplitter, harmony_stop_ids, is_harmony_template
from localchat.reasoning import new_splitter, reasoning_parser_for
from localchat.server.chat_reply import ReplyParser
from localchat.server.harmony_tools import HarmonyToolParser
from localchat.server.parser_choice import chat_parsers, tool_parser_for
from localchat.server.protocol import ChatMessage
from localchat.server.structured import after_reasoning
from localchat.server.tools import template_messages
from tests.chat_families import template_source, tokenizer

PROMPT_TAIL = "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant"
THINK = "<|channel|>analysis<|message|>The user asks about the weather. Use get_weather.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris."
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city":"Paris","days":[1,2]}'
)


def _whole(text: str, tools=True, tail: str = PROMPT_TAIL):
    reply = ReplyParser(new_splitter("harmony", tail), HarmonyToolParser() if tools else None)
    return reply, reply.feed(text, final=True)


def _streamed(text: str, tools=True, tail: str = PROMPT_TAIL):
    """Fed a character at a time: (reasoning, content, {index: (id, name)}, {index: arguments})."""
    reply = ReplyParser(new_splitter("harmony", tail), HarmonyToolParser() if tools else None)
    reasoning = content = ""
    names: dict[int, tuple[str, str]] = {}
    arguments: dict[int, str] = {}
    for position, char in enumerate(text):
        piece = reply.feed(char, final=position == len(text) - 1)
        reasoning += piece.reasoning
        content += piece.content
        for delta in piece.calls:
            if delta.id is not None:
                names[delta.index] = (delta.id, delta.name)
            arguments[delta.index] = arguments.get(delta.index, "") + delta.arguments
    return reply, reasoning, content, names, arguments


def test_analysis_is_reasoning_and_final_is_content():
    text = THINK + FINAL
    reply, piece = _whole(text)
    assert piece.reasoning == "The user asks about the weather. Use get_weather."
    assert piece.content == "It is sunny in Paris."
    assert piece.calls == [] and reply.finish_reason("stop") == "stop"
    _, reasoning, content, names, _ = _streamed(text)
    assert (reasoning, content, names) == (piece.reasoning, piece.content, {})
    # the reply ended by its stop token kept in the text (include_stop_str_in_output)
    assert _whole(text + "<|return|>")[1].content == "It is sunny in Paris."


def test_a_call_to_a_function_is_a_tool_call():
    text = THINK + CALL
    reply, piece = _whole(text)
    assert piece.reasoning == "The user asks about the weather. Use get_weather."
    assert piece.content == ""
    assert [(c.name, c.arguments) for c in reply.calls] == [
        ("get_weather", '{"city":"Paris","days":[1,2]}')
    ]
    assert reply.finish_reason("stop") == "tool_calls"
    streamed, reasoning, content, names, arguments = _streamed(text)
    assert (reasoning, content) == (piece.reasoning, "")
    assert [name for _, name in names.values()] == ["get_weather"]
    assert arguments == {0: '{"city":"Paris","days":[1,2]}'}  # streamed, joined to the whole
    assert names[0][0] == streamed.calls[0].id


@pytest.mark.parametrize(
    "header",
    [
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>",
        "<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>",
        "<|start|>assistant<|channel|>commentary to=functions.get_weather<|constrain|>json"
        "<|message|>",
    ],
    ids=["recipient-in-role", "no-content-type", "constrain-unspaced"],
)
def test_the_recipient_may_stand_in_the_role_or_the_channel(header):
    reply, _ = _whole(THINK + header + '{"city":"Oslo"}<|call|>')
    assert [(c.name, c.arguments) for c in reply.calls] == [("get_weather", '{"city":"Oslo"}')]


def test_preamble_builtin_tools_and_several_thoughts():
    text = (
        "<|channel|>analysis<|message|>First.<|end|>"
        '<|start|>assistant<|channel|>analysis to=browser.search<|message|>{"query":"x"}<|end|>'
        "<|start|>assistant<|channel|>analysis<|message|>Second.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Checking the weather.<|end|>" + CALL
    )
    reply, piece = _whole(text)
    # built-in tools (browser, python) are part of the thinking; messages join with a newline
    assert piece.reasoning == 'First.\n{"query":"x"}\nSecond.'
    assert piece.content == "Checking the weather."  # a preamble is for the user
    assert [c.name for c in reply.calls] == ["get_weather"]
    assert _streamed(text)[1:3] == (piece.reasoning, piece.content)


def test_without_tools_a_call_is_content_and_bad_arguments_are_no_call():
    text = THINK + CALL
    reply, piece = _whole(text, tools=False)
    assert (piece.content, reply.calls) == ('{"city":"Paris","days":[1,2]}', [])
    reply, piece = _whole(THINK + CALL.replace('{"city"', "{city"))
    assert reply.calls == [] and piece.content.startswith("{city")
    assert reply.finish_reason("stop") == "stop"


def test_cut_off_replies_and_replies_that_are_not_harmony():
    # cut in the thinking, in a header, after a message
    assert _whole("<|channel|>analysis<|message|>Hmm, the wea")[1].reasoning == "Hmm, the wea"
    piece = _whole(THINK + "<|start|>assistant<|channel|>fin")[1]
    assert (piece.content, piece.reasoning.endswith("get_weather.")) == ("", True)
    # no harmony at all: content, streamed as it comes (not held to the end)
    splitter = HarmonySplitter(PROMPT_TAIL)
    assert splitter.feed("Hello") == ("", "Hello")
    assert splitter.feed(" there") == ("", " there")
    assert _streamed("Hello <|end|> there")[2] == "Hello <|end|> there"
    # a tag split across deltas is held back, never shown as text
    splitter = HarmonySplitter(PROMPT_TAIL)
    pieces = [splitter.feed(p) for p in ("<|chan", "nel|>final<|mess", "age|>Hi<|re", "turn|>")]
    assert "".join(answer for _, answer in pieces) == "Hi"


def test_the_prompt_may_open_the_reply_s_message():
    # a prompt that ends inside a final message (a prefilled answer): the reply continues it
    tail = "<|start|>assistant<|channel|>final<|message|>The answer is"
    assert _whole(" 42.<|return|>", tail=tail)[1].content == " 42."
    # a prompt with no open message: the reply opens its own
    assert _whole("<|start|>assistant" + FINAL[len("<|start|>assistant") :], tail="")[1].content


def _harmony_tokenizer():
    return tokenizer("gpt-oss")


def _matcher(grammar: str, tok):
    eos = [tok.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")]
    ll = llguidance.LLTokenizer(tok.backend_tokenizer.to_str(), n_vocab=len(tok), eos_token=eos)
    matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def _accepts(matcher, tok, text: str) -> bool:
    """Whether the grammar takes `text` (special tokens written as their text) to its end."""
    for token_id in tok.encode(text, add_special_tokens=False):
        if not matcher.consume_token(token_id):
            return False
    return matcher.is_stopped() or matcher.is_accepting()


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
CALL_HEADER = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
FUNCTIONS = [{"name": "get_weather", "parameters": WEATHER}, {"name": "get_time"}]


@pytest.mark.parametrize(
    "text,ok",
    [
        (
            CALL_HEADER + '{"city":"Oslo"}<|call|>',
            True,
        ),
        (
            THINK
            + "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json"
            "<|message|>{}<|call|>",
            True,
        ),
        ("<|channel|>final<|message|>Sunny.<|return|>", False),
        (
            CALL_HEADER + '{"town":"Oslo"}<|call|>',
            False,
        ),
        (
            "<|channel|>commentary to=functions.get_news <|constrain|>json<|message|>{}<|call|>",
            False,
        ),
    ],
    ids=["call", "thought-then-call", "final-answer", "schema", "unknown-function"],
)
def test_the_forced_call_grammar(text, ok):
    tok = _harmony_tokenizer()
    grammar = HarmonyToolParser().grammar(FUNCTIONS, True, tok.get_added_vocab().get)
    assert _accepts(_matcher(llguidance.LLMatcher.grammar_from_lark(grammar), tok), tok, text) == ok


def test_the_final_answer_grammar_leaves_the_thinking_free():
    tok = _harmony_tokenizer()
    answer = llguidance.LLMatcher.grammar_from_json_schema(WEATHER)
    grammar = after_reasoning(answer, "harmony", tok.get_added_vocab().get)
    for text, ok in [
        (THINK + '<|start|>assistant<|channel|>final<|message|>{"city":"Oslo"}<|return|>', True),
        ('<|channel|>final<|message|>{"city":"Oslo"}<|return|>', True),
        ("<|channel|>final<|message|>Oslo<|return|>", False),
        ('<|channel|>commentary<|message|>{"city":"Oslo"}<|return|>', False),
    ]:
        assert _accepts(_matcher(grammar, tok), tok, text) == ok, text


def test_a_harmony_template_picks_the_harmony_parsers():
    source = template_source("gpt-oss")
    assert is_harmony_template(source) and not is_harmony_template("<think>")
    assert reasoning_parser_for(None, source) == "harmony"
    assert tool_parser_for(None, source).name == "harmony"
    tools, reasoning = chat_parsers(None, "harmony", "<tool_call>")  # one named picks the other
    assert (tools.name, reasoning) == ("harmony", "harmony")
    assert chat_parsers("harmony", None, None)[1] == "harmony"
    with pytest.raises(InvalidParameterError) as error:
        chat_parsers("hermes", "harmony", source)
    assert error.value.param == "tool_call_parser"
    with pytest.raises(InvalidParameterError) as error:
        chat_parsers(None, "qwen3", source)
    assert error.value.param == "reasoning_parser"


def test_stop_tokens():
    ids = {"<|return|>": 7, "<|call|>": 9}
    assert harmony_stop_ids([3], ids.get, (7,)) == [3, 9]
    assert harmony_stop_ids(None, ids.get, (7, 9)) == []
    assert harmony_stop_ids(None, lambda _: None, ()) == []


def test_assistant_turns_render_back_into_the_harmony_template():
    """An assistant message as the API returned it (reasoning_content, tool_calls with JSON text
    arguments) and the tool's result go back through the template as gpt-oss expects them: the
    thinking before the call, the call on the commentary channel, the result from the function."""
    tok = _harmony_tokenizer()
    template = ChatTemplate.for_tokenizer(tok)
    assert template is not None
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(role="assistant", content=None, tool_calls=[call], reasoning_content="Look."),
        ChatMessage(role="tool", tool_call_id="call_1", content='{"sunny": true}'),
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    prompt = template.render(template_messages(messages), tools=tools)
    assert prompt.endswith(
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Look.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
        '"{\\"sunny\\": true}"<|end|><|start|>assistant'
    )
    assert "<|start|>developer<|message|># Instructions\n\nBe brief." in prompt
    # `reasoning` (vLLM's other name) works too; a finished turn's thinking is dropped
    answered = [
        *messages[1:],
        ChatMessage(role="assistant", content="Sunny.", reasoning="It is sunny."),
        ChatMessage(role="user", content="Thanks"),
    ]
    prompt = template.render(template_messages(answered), tools=tools)
    assert "Look." not in prompt and "It is sunny." not in prompt
    assert "<|start|>assistant<|channel|>final<|message|>Sunny.<|end|>" in prompt
    assert template_messages(answered)[3]["thinking"] == "It is sunny."
