"""Incremental detokenization with stop strings.

Text grows token by token through the tokenizer's DecodeStream (no replacement characters from a
multi-byte character split across tokens). A stop string may span tokens; the tail of the text that
could still become one is held back, so nothing after a stop string is ever streamed, and the deltas
handed out always concatenate to the final text. The stop strings are watched by an automaton
(engine/sampling/stop_strings.py): each token costs time in its own text, not in the stop strings'
sizes.

Byte-fallback tokenizers (SentencePiece's: Llama 2, Mistral, Gemma, Phi-3) can make the stream
fail: a run of byte tokens that is not UTF-8 decodes as replacement characters once the run goes on,
so text already streamed stops being a prefix of the decode ("Invalid prefix encountered while
decoding stream"). A sampled sequence can hold such a run; the stream then starts again at the
token, the run's undecodable bytes dropped (as vLLM does), rather than failing the request.
"""

from __future__ import annotations

from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.engine.sampling.stop_strings import StopMatcher

_PROMPT_CONTEXT_TOKENS = (
    6  # enough prompt tokens for the decoder to place the first output token's spacing
)


class IncrementalDetokenizer:
    """Decodes one sequence's output tokens and watches for its stop strings."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        from tokenizers.decoders import DecodeStream

        self._backend = tokenizer._tokenizer  # the Rust tokenizer behind a fast HF tokenizer
        context = prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:]
        self._skip_special = params.skip_special_tokens
        self._stream = DecodeStream(context, skip_special_tokens=self._skip_special)
        self._stops = params.stop or []
        self._matcher = StopMatcher(self._stops) if self._stops else None
        self._include_stop = params.include_stop_str_in_output
        self.text = ""
        self._emitted = 0

    def add_token(self, token_id: int) -> str | None:
        """Append one token's text; return the stop string it completed, if any (the text is then
        cut)."""
        chunk = self._step(token_id)
        if not chunk:
            return None
        self.text += chunk
        if self._matcher is None:
            return None
        match = self._matcher.feed(chunk)
        if match is None:
            return None
        stop = self._stops[match.index]
        self.text = self.text[: match.start + len(stop) if self._include_stop else match.start]
        return stop

    def _step(self, token_id: int) -> str | None:
        """The stream's next chunk; a stream whose prefix broke (module docstring) starts again."""
        try:
            return self._stream.step(self._backend, token_id)
        except Exception as error:  # tokenizers raises a bare Exception
            if "Invalid prefix" not in str(error):
                raise
        from tokenizers.decoders import DecodeStream

        self._stream = DecodeStream(skip_special_tokens=self._skip_special)
        return self._stream.step(self._backend, token_id)

    def take_delta(self, finished: bool) -> str:
        """The text not handed out yet that can no longer turn into a stop string."""
        held = 0 if finished or self._matcher is None else self._matcher.held
        end = len(self.text) - held
        if end <= self._emitted:
            return ""
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta
