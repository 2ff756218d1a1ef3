"""Split a streamed reply into thinking (<think>...</think>, as Qwen3 and DeepSeek-R1 write it, or
gpt-oss's harmony analysis channel: `localchat/harmony.py`) and the answer: one splitter for the TUI
and for the server's `--reasoning-parser`."""

from __future__ import annotations

from localchat.errors import InvalidParameterError
from localchat.harmony import HarmonySplitter, is_harmony_template
from localchat.utils import partial_suffix

OPEN, CLOSE = "<think>", "</think>"
HARMONY = "harmony"
REASONING_PARSERS = ("qwen3", "deepseek_r1", HARMONY)


class ThinkSplitter:
    """Feed reply text as it streams; get back (thinking, answer) pieces.

    A reply that starts with <think> is thinking until </think>. When the prompt itself opened the
    block (`in_thinking=True`, templates that end the generation prompt with <think>), the reply
    starts inside it (a <think> the model writes anyway is dropped). A tag split across deltas is
    held back until it can be told apart from ordinary text.
    """

    def __init__(self, in_thinking: bool = False):
        self.state = "start"
        self._starts_thinking = in_thinking
        self._held = ""
        self._strip_answer_start = False

    def feed(self, text: str) -> tuple[str, str]:
        buffer = self._held + text
        self._held = ""
        thinking = answer = ""
        if self.state == "start":
            stripped = buffer.lstrip()
            if stripped.startswith(OPEN):
                self.state = "thinking"
                buffer = stripped[len(OPEN) :]
            elif OPEN.startswith(stripped):  # maybe the start of the tag: wait for more
                self._held = buffer
                return "", ""
            else:
                self.state = "thinking" if self._starts_thinking else "answer"
        if self.state == "thinking":
            end = buffer.find(CLOSE)
            if end < 0:
                keep = partial_suffix(buffer, CLOSE)
                thinking, self._held = buffer[: len(buffer) - keep], buffer[len(buffer) - keep :]
                return thinking, ""
            thinking, buffer = buffer[:end], buffer[end + len(CLOSE) :]
            self.state, self._strip_answer_start = "answer", True
        if self._strip_answer_start:
            buffer = buffer.lstrip()
            self._strip_answer_start = not buffer
        answer = buffer
        return thinking, answer

    def flush(self) -> tuple[str, str]:
        """What is still held back when the reply ends."""
        held, self._held = self._held, ""
        thinking = self.state == "thinking" or (self.state == "start" and self._starts_thinking)
        return (held, "") if thinking else ("", held)


def reasoning_parser_for(name: str | None, template_source: str | None) -> str | None:
    """The `--reasoning-parser` in effect: the one named, else harmony when the chat template
    writes gpt-oss's harmony format, qwen3 when it mentions <think>, else none."""
    if name:
        if name not in REASONING_PARSERS:
            raise InvalidParameterError(
                f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}",
                param="reasoning_parser",
            )
        return name
    if is_harmony_template(template_source):
        return HARMONY
    return "qwen3" if template_source and OPEN in template_source else None


def starts_thinking(parser: str, prompt_tail: str) -> bool:
    """Whether a reply starts inside the thinking block: deepseek_r1 replies do; qwen3 ones when the
    prompt ends by opening the block."""
    return parser == "deepseek_r1" or prompt_tail.rstrip().endswith(OPEN)


def new_splitter(parser: str, prompt_tail: str) -> ThinkSplitter | HarmonySplitter:
    """A splitter for one reply (`prompt_tail`: the prompt's last tokens, special tokens kept)."""
    if parser == HARMONY:
        return HarmonySplitter(prompt_tail)
    return ThinkSplitter(starts_thinking(parser, prompt_tail))


def reply_thinking(parser: str | None, prompt_tail: str) -> str | None:
    """How a reply may think, for a grammar that must leave the thinking free: "inside" (it starts
    in the block), "maybe" (it may open one first), "harmony" (an optional analysis message comes
    first), or None (no parser, or the prompt closed the block, as templates do with
    enable_thinking=false)."""
    if parser is None or parser == HARMONY:
        return parser
    if starts_thinking(parser, prompt_tail):
        return "inside"
    return None if prompt_tail.rstrip().endswith(CLOSE) else "maybe"
