"""Logprobs in OpenAI's two shapes: chat's `content[{token, logprob, bytes, top_logprobs}]` and the
legacy completions `{tokens, token_logprobs, top_logprobs, text_offset}`.

Token strings are each id decoded alone by the tokenizer, cached: only requests asking for logprobs
pay.
"""

from __future__ import annotations

import math

from localchat.engine.core.sequence import TokenLogprob

_FLOOR = -9999.0  # JSON has no -inf; vLLM reports the same floor


def _finite(value: float) -> float:
    return value if math.isfinite(value) else _FLOOR


class TokenStrings:
    """The text of single token ids, cached across requests."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = (
                self._tokenizer.decode([token_id])
                if self._tokenizer is not None
                else f"token_id:{token_id}"
            )
            self._cache[token_id] = text
        return text


def chat_logprobs(entries: list[TokenLogprob], token_str: TokenStrings) -> list[dict]:
    """The `content` list of a chat choice's logprobs."""
    content = []
    for entry in entries:
        text = token_str(entry.token_id)
        content.append(
            {
                "token": text,
                "logprob": _finite(entry.logprob),
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {
                        "token": (alt := token_str(token_id)),
                        "logprob": _finite(logprob),
                        "bytes": list(alt.encode()),
                    }
                    for token_id, logprob in entry.top
                ],
            }
        )
    return content


class CompletionLogprobs:
    """Builds the legacy completions logprobs object; text offsets run on across a stream's
    chunks."""

    def __init__(self, token_str: TokenStrings, start_offset: int = 0):
        self._token_str = token_str
        self._offset = start_offset

    def build(
        self, entries: list[TokenLogprob], prompt: tuple[list[int], list] | None = None
    ) -> dict:
        """The object for `entries`, after the echoed prompt's (token ids, logprobs) when given: its
        entries may be None (the first token's), which gives null logprob and top_logprobs."""
        tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
        pairs = [(e.token_id, e) for e in entries]
        if prompt is not None:
            pairs = list(zip(*prompt, strict=True)) + pairs
        for token_id, entry in pairs:
            text = self._token_str(token_id)
            tokens.append(text)
            text_offset.append(self._offset)
            self._offset += len(text)
            if entry is None:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(_finite(entry.logprob))
            top = {text: _finite(entry.logprob)}
            for alt_id, logprob in entry.top:
                top.setdefault(self._token_str(alt_id), _finite(logprob))
            top_logprobs.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": text_offset,
        }
