"""One chat choice's reply, parsed as it streams: reasoning (`<think>`) split off first, then tool
calls found in the answer; the rest is content. A harmony reply (gpt-oss) is split in one pass:
its analysis channel is the reasoning, its calls to functions the tool calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localchat.harmony import HarmonySplitter
from localchat.reasoning import ThinkSplitter
from localchat.server.tool_parsers import CallProgress, ToolCall, ToolParser, valid_arguments


@dataclass
class ToolCallDelta:
    """A piece of one streamed call: its first carries the id and name, the others a fragment of the
    arguments (the fragments of a call concatenate to its arguments)."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is None:
            return {"index": self.index, "function": function}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, **function},
        }


@dataclass
class ReplyPiece:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


class ToolStream:
    """Feeds reply text through a tool parser: content passes through (a possible start of the
    call marker held back); a call is announced (id and name) once its name is written, and its
    arguments follow as the model writes them.

    At the end, calls not yet announced whose arguments are incomplete or not a JSON object are
    dropped; a reply in which no call was announced is all content."""

    def __init__(self, parser: ToolParser):
        self.parser = parser
        self.pending = ""
        self.section: str | None = None
        self.calls: list[ToolCall] = []  # announced, with the arguments sent so far

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCallDelta]]:
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
        deltas = self.advance(self.parser.scan(self.section), final)
        if final and not self.calls:  # no call could be read: it was text after all
            content += self.section
            self.section = ""
        return content, deltas

    def advance(self, found: list[CallProgress], final: bool) -> list[ToolCallDelta]:
        """The deltas that bring the announced calls up to `found` (the calls as far as written)."""
        deltas = []
        for index, progress in enumerate(found):
            if index == len(self.calls):
                if progress.name is None or (
                    final and not (progress.arguments_done and valid_arguments(progress.arguments))
                ):
                    break  # not (or never) a call
                self.calls.append(ToolCall(progress.name, "", self.parser.new_id()))
                call = self.calls[index]
                deltas.append(ToolCallDelta(index, "", call.id, call.name))
            call = self.calls[index]
            if not (progress.streamable or progress.arguments_done):
                continue
            fragment = progress.arguments[len(call.arguments) :]
            if fragment:
                call.arguments += fragment
                if deltas and deltas[-1].index == index:
                    deltas[-1].arguments += fragment
                else:
                    deltas.append(ToolCallDelta(index, fragment))
        return deltas


class ReplyParser:
    """Reasoning and tool calls of one choice; `feed` each text delta (the last with `final`)."""

    def __init__(self, splitter: ThinkSplitter | HarmonySplitter | None, tools: ToolParser | None):
        self.splitter = splitter
        self.tools = ToolStream(tools) if tools is not None else None
        self.harmony = splitter if isinstance(splitter, HarmonySplitter) else None
        if self.harmony is not None:
            self.harmony.calls_to_answer = tools is None

    def feed(self, text: str, final: bool = False) -> ReplyPiece:
        piece = ReplyPiece()
        answer = text
        if self.splitter is not None:
            piece.reasoning, answer = self.splitter.feed(text)
            if final:
                held_reasoning, held_answer = self.splitter.flush()
                piece.reasoning += held_reasoning
                answer += held_answer
        if self.harmony is not None and self.tools is not None:
            answer += self._harmony_calls(piece, final)
        elif self.tools is not None:
            answer, piece.calls = self.tools.feed(answer, final)
        piece.content = answer
        return piece

    def _harmony_calls(self, piece: ReplyPiece, final: bool) -> str:
        """Announce and stream the harmony splitter's calls; at the end, the arguments of a call
        that never became one (not a JSON object) are content."""
        assert self.harmony is not None and self.tools is not None
        found = [
            CallProgress(call.name, call.arguments, call.done or final, given=True)
            for call in self.harmony.calls
        ]
        piece.calls = self.tools.advance(found, final)
        if not final:
            return ""
        return "".join(call.arguments for call in found[len(self.tools.calls) :])

    @property
    def calls(self) -> list[ToolCall]:
        """The calls announced so far, with the arguments streamed so far (all of them at the
        end)."""
        return self.tools.calls if self.tools is not None else []

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.calls else reason
