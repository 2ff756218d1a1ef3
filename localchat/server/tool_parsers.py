"""Tool-call formats of the model families the engine runs: find the calls in a reply, and build the
grammar that forces a valid call (tool_choice "required" or a named function).

- `hermes`: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Qwen2.5, Qwen3,
  SmolLM-style and Hermes templates);
- `llama3_json`: the reply is `{"name": ..., "parameters": {...}}` (optionally after
  `<|python_tag|>`; several joined by `;`), as Llama 3.1-3.3 templates ask;
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from localchat.errors import InvalidParameterError
from localchat.reasoning import partial_suffix

_COMPACT = {"whitespace_flexible": False}


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it
    id: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def _call(obj: Any, args_key: str, new_id: Callable[[], str]) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False), new_id())


class ToolParser:
    """One format. `find_start` says where the calls begin in a reply (-1: none yet);
    `parse_calls` reads the complete calls from that point on (with `final`, also a call cut off by
    the end of the reply)."""

    name: ClassVar[str]
    args_key: ClassVar[str] = "arguments"
    marker: ClassVar[str]
    skip_special_tokens: ClassVar[bool] = True  # False when the marker is a special token

    def find_start(self, text: str) -> int:
        return text.find(self.marker)

    def held_length(self, text: str) -> int:
        """How much of the end of `text` might begin the marker (held back while streaming)."""
        return partial_suffix(text, self.marker)

    def parse_calls(self, section: str, final: bool) -> list[ToolCall]:
        raise NotImplementedError

    def new_id(self) -> str:
        return f"call_{secrets.token_hex(12)}"

    def call_schema(self, functions: list[dict[str, Any]]) -> dict[str, Any]:
        """JSON schema of one call to any of `functions` ({"name", "parameters"} each)."""
        options = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": f["name"]},
                    self.args_key: f.get("parameters") or {"type": "object"},
                },
                "required": ["name", self.args_key],
                "additionalProperties": False,
            }
            for f in functions
        ]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return {**schema, "x-guidance": _COMPACT}

    # the text around each call and between parallel calls, for the default grammar
    call_prefix: ClassVar[str] = ""
    call_suffix: ClassVar[str] = ""
    separator: ClassVar[str] = "\n"

    def grammar(
        self, functions: list[dict[str, Any]], parallel: bool, token_id: Callable[[str], int | None]
    ) -> str:
        """A Lark grammar (llguidance's) of one call, or with `parallel` one or more."""
        schema = json.dumps(self.call_schema(functions))
        start = f"start: call ({json.dumps(self.separator)} call)*" if parallel else "start: call"
        around = [json.dumps(text) if text else "" for text in (self.call_prefix, self.call_suffix)]
        return f"{start}\ncall: {around[0]} %json {schema} {around[1]}\n"

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole reply; a reply without a parseable call is all content."""
        start = self.find_start(text)
        calls = self.parse_calls(text[start:], final=True) if start >= 0 else []
        if not calls:
            return text, []
        return text[:start].strip() or None, calls


def _decode_objects(text: str, separators: str, final: bool) -> list[Any]:
    """Consecutive JSON values in `text` separated by whitespace or `separators`; stops at the first
    that does not decode (yet)."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    position = 0
    while True:
        while position < len(text) and (text[position].isspace() or text[position] in separators):
            position += 1
        if position >= len(text):
            return values
        try:
            value, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return values
        values.append(value)


class HermesParser(ToolParser):
    name = "hermes"
    marker = "<tool_call>"
    _complete = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def parse_calls(self, section: str, final: bool) -> list[ToolCall]:
        bodies = [m.group(1) for m in self._complete.finditer(section)]
        tail = section.rfind("</tool_call>")
        rest = section[tail + len("</tool_call>") :] if tail >= 0 else section
        if final and self.marker in rest:
            bodies.append(rest[rest.find(self.marker) + len(self.marker) :].strip())
        calls = []
        for body in bodies:
            try:
                call = _call(json.loads(body), self.args_key, self.new_id)
            except json.JSONDecodeError:
                call = None
            if call is not None:
                calls.append(call)
        return calls

    call_prefix, call_suffix = "<tool_call>\n", "\n</tool_call>"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    args_key = "parameters"
    marker = "<|python_tag|>"
    skip_special_tokens = False

    def find_start(self, text: str) -> int:
        stripped = text.lstrip()
        if stripped.startswith((self.marker, "{")):
            return len(text) - len(stripped)
        return -1

    def held_length(self, text: str) -> int:
        stripped = text.lstrip()
        return len(text) if not stripped or self.marker.startswith(stripped) else 0

    def parse_calls(self, section: str, final: bool) -> list[ToolCall]:
        section = section.strip().removeprefix(self.marker)
        objects = _decode_objects(section, ";", final)
        return [c for c in (_call(o, self.args_key, self.new_id) for o in objects) if c]

    separator = "; "


class MistralParser(ToolParser):
    name = "mistral"
    marker = "[TOOL_CALLS]"
    skip_special_tokens = False
    _ALPHABET = string.ascii_letters + string.digits

    def new_id(self) -> str:  # Mistral's templates require 9 alphanumeric characters
        return "".join(secrets.choice(self._ALPHABET) for _ in range(9))

    def parse_calls(self, section: str, final: bool) -> list[ToolCall]:
        values = _decode_objects(section[len(self.marker) :], "", final)
        if not values:
            return []
        items = values[0] if isinstance(values[0], list) else [values[0]]
        return [c for c in (_call(o, self.args_key, self.new_id) for o in items) if c]

    def grammar(self, functions, parallel, token_id) -> str:
        items = self.call_schema(functions)
        array = {"type": "array", "items": items, "minItems": 1, "x-guidance": _COMPACT}
        if not parallel:
            array["maxItems"] = 1
        special = token_id(self.marker)
        marker = f"<[{special}]>" if special is not None else json.dumps(self.marker)
        return f"start: {marker} %json {json.dumps(array)}\n"


PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser for parser in (HermesParser, Llama3JsonParser, MistralParser)
}


def tool_parser_for(name: str | None, template_source: str | None) -> ToolParser:
    """The parser named by `--tool-call-parser`, else the one the chat template's text implies
    (Hermes when it says nothing)."""
    if name:
        if name not in PARSERS:
            raise InvalidParameterError(
                f"unknown tool-call parser {name!r}; choose one of {', '.join(PARSERS)}",
                param="tool_call_parser",
            )
        return PARSERS[name]()
    source = template_source or ""
    if "[TOOL_CALLS]" in source:
        return MistralParser()
    if "<|python_tag|>" in source or "ipython" in source:
        return Llama3JsonParser()
    return HermesParser()
