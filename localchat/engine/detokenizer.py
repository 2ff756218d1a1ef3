"""Incremental detokenization with stop strings.

Text grows token by token through the tokenizer's DecodeStream (no replacement characters from a
multi-byte character split across tokens). A stop string may span tokens; the tail of the text that
could still become one is held back, so nothing after a stop string is ever streamed, and the deltas
handed out always concatenate to the final text.
"""

from __future__ import annotations

from localchat.engine.sampling_params import SamplingParams

_PROMPT_CONTEXT_TOKENS = (
    6  # enough prompt tokens for the decoder to place the first output token's spacing
)


class IncrementalDetokenizer:
    """Decodes one sequence's output tokens and watches for its stop strings."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        from tokenizers.decoders import DecodeStream

        self._backend = tokenizer._tokenizer  # the Rust tokenizer behind a fast HF tokenizer
        context = prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:]
        self._stream = DecodeStream(context, skip_special_tokens=params.skip_special_tokens)
        self._stops = params.stop or []
        self._include_stop = params.include_stop_str_in_output
        self._max_stop_len = max((len(s) for s in self._stops), default=0)
        self.text = ""
        self._emitted = 0

    def add_token(self, token_id: int) -> str | None:
        """Append one token's text; return the stop string it completed, if any (the text is then
        cut)."""
        chunk = self._stream.step(self._backend, token_id)
        if not chunk:
            return None
        start = len(self.text)
        self.text += chunk
        return self._find_stop(start) if self._stops else None

    def _find_stop(self, new_start: int) -> str | None:
        best = None
        for stop in self._stops:
            index = self.text.find(stop, max(0, new_start - len(stop) + 1))
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return None
        index, stop = best
        self.text = self.text[: index + len(stop) if self._include_stop else index]
        return stop

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is the start of some stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def take_delta(self, finished: bool) -> str:
        """The text not handed out yet that can no longer turn into a stop string."""
        end = len(self.text) if finished or not self._stops else len(self.text) - self._held_back()
        if end <= self._emitted:
            return ""
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta
