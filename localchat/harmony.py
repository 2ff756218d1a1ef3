"""OpenAI's harmony format (gpt-oss): split a reply, as it streams, into its analysis channel (the
reasoning), its final and commentary text (the answer) and its function calls.

A harmony reply is a run of messages, each `<|start|>{header}<|message|>{body}` ended by `<|end|>`,
`<|return|>` or `<|call|>`; the first one's `<|start|>assistant` is in the prompt. The header names
the channel (`<|channel|>analysis`, `final`, `commentary`) and, for a tool call, its recipient
(`to=functions.get_weather`, in the role part or after the channel) and content type
(`<|constrain|>json`). The splitter reads the reply's text with its special tokens kept (the server
and the chat detokenize harmony replies with `skip_special_tokens=False`).

Where each message goes: `analysis` and calls to built-in tools (`to=browser.search`, `to=python`)
to the reasoning; `final` and `commentary` without a recipient (a preamble to the user) to the
answer; `to=functions.NAME` to a call of NAME whose arguments are the body. Several messages of one
destination are joined by a newline. A reply that does not open with a harmony header is all answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from localchat.utils import partial_suffix

START, END, MESSAGE = "<|start|>", "<|end|>", "<|message|>"
CHANNEL, CONSTRAIN, RETURN, CALL = "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"
# what ends a message's body (a <|start|> without an <|end|> before it ends it too)
_BODY_ENDS = (END, RETURN, CALL, START)
# the tokens that end a reply: generation stops at them (gpt-oss lists them as its EOS tokens)
STOP_TOKENS = (RETURN, CALL)
FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"(?:^|\s)to=(\S+)")


def is_harmony_template(source: str | None) -> bool:
    """Whether a chat template writes the harmony format (gpt-oss's)."""
    return source is not None and CHANNEL in source and START in source


@dataclass
class HarmonyCall:
    """A call of a function as far as the reply has written it: `arguments` grow with the body,
    `done` once the message has ended."""

    name: str
    arguments: str = ""
    done: bool = False


@dataclass
class _Header:
    channel: str
    recipient: str | None

    @property
    def function(self) -> str | None:
        recipient = self.recipient
        if recipient and recipient.startswith(FUNCTIONS) and len(recipient) > len(FUNCTIONS):
            return recipient[len(FUNCTIONS) :]
        return None

    @property
    def is_reasoning(self) -> bool:
        """Chain of thought, and the calls of built-in tools the model makes while thinking."""
        return self.channel == "analysis" or (self.recipient is not None and self.function is None)


def _parse_header(text: str) -> _Header:
    """The channel and recipient of a header: everything between <|start|> (or the reply's
    beginning) and <|message|>, e.g. `assistant to=functions.f<|channel|>commentary json` or
    `<|channel|>commentary to=functions.f <|constrain|>json`."""
    flat = text.replace(CONSTRAIN, " ").replace(CHANNEL, " <channel> ")
    recipient = match.group(1) if (match := _RECIPIENT.search(flat)) else None
    channel = ""
    if "<channel>" in flat:
        words = flat.split("<channel>", 1)[1].split()
        channel = words[0] if words and not words[0].startswith("to=") else ""
    return _Header(channel, recipient)


def _longest_partial(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is a proper beginning of one of `tags`."""
    return max(partial_suffix(text, tag) for tag in tags)


def _plausible_header_start(text: str) -> bool:
    """Whether a reply's first text can begin the header of a message whose role the prompt gave:
    a special token (<|channel|>) or a recipient (` to=`)."""
    return any(prefix.startswith(text[: len(prefix)]) for prefix in ("<|", " to=", "to="))


class HarmonySplitter:
    """Feed a harmony reply's text as it streams; get back (reasoning, answer) pieces, as the
    `<think>` splitter gives them, and the function calls in `calls`.

    `prompt_tail` is the end of the prompt with its special tokens: a message the prompt opened
    (`...<|start|>assistant`, as the template's generation prompt ends) is the one the reply
    continues. With `calls_to_answer`, a call's body goes to the answer instead (when the request
    asked for no tool calls to be parsed)."""

    def __init__(self, prompt_tail: str = "", calls_to_answer: bool = False):
        self.calls: list[HarmonyCall] = []
        self.calls_to_answer = calls_to_answer
        self._held = ""  # text not yet placed (a tag may be starting, or a header is incomplete)
        self._header_given = 0  # how much of the held header came from the prompt
        self._plain = False  # the reply is not harmony: all answer
        self._first = True
        self._header: _Header | None = None  # of the message whose body is being read
        self._wrote = {"reasoning": False, "answer": False}
        self._separate = False  # a newline is due before the current message's first text
        self.state = "header"
        start = prompt_tail.rfind(START)
        if start >= 0 and not any(end in prompt_tail[start:] for end in (END, RETURN, CALL)):
            header = prompt_tail[start + len(START) :]
            if MESSAGE in header:  # the prompt wrote the message's beginning: the reply goes on
                self._open(header[: header.find(MESSAGE)])
            else:
                self._held, self._header_given = header, len(header)

    # --- feeding ----------------------------------------------------------------------------------
    def feed(self, text: str) -> tuple[str, str]:
        out = {"reasoning": "", "answer": ""}
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._plain:
                out["answer"] += buffer
                break
            if self.state == "header":
                buffer = self._read_header(buffer, out)
            elif self.state == "body":
                buffer = self._read_body(buffer, out)
            else:
                buffer = self._read_between(buffer, out)
        return out["reasoning"], out["answer"]

    def flush(self) -> tuple[str, str]:
        """The end of the reply: held text placed; an open call is complete (its <|call|> is the
        stop token, which the reply's text does not hold)."""
        out = {"reasoning": "", "answer": ""}
        held, self._held = self._held, ""
        if self.state == "body" and self._header is not None:
            self._emit(held, out)
            self._close_message()
        elif self.state == "header":
            written = held[self._header_given :]
            if self._first and "<|" not in written:  # a reply with no harmony structure at all
                out["answer"] += written
        elif held.strip():
            out["answer"] += held
        return out["reasoning"], out["answer"]

    # --- states: each places what it can of `buffer` and returns the rest for the next one --------
    def _read_header(self, buffer: str, out: dict[str, str]) -> str:
        written = buffer[self._header_given :]
        if self._first and self._header_given and written and not _plausible_header_start(written):
            self._plain = True  # the model answered without harmony's structure
            out["answer"] += written
            return ""  # all placed or held
        end = buffer.find(MESSAGE)
        ends = [(i, tag) for tag in (END, RETURN, CALL) if (i := buffer.find(tag)) >= 0]
        if ends and (end < 0 or min(ends)[0] < end):  # a header with no body: skip the message
            index, tag = min(ends)
            self._header_given, self._first, self.state = 0, False, "between"
            return buffer[index + len(tag) :]
        if end < 0:
            self._held = buffer
            return ""  # all placed or held
        self._open(buffer[:end])
        return buffer[end + len(MESSAGE) :]

    def _open(self, header: str) -> None:
        """Start reading the body of the message with this header."""
        self._header = _parse_header(header)
        self._header_given, self._first = 0, False
        self.state = "body"
        self._separate = self._wrote.get(self._destination(), False)
        function = self._header.function
        if function is not None and not self.calls_to_answer:
            self.calls.append(HarmonyCall(function))

    def _read_body(self, buffer: str, out: dict[str, str]) -> str:
        found = [(i, tag) for tag in _BODY_ENDS if (i := buffer.find(tag)) >= 0]
        if not found:
            keep = _longest_partial(buffer, _BODY_ENDS)
            self._emit(buffer[: len(buffer) - keep], out)
            self._held = buffer[len(buffer) - keep :]
            return ""  # all placed or held
        index, tag = min(found)
        self._emit(buffer[:index], out)
        self._close_message()
        self.state = "header" if tag == START else "between"
        return buffer[index + len(tag) :]

    def _read_between(self, buffer: str, out: dict[str, str]) -> str:
        start = buffer.find(START)
        if start < 0:
            keep = partial_suffix(buffer, START)
            stray, self._held = buffer[: len(buffer) - keep], buffer[len(buffer) - keep :]
            if stray.strip():
                out["answer"] += stray
            return ""  # all placed or held
        if buffer[:start].strip():
            out["answer"] += buffer[:start]
        self.state = "header"
        return buffer[start + len(START) :]

    # --- placing a body's text --------------------------------------------------------------------
    def _destination(self) -> str:
        header = self._header
        assert header is not None
        if header.function is not None:
            return "answer" if self.calls_to_answer else "call"
        return "reasoning" if header.is_reasoning else "answer"

    def _emit(self, text: str, out: dict[str, str]) -> None:
        if not text:
            return
        destination = self._destination()
        if destination == "call":
            self.calls[-1].arguments += text
            return
        if self._separate:
            text, self._separate = "\n" + text, False
        out[destination] += text
        self._wrote[destination] = True

    def _close_message(self) -> None:
        if self._header is not None and self._destination() == "call":
            self.calls[-1].done = True
        self._header, self._separate = None, False


def harmony_stop_ids(
    stop_token_ids: list[int] | None,
    token_id: Callable[[str], int | None],
    eos_token_ids: tuple[int, ...] | set[int],
) -> list[int]:
    """A harmony request's stop tokens: its own, and <|return|> and <|call|> where the model's
    generation config does not already list them as EOS tokens."""
    ids = list(stop_token_ids or [])
    for tag in STOP_TOKENS:
        special = token_id(tag)
        if special is not None and special not in eos_token_ids and special not in ids:
            ids.append(special)
    return ids


# --- grammars -----------------------------------------------------------------------------------
def lark_token(text: str, token_id: Callable[[str], int | None]) -> str:
    """A Lark (llguidance) term for a harmony tag: its special token where the tokenizer has one,
    else its text."""
    special = token_id(text)
    return f"<[{special}]>" if special is not None else json.dumps(text)


def analysis_rules(token_id: Callable[[str], int | None]) -> list[str]:
    """Lark rules of a reply's optional first message of thinking: `analysis` is the whole message
    and the `<|start|>assistant` of the next one (its text free, without <|end|>)."""
    t = lambda tag: lark_token(tag, token_id)  # noqa: E731
    return [
        f'analysis: {t(CHANNEL)} "analysis" {t(MESSAGE)} THOUGHT {t(END)} {t(START)} "assistant"',
        r"THOUGHT: /(?s:.*)/ & ~/(?s:.*)<\|end\|>(?s:.*)/",
    ]


def final_lark(answer: str, token_id: Callable[[str], int | None]) -> str:
    """The Lark grammar of a harmony reply whose final message is the grammar named `answer`
    (structured outputs), after an optional message of free thinking."""
    t = lambda tag: lark_token(tag, token_id)  # noqa: E731
    end = f" {t(RETURN)}" if token_id(RETURN) is not None else ""
    start = f'start: analysis? {t(CHANNEL)} "final" {t(MESSAGE)} @{answer}{end}'
    return "\n".join([start, *analysis_rules(token_id)]) + "\n"
