"""One chat choice's reply, parsed as it streams: reasoning (`<think>`) split off first, then tool
calls found in the answer; the rest is content."""

from __future__ import annotations

from dataclasses import dataclass, field

from localchat.reasoning import ThinkSplitter
from localchat.server.tool_parsers import ToolCall, ToolParser


@dataclass
class ReplyPiece:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


class ToolStream:
    """Feeds reply text through a tool parser: content passes through (a possible start of the
    call marker held back), and each call is handed out once it is complete."""

    def __init__(self, parser: ToolParser):
        self.parser = parser
        self.pending = ""
        self.section: str | None = None
        self.emitted = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        content = ""
        if self.section is None:
            buffer = self.pending + text
            self.pending = ""
            start = self.parser.find_start(buffer)
            if start < 0:
                hold = 0 if final else self.parser.held_length(buffer)
                self.pending = buffer[len(buffer) - hold :] if hold else ""
                return buffer[: len(buffer) - hold], []
            content, self.section = buffer[:start], buffer[start:]
        else:
            self.section += text
        calls = self.parser.parse_calls(self.section, final)
        new = calls[self.emitted :]
        self.emitted = len(calls)
        if final and self.emitted == 0:  # no call could be read: it was text after all
            content += self.section
            self.section = ""
        return content, new


class ReplyParser:
    """Reasoning and tool calls of one choice; `feed` each text delta, `finish` at the end."""

    def __init__(self, splitter: ThinkSplitter | None, tools: ToolParser | None):
        self.splitter = splitter
        self.tools = ToolStream(tools) if tools is not None else None
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> ReplyPiece:
        piece = ReplyPiece()
        answer = text
        if self.splitter is not None:
            piece.reasoning, answer = self.splitter.feed(text)
            if final:
                held_reasoning, held_answer = self.splitter.flush()
                piece.reasoning += held_reasoning
                answer += held_answer
        if self.tools is not None:
            answer, piece.calls = self.tools.feed(answer, final)
            self.num_calls += len(piece.calls)
        piece.content = answer
        return piece

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.num_calls else reason
