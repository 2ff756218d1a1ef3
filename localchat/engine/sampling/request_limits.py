"""How much one request may ask of the engine: the sizes of the lists a request carries into every
step it runs in (its stop strings, banned words, stop token ids, logit biases). Each is checked when
the request's SamplingParams are made, so a request past one is refused (an HTTP 400 naming the
field) before it reaches the engine thread that every client shares. A chat request's tools, which
its template renders, are bounded too (the server checks them before rendering: tool_bounds)."""

from __future__ import annotations

from dataclasses import dataclass

from localchat import envs


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
    # a chat request's tools, which its chat template renders into the prompt (OpenAI takes 128)
    tools: int = 128
    tools_bytes: int = 256 << 10  # all its tools' JSON (names, descriptions, schemas) together


LIMITS = RequestLimits()


def tool_bounds() -> tuple[int, int]:
    """The most tools a request may carry and the most bytes their JSON may take: the
    LOCALCHAT_MAX_TOOLS and LOCALCHAT_MAX_TOOLS_BYTES settings, else LIMITS'. ValueError naming
    the variable when one is not a count >= 0."""
    bounds = []
    for setting, default in (
        (envs.MAX_TOOLS, LIMITS.tools),
        (envs.MAX_TOOLS_BYTES, LIMITS.tools_bytes),
    ):
        value = setting.get()
        if value is not None and value < 0:
            raise ValueError(f"{setting.name}={value}: expected a {setting.kind} >= 0")
        bounds.append(default if value is None else value)
    return bounds[0], bounds[1]
