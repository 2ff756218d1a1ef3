"""Split a streamed reply into thinking (<think>...</think>, as Qwen3 writes it) and the answer."""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ThinkSplitter:
    """Feed reply text as it streams; get back (thinking, answer) pieces.

    A reply that starts with <think> is thinking until </think>. When the prompt itself opened the
    block (`in_thinking=True`, templates that end the generation prompt with <think>), the reply
    starts inside it. A tag split across deltas is held back until it can be told apart from
    ordinary text.
    """

    def __init__(self, in_thinking: bool = False):
        self.state = "thinking" if in_thinking else "start"
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
                self.state = "answer"
        if self.state == "thinking":
            end = buffer.find(CLOSE)
            if end < 0:
                keep = _partial_suffix(buffer, CLOSE)
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
        return (held, "") if self.state == "thinking" else ("", held)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
