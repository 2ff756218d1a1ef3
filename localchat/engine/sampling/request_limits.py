"""How much one request may ask of the engine: the sizes of the lists a request carries into every
step it runs in (its stop strings, banned words, stop token ids, logit biases). Each is checked when
the request's SamplingParams are made, so a request past one is refused (an HTTP 400 naming the
field) before it reaches the engine thread that every client shares."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestLimits:
    """The most a request may carry, per field (the defaults serve any real client: OpenAI takes 4
    stop strings, lm-evaluation-harness a few)."""

    stop_strings: int = 64
    stop_string_chars: int = 1024  # each
    bad_words: int = 1024
    bad_word_chars: int = 256  # each
    stop_token_ids: int = 1024
    logit_bias: int = 1024  # entries
    allowed_token_ids: int = 1 << 20
    embedding_inputs: int = 2048  # OpenAI's bound on one embeddings request's inputs


LIMITS = RequestLimits()
