"""Tool-call parsers and the reply parser on fixed texts, whole and fed a character at a time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import llguidance
import pytest

from localchat.reasoning import ThinkSplitter, new_splitter, reasoning_parser_for
from localchat.server import tool_parsers
from localchat.server.chat_reply import ReplyParser
from localchat.server.parser_choice import tool_parser_for
from localchat.server.tool_parsers import HermesParser, Llama3JsonParser, MistralParser

WEATHER = {"city": "Paris", "days": [1, 2]}
CASES = [
    (
        HermesParser(),
        'Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris", '
        '"days": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "time", "arguments": {}}\n'
        "</tool_call>",
        "Let me check.",
    ),
    (
        Llama3JsonParser(),
        '<|python_tag|>{"name": "weather", "parameters": {"city": "Paris", "days": [1, 2]}}; '
        '{"name": "time", "parameters": {}}',
        None,
    ),
    (
        MistralParser(),
        '[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Paris", "days": [1, 2]}}, '
        '{"name": "time", "arguments": {}}]',
        None,
    ),
]


@pytest.mark.parametrize("parser,text,content", CASES, ids=[c[0].name for c in CASES])
def test_extract_and_stream_agree(parser, text, content):
    got_content, calls = parser.extract(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("weather", WEATHER),
        ("time", {}),
    ]
    assert len({c.id for c in calls}) == 2
    reply = ReplyParser(None, parser)
    streamed, headers, fragments = "", [], {}
    for position, char in enumerate(text):
        piece = reply.feed(char, final=position == len(text) - 1)
        streamed += piece.content
        for delta in piece.calls:
            if delta.id is not None:
                headers.append((delta.index, delta.name))
            fragments.setdefault(delta.index, []).append(delta.arguments)
    assert headers == [(0, "weather"), (1, "time")]
    assert streamed.strip() == (content or "")
    # the arguments come a character at a time, and join to exactly the final arguments
    assert len(fragments[0]) > 10
    assert ["".join(fragments[i]) for i in (0, 1)] == [c.arguments for c in calls]
    assert [c.arguments for c in reply.calls] == [c.arguments for c in calls]
    assert reply.finish_reason("stop") == "tool_calls"


def test_stream_holds_a_call_until_its_name_and_keeps_raw_arguments():
    parser = HermesParser()
    reply = ReplyParser(None, parser)
    assert reply.feed('<tool_call>\n{"arguments": {"a": [1, {"b": "}"}]}, "na').calls == []
    piece = reply.feed('me": "f"}\n</tool_call>', final=True)
    assert [(d.index, d.name, d.arguments) for d in piece.calls] == [
        (0, "f", '{"a": [1, {"b": "}"}]}')
    ]
    # arguments written as a JSON string are decoded, and sent whole
    reply = ReplyParser(None, parser)
    text = '<tool_call>{"name": "g", "arguments": "{\\"x\\": 1}"}</tool_call>'
    deltas = [d for c in text for d in reply.feed(c).calls] + reply.feed("", final=True).calls
    assert [d.arguments for d in deltas] == ["", '{"x": 1}']
    # arguments that are not JSON text, or cut off by the end of a whole reply: not a call
    assert parser.extract('<tool_call>{"name": "g", "arguments": "{x"}</tool_call>')[1] == []
    assert [c.arguments for c in parser.extract('<tool_call>{"name": "g"}</tool_call>')[1]] == [
        "{}"
    ]
    assert parser.extract('<tool_call>{"name": "g", "arguments": {"x"')[1] == []


def test_text_without_calls_is_content():
    for parser in (HermesParser(), Llama3JsonParser(), MistralParser()):
        assert parser.extract("Just words <tool") == ("Just words <tool", [])
        reply = ReplyParser(None, parser)
        text = (
            "".join(reply.feed(c).content for c in "Hello <tool_cal") + reply.feed("", True).content
        )
        assert text == "Hello <tool_cal"
        assert reply.finish_reason("stop") == "stop"
    # a cut-off call that is not JSON stays text
    assert HermesParser().extract("<tool_call>\n{not json")[1] == []


@pytest.mark.parametrize("parser", [HermesParser(), Llama3JsonParser(), MistralParser()])
def test_forced_call_grammars_compile(parser):
    functions = [{"name": "weather", "parameters": {"type": "object"}}, {"name": "time"}]
    for parallel in (False, True):
        grammar = llguidance.LLMatcher.grammar_from_lark(
            parser.grammar(functions, parallel, lambda text: None)
        )
        assert llguidance.LLMatcher.validate_grammar_with_warnings(grammar) == (False, [])


def test_parser_choice():
    assert tool_parser_for(None, "{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert tool_parser_for(None, "<|python_tag|>").name == "llama3_json"
    assert tool_parser_for(None, "<tool_call>").name == "hermes"
    assert tool_parser_for("mistral", "<tool_call>").name == "mistral"
    assert reasoning_parser_for(None, "{{ '<think>' }}") == "qwen3"
    assert reasoning_parser_for(None, "plain") is None


def test_reasoning_then_tool_call():
    reply = ReplyParser(new_splitter("qwen3", "<|im_start|>assistant\n"), HermesParser())
    text = (
        '<think>\nNeed weather.\n</think>\n\n<tool_call>\n{"name": "w", "arguments": {}}\n'
        "</tool_call>"
    )
    reasoning, content, calls = "", "", []
    for position, char in enumerate(text):
        piece = reply.feed(char, final=position == len(text) - 1)
        reasoning, content, calls = (
            reasoning + piece.reasoning,
            content + piece.content,
            calls + piece.calls,
        )
    assert reasoning.strip() == "Need weather." and content == "" and calls[0].name == "w"


def test_deepseek_r1_starts_thinking_and_drops_a_written_tag():
    for text in ("I think.</think>Done.", "<think>I think.</think>Done."):
        splitter = new_splitter("deepseek_r1", "")
        thinking, answer = splitter.feed(text)
        held = splitter.flush()
        assert (thinking + held[0], answer + held[1]) == ("I think.", "Done.")
    # the TUI's use: a splitter opened by the prompt
    assert ThinkSplitter(in_thinking=True).feed("abc</think>x") == ("abc", "x")


def _stream_call(lines: int) -> tuple[list, str, int]:
    """A call writing a file of `lines` lines, fed ~4 characters a token: the pieces, the code, and
    how many lines of Python the server's parsers ran for it (sys.settrace's line events: a count,
    not a time)."""
    code = "x = 1\\n" * lines
    text = f'<tool_call>\n{{"name": "write", "arguments": {{"code": "{code}"}}}}\n</tool_call>'
    reply = ReplyParser(None, HermesParser())
    server = str(Path(tool_parsers.__file__).parent)
    executed = 0

    def count(frame, event, arg):
        nonlocal executed
        executed += event == "line"
        return count

    sys.settrace(lambda frame, *_: count if frame.f_code.co_filename.startswith(server) else None)
    try:
        pieces = [reply.feed(text[i : i + 4]) for i in range(0, len(text), 4)]
        pieces.append(reply.feed("", final=True))
    finally:
        sys.settrace(None)
    return pieces, code, executed // len(pieces)


def test_long_arguments_and_bad_escapes_stream():
    pieces, code, per_token = _stream_call(2000)  # a file an agent writes, 14,000 characters
    arguments = "".join(d.arguments for p in pieces for d in p.calls)
    assert json.loads(arguments) == {"code": code.replace("\\n", "\n")}
    # the reply is read again on every token, by regexes: the Python run per token does not grow
    # with the arguments (a scan in Python, character by character, would run 4x the lines of a
    # 500-line file's tokens here)
    _, _, short_per_token = _stream_call(500)
    assert per_token < 1.5 * short_per_token, (per_token, short_per_token)
    # a key or name that is not a valid JSON string is no call, not an error
    for bad in ('{"na\\q": "f", "arguments": {}}', '{"name": "f\\q", "arguments": {}}'):
        reply = ReplyParser(None, HermesParser())
        piece = reply.feed(f"<tool_call>{bad}</tool_call>", final=True)
        assert piece.calls == [] and "<tool_call>" in piece.content
