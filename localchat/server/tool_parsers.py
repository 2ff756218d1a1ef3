"""Tool-call formats of the model families the engine runs: find the calls in a reply, and build the
grammar that forces a valid call (tool_choice "required" or a named function).

- `hermes`: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Qwen2.5, Qwen3,
  SmolLM-style and Hermes templates);
- `llama3_json`: the reply is `{"name": ..., "parameters": {...}}` (optionally after
  `<|python_tag|>`; several joined by `;`), as Llama 3.1-3.3 templates ask;
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`;
- `harmony` (gpt-oss, `harmony_tools.py`): a commentary message to `functions.NAME`.

Which one a model gets: parser_choice.py.

A call's `arguments` are the JSON text the model wrote for them, so that the fragments streamed as
it writes them (`scan`, read again as the reply grows) concatenate to exactly the final arguments.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from localchat.utils import partial_suffix

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


@dataclass
class CallProgress:
    """One call as far as the reply has written it: its name once complete, and the arguments' JSON
    text so far (`arguments_done` once the value is complete)."""

    name: str | None = None
    arguments: str = ""
    arguments_done: bool = False
    given: bool = False  # the object has an arguments member (valid or not)
    streamable: bool = True  # False when the arguments are a JSON string (sent once complete)


def _skip_space(text: str, position: int, also: str = "") -> int:
    while position < len(text) and (text[position].isspace() or text[position] in also):
        position += 1
    return position


_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)  # one whole JSON string literal
_STRUCTURE = re.compile(r'[{}\[\]"]')  # what nests, or starts a string


def _string_end(text: str, position: int) -> int | None:
    """End of the JSON string starting at `text[position] == '"'`; None when it is not closed.
    (The scans find their way with regexes: a long argument is read again on every token.)"""
    match = _STRING.match(text, position)
    return match.end() if match is not None else None


def _value_end(text: str, position: int) -> int | None:
    """End of the JSON value starting at `position` (bracket-matched, strings skipped, not
    validated); None when `text` ends first."""
    if text[position] == '"':
        return _string_end(text, position)
    if text[position] not in "{[":
        match = _LITERAL.match(text, position)
        assert match is not None
        return match.end() if match.end() < len(text) else None
    depth = 0
    while (found := _STRUCTURE.search(text, position)) is not None:
        char = found.group()
        if char == '"':
            end = _string_end(text, found.start())
            if end is None:
                return None
            position = end
            continue
        depth += 1 if char in "{[" else -1
        position = found.end()
        if depth == 0:
            return position
    return None


def _json_string(text: str) -> str | None:
    """The value of a JSON string literal; None when it does not decode (a bad escape)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None


_ARGUMENT_KEYS = ("arguments", "parameters")
_LITERAL = re.compile(r"[^,\]}\s]*")


def _scan_call(text: str, start: int) -> tuple[CallProgress, int | None]:
    """The call whose object starts at `text[start] == '{'`, and where the object ends (None: not
    yet, or not a well-formed object)."""
    call = CallProgress()
    position = start + 1
    while True:
        position = _skip_space(text, position, ",")
        if position >= len(text):
            return call, None
        if text[position] == "}":
            if not call.given:  # a call without arguments takes none
                call.arguments, call.arguments_done = "{}", True
            return call, position + 1
        if text[position] != '"':
            return call, None
        key_end = _string_end(text, position)
        if key_end is None:
            return call, None
        key = _json_string(text[position:key_end])
        position = _skip_space(text, key_end)
        if position >= len(text) or text[position] != ":":
            return call, None
        position = _skip_space(text, position + 1)
        if position >= len(text):
            return call, None
        end = _value_end(text, position)
        if key == "name" and end is not None:
            call.name = _json_string(text[position:end]) if text[position] == '"' else None
        elif key in _ARGUMENT_KEYS and not call.given:
            call.given = True
            _read_arguments(call, text[position:end] if end is not None else text[position:], end)
        if end is None:
            return call, None
        position = end


def _read_arguments(call: CallProgress, value: str, end: int | None) -> None:
    """Set `call`'s arguments from their value's text (the whole value when `end` is known)."""
    if value.startswith("{"):
        call.arguments, call.arguments_done = value, end is not None
        return
    call.streamable = False
    if end is None:
        return
    try:  # some models write the arguments as a JSON string of JSON text
        decoded = json.loads(value)
        if isinstance(decoded, str):
            json.loads(decoded)
            call.arguments, call.arguments_done = decoded, True
    except json.JSONDecodeError:
        pass


