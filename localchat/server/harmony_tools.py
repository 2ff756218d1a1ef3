"""gpt-oss's tool calls (the harmony format): a message to `functions.NAME` on the commentary
channel, `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{arguments}<|call|>`.

The chat's reply parser reads harmony replies with `localchat.harmony.HarmonySplitter`, which finds
the calls along with the reasoning; this parser gives `tool_choice` "required" or a named function
its grammar, and reads calls out of a harmony text for the generic tool-call stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar

from localchat.harmony import (
    CALL,
    CHANNEL,
    CONSTRAIN,
    MESSAGE,
    START,
    HarmonySplitter,
    analysis_rules,
    lark_token,
)
from localchat.server.tool_parsers import CallProgress, ToolParser

_COMPACT = {"whitespace_flexible": False}


class HarmonyToolParser(ToolParser):
    name = "harmony"
    marker = " to=functions."
    skip_special_tokens: ClassVar[bool] = False  # the format is made of special tokens

    def find_start(self, text: str) -> int:
        """Where the first message to a function begins (its <|start|>, or the reply's start)."""
        found = text.find(self.marker)
        if found < 0:
            return -1
        start = text.rfind(START, 0, found)
        return start if start >= 0 else 0

    def scan(self, section: str) -> list[CallProgress]:
        splitter = HarmonySplitter()
        splitter.feed(section)
        return [
            CallProgress(call.name, call.arguments, call.done, given=True)
            for call in splitter.calls
        ]

    def grammar(
        self, functions: list[dict[str, Any]], parallel: bool, token_id: Callable[[str], int | None]
    ) -> str:
        """One call (harmony's <|call|> ends the reply, so `parallel` allows no more), after an
        optional message of free thinking: `<|channel|>commentary to=functions.NAME
        <|constrain|>json<|message|>` and arguments that match NAME's schema."""
        t = lambda tag: lark_token(tag, token_id)  # noqa: E731
        end = f" {t(CALL)}" if token_id(CALL) is not None else ""
        rules = [f"start: analysis? ({' | '.join(f'call_{i}' for i in range(len(functions)))})"]
        for i, function in enumerate(functions):
            schema = {**(function.get("parameters") or {"type": "object"}), "x-guidance": _COMPACT}
            header = json.dumps(f"commentary to=functions.{function['name']} ")
            rules.append(
                f'call_{i}: {t(CHANNEL)} {header} {t(CONSTRAIN)} "json" {t(MESSAGE)} '
                f"%json {json.dumps(schema)}{end}"
            )
        return "\n".join([*rules, *analysis_rules(token_id)]) + "\n"
