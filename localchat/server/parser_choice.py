"""Which parsers read a model's replies: the tool-call format (tool_parsers.py, harmony_tools.py)
and the reasoning parser (localchat/reasoning.py), each named by `--tool-call-parser` and
`--reasoning-parser` or implied by the chat template."""

from __future__ import annotations

from localchat.errors import InvalidParameterError
from localchat.harmony import is_harmony_template
from localchat.reasoning import HARMONY, reasoning_parser_for
from localchat.server.harmony_tools import HarmonyToolParser
from localchat.server.tool_parsers import HermesParser, Llama3JsonParser, MistralParser, ToolParser


def parsers() -> dict[str, type[ToolParser]]:
    """Every format by its name."""
    formats = (HermesParser, Llama3JsonParser, MistralParser, HarmonyToolParser)
    return {parser.name: parser for parser in formats}


def tool_parser_for(name: str | None, template_source: str | None) -> ToolParser:
    """The parser named by `--tool-call-parser`, else the one the chat template's text implies
    (Hermes when it says nothing)."""
    known = parsers()
    if name:
        if name not in known:
            raise InvalidParameterError(
                f"unknown tool-call parser {name!r}; choose one of {', '.join(known)}",
                param="tool_call_parser",
            )
        return known[name]()
    source = template_source or ""
    if is_harmony_template(source):
        return known["harmony"]()
    if "[TOOL_CALLS]" in source:
        return MistralParser()
    if "<|python_tag|>" in source or "ipython" in source:
        return Llama3JsonParser()
    return HermesParser()


def chat_parsers(
    tool_call_parser: str | None, reasoning_parser: str | None, template_source: str | None
) -> tuple[ToolParser, str | None]:
    """The tool-call parser and the reasoning parser in effect (each named, or implied by the chat
    template). Harmony's reasoning and tool calls are read together: naming harmony for one of
    them picks it for the other, and naming another parser for the other is an error."""
    tools = tool_parser_for(tool_call_parser, template_source)
    reasoning = reasoning_parser_for(reasoning_parser, template_source)
    if (tools.name == HARMONY) == (reasoning == HARMONY):
        return tools, reasoning
    if tool_call_parser is None and reasoning == HARMONY:
        return tool_parser_for(HARMONY, template_source), reasoning
    if reasoning_parser is None and tools.name == HARMONY:
        return tools, HARMONY
    raise InvalidParameterError(
        "harmony's reasoning and tool calls are parsed together: name harmony for both "
        "--tool-call-parser and --reasoning-parser, or for neither",
        param="tool_call_parser"
        if tool_call_parser and tools.name != HARMONY
        else "reasoning_parser",
    )