def valid_arguments(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


_DEFINITIONS = ("$defs", "definitions")


def _hoisted(schema: dict[str, Any], prefix: str, definitions: dict[str, Any]) -> dict[str, Any]:
    """`schema` without its definitions, which go into `definitions` under `prefix`, and with its
    `$ref`s (`#`, `#/$defs/...`, `#/definitions/...`) rewritten to point there."""

    def moved(node: Any) -> Any:
        if isinstance(node, list):
            return [moved(item) for item in node]
        if not isinstance(node, dict):
            return node
        node = {key: moved(value) for key, value in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref == "#":
            node["$ref"] = f"#/$defs/{prefix}root"
            definitions[f"{prefix}root"] = root
        elif isinstance(ref, str):
            for key in _DEFINITIONS:
                if ref.startswith(f"#/{key}/"):
                    node["$ref"] = f"#/$defs/{prefix}{ref[len(key) + 3 :]}"
        return node

    root: dict[str, Any] = {}
    root.update(moved({k: v for k, v in schema.items() if k not in _DEFINITIONS}))
    for key in _DEFINITIONS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                definitions[f"{prefix}{name}"] = moved(sub)
    return root


class ToolParser:
    """One format. `find_start` says where the calls begin in a reply (-1: none yet); `scan` reads
    the calls from that point on as far as they are written."""

    name: ClassVar[str]
    args_key: ClassVar[str] = "arguments"
    marker: ClassVar[str]
    skip_special_tokens: ClassVar[bool] = True  # False when the marker is a special token

    def find_start(self, text: str) -> int:
        return text.find(self.marker)

    def held_length(self, text: str) -> int:
        """How much of the end of `text` might begin the marker (held back while streaming)."""
        return partial_suffix(text, self.marker)

    def scan(self, section: str) -> list[CallProgress]:
        """The calls of `section` (which starts where `find_start` pointed), each as far as it is
        written; the list stops at the first call not yet ended."""
        raise NotImplementedError

    def _scan_objects(self, text: str, position: int, separators: str) -> list[CallProgress]:
        """Call objects one after another from `position`, apart by whitespace or `separators`."""
        calls: list[CallProgress] = []
        while True:
            position = _skip_space(text, position, separators)
            if position >= len(text) or text[position] != "{":
                return calls
            call, end = _scan_call(text, position)
            calls.append(call)
            if end is None:
                return calls
            position = end

    def new_id(self) -> str:
        return f"call_{secrets.token_hex(12)}"

    def call_schema(self, functions: list[dict[str, Any]]) -> dict[str, Any]:
        """JSON schema of one call to any of `functions` ({"name", "parameters"} each). The
        definitions of each function's schema move to the top (`$defs`, as f{i}_{name}), where
        its `$ref`s now point."""
        definitions: dict[str, Any] = {}
        options = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": f["name"]},
                    self.args_key: _hoisted(
                        f.get("parameters") or {"type": "object"}, f"f{i}_", definitions
                    ),
                },
                "required": ["name", self.args_key],
                "additionalProperties": False,
            }
            for i, f in enumerate(functions)
        ]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        if definitions:
            schema = {**schema, "$defs": definitions}
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
        """(content, calls) of a whole reply; a reply without a complete, valid call is all
        content."""
        start = self.find_start(text)
        found = self.scan(text[start:]) if start >= 0 else []
        calls = [
            ToolCall(c.name, c.arguments, self.new_id())
            for c in found
            if c.name is not None and c.arguments_done and valid_arguments(c.arguments)
        ]
        if not calls:
            return text, []
        return text[:start].strip() or None, calls


class HermesParser(ToolParser):
    name = "hermes"
    marker = "<tool_call>"
    call_prefix, call_suffix = "<tool_call>\n", "\n</tool_call>"

    def scan(self, section: str) -> list[CallProgress]:
        calls: list[CallProgress] = []
        position = 0
        while (found := section.find(self.marker, position)) >= 0:
            start = _skip_space(section, found + len(self.marker))
            if start >= len(section):
                break
            position = start
            if section[start] != "{":
                continue  # not a call's JSON
            call, end = _scan_call(section, start)
            calls.append(call)
            if end is None:
                break
            position = end
        return calls


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    args_key = "parameters"
    marker = "<|python_tag|>"
    skip_special_tokens = False
    separator = "; "

    def find_start(self, text: str) -> int:
        stripped = text.lstrip()
        if stripped.startswith((self.marker, "{")):
            return len(text) - len(stripped)
        return -1

    def held_length(self, text: str) -> int:
        stripped = text.lstrip()
        return len(text) if not stripped or self.marker.startswith(stripped) else 0

    def scan(self, section: str) -> list[CallProgress]:
        start = _skip_space(section, 0)
        if section.startswith(self.marker, start):
            start += len(self.marker)
        return self._scan_objects(section, start, ";")


class MistralParser(ToolParser):
    name = "mistral"
    marker = "[TOOL_CALLS]"
    skip_special_tokens = False
    _ALPHABET = string.ascii_letters + string.digits

    def new_id(self) -> str:  # Mistral's templates require 9 alphanumeric characters
        return "".join(secrets.choice(self._ALPHABET) for _ in range(9))

    def scan(self, section: str) -> list[CallProgress]:
        start = _skip_space(section, len(self.marker))
        if section.startswith("[", start):
            return self._scan_objects(section, start + 1, ",")
        return self._scan_objects(section, start, "")[:1]

    def grammar(self, functions, parallel, token_id) -> str:
        items = self.call_schema(functions)
        array = {"type": "array", "items": items, "minItems": 1, "x-guidance": _COMPACT}
        if "$defs" in items:  # where the calls' `$ref`s point
            array["$defs"] = items.pop("$defs")
        if not parallel:
            array["maxItems"] = 1
        special = token_id(self.marker)
        marker = f"<[{special}]>" if special is not None else json.dumps(self.marker)
        return f"start: {marker} %json {json.dumps(array)}\n"
