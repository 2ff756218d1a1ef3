"""The chat's `/json`: replies constrained to JSON (`response_format` json_object) or to the schema
in a file (json_schema), for the in-process engine (an llguidance grammar) and for a server (the
`response_format` field)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat.errors import InvalidParameterError
from localchat.tui.json_files import read_json_file

OFF_WORDS = ("off", "none", "no", "false", "0")


@dataclass(frozen=True)
class JsonMode:
    """What `/json` turned on: a label for the status bar, the `response_format` a server gets,
    the grammar the in-process engine follows, and the schema file it came from (None for any JSON
    object). A conversation keeps it (`to_dict`, without the grammar, which `from_dict` builds
    again), the schema itself included: a resumed chat needs the file no more."""

    label: str
    response_format: dict[str, Any]
    grammar: str
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "response_format": self.response_format, "path": self.path}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JsonMode:
        """The mode `to_dict` saved; one whose schema no longer makes a grammar raises an
        InvalidParameterError."""
        label, response_format, path = data["label"], data["response_format"], data.get("path")
        return cls(label, response_format, _grammar(response_format, path or label), path)

    def notice(self) -> str:
        """What the chat says when the mode is turned on (or comes back with its conversation)."""
        if self.path is None:
            return "JSON on: the next replies are JSON objects (/json off ends it)."
        return f"JSON on: the next replies follow the schema in {self.path} (/json off ends it)."


def _schema_name(path: Path) -> str:
    """The json_schema `name` OpenAI accepts (letters, digits, _ and -, at most 64) from a file."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", path.stem).strip("_")[:64] or "schema"


def _read_schema(path: Path) -> dict[str, Any]:
    schema = read_json_file(path, "/json", "json")
    if not isinstance(schema, dict):
        raise InvalidParameterError(
            f"/json: {path} holds a JSON {type(schema).__name__}, not a schema object",
            param="json",
        )
    return schema


def _grammar(response_format: dict[str, Any], source: str) -> str:
    """The grammar of `response_format`; one that will not do raises an InvalidParameterError
    naming `source` (the schema file)."""
    from localchat.engine.sampling.guided_decoding import validate_grammar
    from localchat.server.structured import response_format_grammar

    try:
        grammar = response_format_grammar(response_format)
        assert grammar is not None  # json_object and json_schema always have one
        validate_grammar(grammar, "response_format")
    except InvalidParameterError as exc:
        detail = exc.message.removeprefix("invalid response_format: ")
        raise InvalidParameterError(
            f"/json: {source} is not a JSON schema replies can follow: {detail}", param="json"
        ) from None
    return grammar


def parse_json_command(args: str) -> JsonMode | None:
    """The mode `/json ARGS` asks for: no argument (or `on`) any JSON object, `off` none, anything
    else the path of a JSON schema file (kept absolute, to say where a resumed chat's schema came
    from). A file that cannot be read, is not JSON, or is not a schema the grammar can follow
    raises an InvalidParameterError saying which."""
    arg = args.strip()
    if arg.lower() in OFF_WORDS:
        return None
    if arg.lower() in ("", "on", "object"):
        response_format: dict[str, Any] = {"type": "json_object"}
        label, source = "JSON", None
    else:
        path = Path(arg).expanduser()
        schema = _read_schema(path)
        spec = {"name": _schema_name(path), "schema": schema}
        response_format, label = {"type": "json_schema", "json_schema": spec}, f"JSON {path.name}"
        source = str(path.absolute())
    return JsonMode(label, response_format, _grammar(response_format, arg), source)
