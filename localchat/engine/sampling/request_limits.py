"""How much one request may ask of the server and the engine: the sizes of the lists a request
carries into every step it runs in (stop strings, banned words, stop token ids, logit biases), the
tools a chat template renders, the grammars it asks the engine to compile (their size, depth and
compile time), the prompts and embeddings inputs of one call, and how deep its JSON body nests.
Each excess is refused with an HTTP 400 naming the field, before the work reaches the engine thread
that every client shares.

Every bound has a default (RequestLimits) and is configurable: `localchat serve --limit NAME=VALUE`
or the LOCALCHAT_LIMITS setting (`NAME=VALUE,NAME=VALUE`; serve's flags are written to it, so its
data-parallel replicas and the LLM API read the same). `limits()` gives the bounds in effect."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass

from localchat import envs
from localchat.errors import InvalidParameterError


@dataclass(frozen=True)
class RequestLimits:
    """The most one request may carry, per field (the defaults serve any real client: OpenAI takes
    4 stop strings and 128 tools, lm-evaluation-harness a few stop strings)."""

    stop_strings: int = 64
    stop_string_chars: int = 1024  # each
    bad_words: int = 1024
    bad_word_chars: int = 256  # each
    stop_token_ids: int = 1024
    logit_bias: int = 1024  # entries
    allowed_token_ids: int = 1 << 20
    prompts: int = 1024  # one completions request's prompts (each n samples)
    embedding_inputs: int = 2048  # OpenAI's bound on one embeddings request's inputs
    embedding_tokens: int = 300_000  # all of them together (OpenAI's bound too)
    # a chat request's tools, which its chat template renders into the prompt (OpenAI takes 128)
    tools: int = 128
    tools_bytes: int = 256 << 10  # all its tools' JSON (names, descriptions, schemas) together
    # a grammar the engine compiles (response_format, structured_outputs, guided_*, a forced tool
    # call): its JSON schema's nesting, its size as the llguidance grammar made of it, and the
    # seconds its compile may take (llguidance's own fuel limits bound the work besides)
    schema_depth: int = 64
    grammar_bytes: int = 256 << 10
    grammar_seconds: float = 10.0
    # how deep a request body's JSON nests (objects and arrays together; a body with tools nests
    # their schemas' depth plus about 6)
    json_depth: int = 128


DEFAULTS = RequestLimits()
NAMES = tuple(field.name for field in dataclasses.fields(RequestLimits))
# the decoder's own recursion ends a body nested about this deep, whatever json_depth says
MOST_JSON_DEPTH = 512


def _value(name: str, raw: str) -> int | float:
    if isinstance(getattr(DEFAULTS, name), float):  # seconds
        try:
            seconds = float(raw)
        except ValueError:
            seconds = 0.0
        if not seconds > 0:
            raise ValueError(f"{name}={raw!r}: expected seconds > 0")
        return seconds
    if not raw.isdigit():
        raise ValueError(f"{name}={raw!r}: expected a count >= 0")
    count = int(raw)
    if name == "json_depth" and count > MOST_JSON_DEPTH:
        raise ValueError(f"{name}={raw!r}: at most {MOST_JSON_DEPTH}")
    return count


def parse_limits(items: Iterable[str], base: RequestLimits = DEFAULTS) -> RequestLimits:
    """`base` with each `NAME=VALUE` of `items` applied; ValueError naming the item that does not
    parse or names no limit."""
    changes: dict[str, int | float] = {}
    for item in items:
        name, sep, raw = item.strip().partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in NAMES:
            raise ValueError(
                f"{item.strip()!r}: expected NAME=VALUE with NAME one of {', '.join(NAMES)}"
            )
        changes[name] = _value(name, raw.strip())
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=8)
def _parsed(raw: str) -> RequestLimits:
    try:
        return parse_limits(item for item in raw.split(",") if item.strip())
    except ValueError as exc:
        raise ValueError(f"{envs.LIMITS.name}: {exc}") from None


def limits() -> RequestLimits:
    """The bounds in effect: LOCALCHAT_LIMITS over the defaults. ValueError naming the variable
    when it does not parse (serve checks it at start-up)."""
    raw = envs.LIMITS.get()
    return _parsed(raw) if raw else DEFAULTS


def as_setting(value: RequestLimits) -> str:
    """LOCALCHAT_LIMITS's text for `value`: the bounds it changes from the defaults."""
    return ",".join(
        f"{name}={getattr(value, name)}"
        for name in NAMES
        if getattr(value, name) != getattr(DEFAULTS, name)
    )


def check_most(param: str, count: int, limit: str, what: str = "entries") -> None:
    """An InvalidParameterError naming `param` when `count` passes the bound named `limit`."""
    most = getattr(limits(), limit)
    if count > most:
        raise InvalidParameterError(
            f"{param} holds at most {most} {what}, got {count} (the server's --limit {limit})",
            param=param,
        )
